#include "obs/state.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"

namespace baton::obs {

StateWriter::Section& StateWriter::Section::Field(absl::string_view key, absl::string_view value) {
  proto::Field* f = s_->add_fields();
  f->set_key(std::string(key));
  f->set_value(std::string(value));
  return *this;
}

StateWriter::Section& StateWriter::Section::Field(absl::string_view key, int64_t value) {
  return Field(key, absl::StrCat(value));
}

StateWriter::Section& StateWriter::Section::Line(absl::string_view text) {
  s_->add_lines(std::string(text));
  return *this;
}

StateWriter::Section StateWriter::AddSection(absl::string_view name) {
  proto::StateSection* s = out_->add_sections();
  s->set_name(std::string(name));
  return Section(s);
}

void StateWriter::AddWait(int to, absl::string_view kind, absl::string_view what,
                          absl::Time since) {
  proto::WaitEdge* e = out_->add_waits();
  e->set_from(out_->rank());
  e->set_to(to);
  e->set_kind(std::string(kind));
  e->set_what(std::string(what));
  e->set_age_s(std::max(0.0, absl::ToDoubleSeconds(now_ - since)));
}

void StateWriter::AddProgress(absl::string_view name, int64_t value) {
  (*out_->mutable_progress())[std::string(name)] = value;
}

int64_t TotalProgress(const proto::WorkerState& w) {
  int64_t sum = 0;
  for (const auto& [name, v] : w.progress()) sum += v;
  return sum;
}

namespace {

using Graph = std::map<int, std::set<int>>;

// H2: elementary cycles, each from its smallest rank, in order.
void FindCycles(const Graph& g, std::vector<std::vector<int>>* out) {
  for (const auto& [start, unused] : g) {
    std::vector<int> path = {start};
    std::set<int> on_path = {start};
    // Iterative DFS over (node, next neighbour) frames.
    std::vector<std::pair<int, std::set<int>::const_iterator>> stack;
    stack.emplace_back(start, g.at(start).begin());
    while (!stack.empty() && static_cast<int>(out->size()) < kMaxCycles) {
      auto& [node, it] = stack.back();
      const auto& next = g.at(node);
      if (it == next.end()) {
        on_path.erase(node);
        path.pop_back();
        stack.pop_back();
        continue;
      }
      const int v = *it++;
      if (v == start) {
        std::vector<int> cycle = path;
        cycle.push_back(start);
        out->push_back(std::move(cycle));
      } else if (v > start && !on_path.count(v) && g.count(v)) {
        path.push_back(v);
        on_path.insert(v);
        stack.emplace_back(v, g.at(v).begin());
      }
    }
  }
}

std::string Seconds(double s) { return absl::StrFormat("%.1f s", s); }

}  // namespace

proto::StateReport BuildReport(const std::string& run_id, const std::string& reason,
                               std::vector<proto::WorkerState> workers,
                               const std::map<int, std::string>& unanswered, absl::Time now) {
  proto::StateReport r;
  r.set_run_id(run_id);
  r.set_reason(reason);
  r.set_time_unix_us(absl::ToUnixMicros(now));
  std::sort(workers.begin(), workers.end(),
            [](const auto& a, const auto& b) { return a.rank() < b.rank(); });
  std::map<int, std::string> names;
  for (const auto& w : workers) names[w.rank()] = w.name();
  auto name = [&](int rank) {
    auto it = names.find(rank);
    return it != names.end() ? absl::StrCat(it->second, " (rank ", rank, ")")
                             : absl::StrCat("rank ", rank);
  };
  for (const auto& [rank, why] : unanswered) {
    proto::Field* f = r.add_unanswered();
    f->set_key(absl::StrCat(rank));
    f->set_value(why);
  }
  // H1: the edges.
  Graph g;
  for (const auto& w : workers) {
    // Ages as of the report, not of each snapshot, so that waits seen by
    // different workers compare (on one node, one clock).
    const double lag =
        w.time_unix_us() > 0
            ? std::max(0.0, absl::ToDoubleSeconds(now - absl::FromUnixMicros(w.time_unix_us())))
            : 0.0;
    for (const auto& c : w.outgoing()) {
      proto::WaitEdge* e = r.add_edges();
      e->set_from(w.rank());
      e->set_to(c.peer());
      e->set_kind("rpc");
      e->set_what(absl::StrCat(
          "call of '", c.function(), "'",
          c.has_deadline() ? absl::StrCat(", ", Seconds(c.time_left_s()), " before its deadline")
                           : ""));
      e->set_age_s(c.age_s() + lag);
    }
    for (const auto& wait : w.waits()) {
      proto::WaitEdge* e = r.add_edges();
      *e = wait;
      e->set_age_s(wait.age_s() + lag);
    }
    (*r.mutable_workers()->Add()) = w;
  }
  for (const auto& e : r.edges()) {
    if (e.from() == e.to()) continue;  // a call to itself waits for no one else
    g[e.from()].insert(e.to());
  }
  for (auto& [from, tos] : Graph(g)) {
    for (int to : tos) g[to];  // every rank reached is a node
  }
  std::stable_sort(r.mutable_edges()->begin(), r.mutable_edges()->end(),
                   [](const auto& a, const auto& b) { return a.age_s() > b.age_s(); });
  if (!r.edges().empty()) *r.mutable_oldest() = r.edges(0);
  // List each cycle once, from its smallest rank ("0 -> 1 -> 0"), at most
  // kMaxCycles of them (H2).
  std::vector<std::vector<int>> cycles;
  FindCycles(g, &cycles);
  for (const auto& c : cycles) r.add_cycles(absl::StrJoin(c, " -> "));
  // H3 (and H4: an unanswered rank has no edges of its own, so it ends chains).
  for (const auto& [from, tos] : g) {
    if (tos.empty()) continue;
    std::set<int> seen = {from};
    std::vector<int> todo(tos.begin(), tos.end());
    std::set<int> ends;
    while (!todo.empty()) {
      const int v = todo.back();
      todo.pop_back();
      if (!seen.insert(v).second) continue;
      const auto& next = g.at(v);
      if (next.empty()) ends.insert(v);
      todo.insert(todo.end(), next.begin(), next.end());
    }
    proto::Field* f = r.add_chain_ends();
    f->set_key(absl::StrCat(from));
    f->set_value(ends.empty() ? "cycle" : absl::StrJoin(ends, ","));
  }
  // The summary in words.
  std::string s = absl::StrCat("baton state report: run ", run_id, ", ", reason, "; ",
                               workers.size(), " worker(s) answered");
  if (!unanswered.empty()) {
    std::vector<std::string> u;
    for (const auto& [rank, why] : unanswered) u.push_back(absl::StrCat(rank, " (", why, ")"));
    absl::StrAppend(&s, ", no answer from rank ", absl::StrJoin(u, ", rank "));
  }
  absl::StrAppend(&s, "\n");
  if (r.edges().empty()) {
    absl::StrAppend(&s, "no worker waits for another\n");
  } else {
    absl::StrAppend(&s, "waits, oldest first:\n");
    for (const auto& e : r.edges()) {
      absl::StrAppend(&s, "  ", name(e.from()), " -> ", name(e.to()), ": ", e.kind(), " ", e.what(),
                      ", for ", Seconds(e.age_s()), "\n");
    }
    for (const auto& c : cycles) {
      std::vector<std::string> n;
      for (int v : c) n.push_back(name(v));
      absl::StrAppend(&s, "cycle: ", absl::StrJoin(n, " -> "), "\n");
    }
    for (const auto& f : r.chain_ends()) {
      int from = 0;
      (void)absl::SimpleAtoi(f.key(), &from);
      if (f.value() == "cycle") {
        absl::StrAppend(&s, name(from), " waits in a cycle\n");
        continue;
      }
      std::vector<std::string> n;
      for (absl::string_view v : absl::StrSplit(f.value(), ',')) {
        int rank = 0;
        (void)absl::SimpleAtoi(v, &rank);
        n.push_back(absl::StrCat(name(rank), unanswered.count(rank) ? " (no answer)" : ""));
      }
      absl::StrAppend(&s, name(from), " waits, in the end, for ", absl::StrJoin(n, ", "), "\n");
    }
  }
  r.set_summary(s);
  return r;
}

std::string ReportText(const proto::StateReport& report) {
  std::string s = report.summary();
  for (const auto& w : report.workers()) {
    absl::StrAppend(&s, "\n", w.name(), " (rank ", w.rank(), ", pid ", w.pid(), "): executor ",
                    w.executor().busy(), "/", w.executor().threads(), " busy (",
                    w.executor().blocked(), " in a baton wait)\n");
    for (const auto& c : w.outgoing()) {
      absl::StrAppend(&s, "  out: ", c.function(), " to ", c.peer_name(), ", ", Seconds(c.age_s()),
                      c.has_deadline() ? absl::StrCat(", ", Seconds(c.time_left_s()), " left") : "",
                      "\n");
    }
    for (const auto& c : w.incoming()) {
      absl::StrAppend(&s, "  in: ", c.function(), " from ", c.caller_name(), ", ", c.state(), ", ",
                      Seconds(c.age_s()), "\n");
    }
    for (const auto& sec : w.sections()) {
      std::vector<std::string> fields;
      for (const auto& f : sec.fields()) fields.push_back(absl::StrCat(f.key(), "=", f.value()));
      absl::StrAppend(&s, "  ", sec.name(), ": ", absl::StrJoin(fields, " "), "\n");
      for (const auto& line : sec.lines()) absl::StrAppend(&s, "    ", line, "\n");
    }
  }
  return s;
}

std::string ToJson(const google::protobuf::Message& m, bool compact) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = !compact;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

absl::Status FromJson(absl::string_view json, google::protobuf::Message* m) {
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = true;
  auto s = google::protobuf::util::JsonStringToMessage(std::string(json), m, o);
  if (!s.ok()) {
    return absl::DataLossError(absl::StrCat("not a state document: ", s.message().as_string()));
  }
  return absl::OkStatus();
}

}  // namespace baton::obs
