#include "obs/trace.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_io.h"
#include "base/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "obs/state.h"

namespace baton::obs {
namespace {

constexpr size_t kFlushEvery = 4096;

// A small id per recording thread, stable for the thread's life.
int ThreadId() {
  static std::atomic<int> next{1};
  thread_local const int id = next.fetch_add(1);
  return id;
}

double Micros(absl::Time t) { return absl::ToDoubleMicroseconds(t - absl::UnixEpoch()); }

}  // namespace

absl::StatusOr<std::unique_ptr<TraceRecorder>> TraceRecorder::Open(const std::string& dir) {
  RETURN_IF_ERROR(MakeDirs(dir));
  static std::atomic<int> recorders{0};
  const std::string path =
      absl::StrCat(dir, "/trace_pid", ::getpid(), "_", recorders.fetch_add(1), ".jsonl");
  // Truncate: a file of this name is an earlier run's.
  if (std::FILE* f = std::fopen(path.c_str(), "w")) {
    std::fclose(f);
  } else {
    return absl::PermissionDeniedError(absl::StrCat("cannot write the trace file ", path));
  }
  proto::TraceHeader h;
  h.set_rank(-1);
  h.set_os_pid(static_cast<int32_t>(::getpid()));
  h.set_clock_method("not measured");
  return std::unique_ptr<TraceRecorder>(new TraceRecorder(path, std::move(h)));
}

void TraceRecorder::SetIdentity(int rank, const std::string& worker) {
  absl::MutexLock lock(&mu_);
  if (header_written_) return;
  header_.set_rank(rank);
  header_.set_worker(worker);
}

TraceRecorder::~TraceRecorder() { Flush(); }

void TraceRecorder::SetClock(double offset_us, double error_us, const std::string& method) {
  absl::MutexLock lock(&mu_);
  if (header_written_) return;
  header_.set_clock_offset_us(offset_us);
  header_.set_clock_error_us(error_us);
  header_.set_clock_method(method);
}

void TraceRecorder::Slice(const std::string& name, const std::string& cat, absl::Time start,
                          absl::Time end, std::map<std::string, std::string> args,
                          const Flow& flow_out, const Flow& flow_in) {
  const int tid = ThreadId();
  proto::TraceEvent e;
  e.set_name(name);
  e.set_cat(cat);
  e.set_ph("X");
  e.set_ts(Micros(start));
  e.set_dur(std::max(0.0, absl::ToDoubleMicroseconds(end - start)));
  e.set_tid(tid);
  for (auto& [k, v] : args) (*e.mutable_args())[k] = std::move(v);
  absl::MutexLock lock(&mu_);
  pending_.push_back(std::move(e));
  for (const auto& [flow, ph] : {std::pair{&flow_out, "s"}, std::pair{&flow_in, "f"}}) {
    if (flow->id.empty()) continue;
    proto::TraceEvent f;
    f.set_name("rpc");
    f.set_cat("flow");
    f.set_ph(ph);
    f.set_ts(Micros(std::clamp(flow->at, start, end)));
    f.set_tid(tid);
    f.set_id(flow->id);
    if (ph[0] == 'f') f.set_bp("e");
    pending_.push_back(std::move(f));
  }
  if (pending_.size() >= kFlushEvery) FlushLocked();
}

void TraceRecorder::Flush() {
  absl::MutexLock lock(&mu_);
  FlushLocked();
}

void TraceRecorder::FlushLocked() {
  if (pending_.empty() && header_written_) return;
  std::string out;
  if (!header_written_) {
    proto::TraceLine line;
    *line.mutable_header() = header_;
    absl::StrAppend(&out, ToJson(line, /*compact=*/true), "\n");
    header_written_ = true;
  }
  for (auto& e : pending_) {
    proto::TraceLine line;
    *line.mutable_event() = std::move(e);
    absl::StrAppend(&out, ToJson(line, /*compact=*/true), "\n");
  }
  pending_.clear();
  std::ofstream(path_, std::ios::app) << out;
}

absl::StatusOr<proto::TraceFile> MergeTraces(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (absl::StartsWith(e->d_name, "trace_") && absl::EndsWith(e->d_name, ".jsonl")) {
        files.push_back(absl::StrCat(dir, "/", e->d_name));
      }
    }
    ::closedir(d);
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no trace_*.jsonl in ", dir));
  }
  proto::TraceFile out;
  out.set_displaytimeunit("ns");
  std::vector<proto::TraceEvent> events;
  for (const std::string& path : files) {
    std::ifstream in(path);
    std::string text;
    proto::TraceHeader header;
    bool have_header = false;
    for (int n = 1; std::getline(in, text); ++n) {
      if (text.empty()) continue;
      proto::TraceLine line;
      if (absl::Status s = FromJson(text, &line); !s.ok()) {
        return absl::DataLossError(absl::StrCat(path, ":", n, ": ", s.message()));
      }
      if (line.has_header()) {
        header = line.header();
        have_header = true;
        *out.add_workers() = header;
        continue;
      }
      if (!have_header) {
        return absl::DataLossError(absl::StrCat(path, ":", n, ": an event before the header"));
      }
      proto::TraceEvent e = line.event();
      e.set_pid(header.rank());
      e.set_ts(e.ts() + header.clock_offset_us());  // TL3: onto rank 0's clock
      events.push_back(std::move(e));
    }
  }
  double t0 = 0;
  if (!events.empty()) {
    t0 = std::min_element(events.begin(), events.end(), [](const auto& a, const auto& b) {
           return a.ts() < b.ts();
         })->ts();
  }
  // TL2: keep the arrows whose two ends are here.
  std::map<std::string, int> ends;
  for (const auto& e : events) {
    if (e.ph() == "s") ends[e.id()] |= 1;
    if (e.ph() == "f") ends[e.id()] |= 2;
  }
  // TL4: names and order of the processes.
  std::sort(out.mutable_workers()->begin(), out.mutable_workers()->end(),
            [](const auto& a, const auto& b) { return a.rank() < b.rank(); });
  for (const auto& w : out.workers()) {
    proto::TraceEvent name;
    name.set_name("process_name");
    name.set_ph("M");
    name.set_pid(w.rank());
    (*name.mutable_args())["name"] = absl::StrCat(w.worker(), " (rank ", w.rank(), ")");
    *out.add_traceevents() = name;
    proto::TraceEvent order;
    order.set_name("process_sort_index");
    order.set_ph("M");
    order.set_pid(w.rank());
    (*order.mutable_args())["sort_index"] = absl::StrCat(w.rank());
    *out.add_traceevents() = order;
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& a, const auto& b) { return a.ts() < b.ts(); });
  for (auto& e : events) {
    if ((e.ph() == "s" || e.ph() == "f") && ends[e.id()] != 3) continue;
    e.set_ts(e.ts() - t0);
    *out.add_traceevents() = std::move(e);
  }
  return out;
}

std::string TraceJson(const proto::TraceFile& trace) {
  // Chrome wants every pid and ts, rank 0's and zeros included.
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(trace, &out, o);
  return out;
}

proto::TraceFile CropTrace(const proto::TraceFile& trace, double from_us, double to_us) {
  proto::TraceFile out;
  out.set_displaytimeunit(trace.displaytimeunit());
  *out.mutable_workers() = trace.workers();
  std::map<std::string, int> ends;
  auto inside = [&](const proto::TraceEvent& e) {
    return e.ts() < to_us && e.ts() + e.dur() >= from_us;
  };
  for (const auto& e : trace.traceevents()) {
    if ((e.ph() == "s" || e.ph() == "f") && inside(e)) ends[e.id()] |= e.ph() == "s" ? 1 : 2;
  }
  for (const auto& e : trace.traceevents()) {
    if (e.ph() == "M") {
      *out.add_traceevents() = e;
      continue;
    }
    if (!inside(e)) continue;
    if ((e.ph() == "s" || e.ph() == "f") && ends[e.id()] != 3) continue;
    proto::TraceEvent c = e;
    const double start = std::max(e.ts(), from_us);
    if (e.ph() == "X") c.set_dur(std::min(e.ts() + e.dur(), to_us) - start);
    c.set_ts(start - from_us);
    *out.add_traceevents() = std::move(c);
  }
  return out;
}

proto::TraceFile SelectTrace(const proto::TraceFile& trace,
                             const std::function<bool(const proto::TraceEvent&)>& keep) {
  proto::TraceFile out;
  out.set_displaytimeunit(trace.displaytimeunit());
  *out.mutable_otherdata() = trace.otherdata();
  std::vector<const proto::TraceEvent*> kept;
  std::set<int> pids;
  double t0 = std::numeric_limits<double>::infinity();
  for (const auto& e : trace.traceevents()) {
    if (e.ph() != "X" || !keep(e)) continue;
    kept.push_back(&e);
    pids.insert(e.pid());
    t0 = std::min(t0, e.ts());
  }
  for (const auto& w : trace.workers()) {
    if (pids.count(w.rank()) > 0) *out.add_workers() = w;
  }
  for (const auto& e : trace.traceevents()) {
    if (e.ph() == "M" && pids.count(e.pid()) > 0) *out.add_traceevents() = e;
  }
  for (const proto::TraceEvent* e : kept) {
    proto::TraceEvent c = *e;
    c.set_ts(e->ts() - t0);
    *out.add_traceevents() = std::move(c);
  }
  return out;
}

namespace {

struct Category {
  const char* cat;
  const char* fill;
  const char* meaning;
};
// What TraceSvg draws, in legend order; other categories get the last fill.
constexpr Category kCategories[] = {
    {"rpc", "#87a9d6", "a call on its caller"},
    {"serve", "#8fbc8f", "serving a call"},
    {"queue", "#f0c36d", "queued before it ran"},
    {"autograd", "#e57373", "a distributed backward pass, or a worker's part"},
    {"forward", "#4a7fd4", "a pipeline forward"},
    {"backward", "#3aa55d", "a pipeline backward"},
    {"send", "#c8c8c8", "a pipeline send"},
    {"recv", "#a0a0a0", "a pipeline receive that waited"},
    {"", "#d7bde2", "other"},
};

const Category& CategoryOf(const std::string& cat) {
  for (const Category& c : kCategories) {
    if (cat == c.cat) return c;
  }
  return kCategories[std::size(kCategories) - 1];
}

std::string Escape(absl::string_view t) {
  std::string out;
  for (char c : t) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string TraceSvg(const proto::TraceFile& trace, int width) {
  constexpr int kLane = 22, kLeft = 170, kTop = 30, kRight = 20;
  // Lanes: (worker, thread) in order.
  std::map<std::pair<int, int>, int> lanes;
  std::map<int, int> lanes_of;  // per pid
  double end = 0;
  for (const auto& e : trace.traceevents()) {
    if (e.ph() == "M") continue;
    if (lanes.emplace(std::make_pair(e.pid(), e.tid()), 0).second) ++lanes_of[e.pid()];
    end = std::max(end, e.ts() + e.dur());
  }
  int n = 0;
  for (auto& [key, lane] : lanes) lane = n++;
  const double span = std::max(end, 1.0);
  const double scale = (width - kLeft - kRight) / span;
  auto x = [&](double ts) { return kLeft + ts * scale; };
  auto y = [&](int pid, int tid) { return kTop + lanes[{pid, tid}] * kLane; };
  std::map<int, std::string> names;
  for (const auto& w : trace.workers()) {
    names[w.rank()] = absl::StrCat(w.worker(), " (rank ", w.rank(), ")");
  }
  for (const auto& e : trace.traceevents()) {
    if (e.ph() == "M" && e.name() == "process_name" && e.args().count("name") > 0) {
      names[e.pid()] = e.args().at("name");
    }
  }
  const int height = kTop + n * kLane + 30;
  std::string svg = absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width, "\" height=\"", height,
      "\" font-family=\"sans-serif\" font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n");
  // The time axis: ten ticks.
  for (int i = 0; i <= 10; ++i) {
    const double t = span * i / 10;
    absl::StrAppend(&svg, "<line x1=\"", x(t), "\" y1=\"", kTop - 8, "\" x2=\"", x(t), "\" y2=\"",
                    height - 25, "\" stroke=\"#ddd\"/><text x=\"", x(t), "\" y=\"", kTop - 12,
                    "\" text-anchor=\"middle\">", absl::StrFormat("%.2f ms", t / 1000),
                    "</text>\n");
  }
  for (const auto& [key, lane] : lanes) {
    const auto name = names.find(key.first);
    absl::StrAppend(&svg, "<text x=\"4\" y=\"", kTop + lane * kLane + 14, "\">",
                    Escape(name != names.end() ? name->second : absl::StrCat("rank ", key.first)),
                    lanes_of[key.first] > 1 ? absl::StrCat(" t", key.second) : "", "</text>\n");
  }
  std::set<const Category*> drawn;
  std::map<std::string, std::pair<const proto::TraceEvent*, const proto::TraceEvent*>> flows;
  for (const auto& e : trace.traceevents()) {
    if (e.ph() == "s") flows[e.id()].first = &e;
    if (e.ph() == "f") flows[e.id()].second = &e;
    if (e.ph() != "X" || e.cat() == "idle") continue;
    const Category& c = CategoryOf(e.cat());
    drawn.insert(&c);
    const double w = std::max(1.0, e.dur() * scale);
    absl::StrAppend(&svg, "<rect x=\"", x(e.ts()), "\" y=\"", y(e.pid(), e.tid()) + 2,
                    "\" width=\"", w, "\" height=\"", kLane - 6, "\" fill=\"", c.fill,
                    "\" stroke=\"#555\" stroke-width=\"0.5\"><title>", Escape(e.name()),
                    absl::StrFormat(" (%.1f us)", e.dur()), "</title></rect>\n");
    if (w > 6.0 * static_cast<double>(e.name().size())) {
      absl::StrAppend(&svg, "<text x=\"", x(e.ts()) + 2, "\" y=\"", y(e.pid(), e.tid()) + 14, "\">",
                      Escape(e.name()), "</text>\n");
    }
  }
  int arrows = 0;
  for (const auto& [id, ends] : flows) {
    if (ends.first == nullptr || ends.second == nullptr) continue;
    ++arrows;
    absl::StrAppend(&svg, "<line x1=\"", x(ends.first->ts()), "\" y1=\"",
                    y(ends.first->pid(), ends.first->tid()) + kLane / 2, "\" x2=\"",
                    x(ends.second->ts()), "\" y2=\"",
                    y(ends.second->pid(), ends.second->tid()) + kLane / 2,
                    "\" stroke=\"#c0392b\" stroke-width=\"1\"/>\n");
  }
  // The legend: the categories drawn, in kCategories' order.
  // (Swatches are circles, so that the boxes are the only rects but the
  // background.)
  int lx = 4;
  auto entry = [&](const std::string& swatch, const char* meaning) {
    absl::StrAppend(&svg, swatch, "<text x=\"", lx + 12, "\" y=\"", height - 8, "\">", meaning,
                    "</text>\n");
    lx += 24 + 6 * static_cast<int>(std::strlen(meaning));
  };
  for (const Category& c : kCategories) {
    if (drawn.count(&c) == 0) continue;
    entry(absl::StrCat("<circle cx=\"", lx + 5, "\" cy=\"", height - 12, "\" r=\"5\" fill=\"",
                       c.fill, "\" stroke=\"#555\" stroke-width=\"0.5\"/>"),
          c.meaning);
  }
  if (arrows > 0) {
    entry(absl::StrCat("<line x1=\"", lx, "\" y1=\"", height - 12, "\" x2=\"", lx + 10, "\" y2=\"",
                       height - 12, "\" stroke=\"rgb(192,57,43)\" stroke-width=\"1\"/>"),
          "a message in flight");
  }
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

}  // namespace baton::obs
