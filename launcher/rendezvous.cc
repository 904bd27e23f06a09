#include "launcher/rendezvous.h"

#include <algorithm>
#include <climits>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "base/status_macros.h"

namespace baton::launcher {
namespace {

constexpr char kJobKey[] = "rdzv/job";
// Written (first writer wins) by a node that cannot take part, e.g. started
// with other settings than the master; the host fails the round with it.
constexpr char kAbortKey[] = "rdzv/aborted";
constexpr char kCurrentKey[] = "rdzv/current";
// Bound on reading a member key whose slot is already taken (the member
// writes it right after taking the slot).
constexpr absl::Duration kMemberKeyTimeout = absl::Seconds(5);

absl::Duration Left(absl::Time deadline) {
  return std::max(absl::ZeroDuration(), deadline - absl::Now());
}

int ToInt(const Record& r, const std::string& key, int fallback) {
  auto it = r.find(key);
  int v = fallback;
  if (it == r.end() || !absl::SimpleAtoi(it->second, &v)) return fallback;
  return v;
}

std::vector<int> ToInts(absl::string_view csv) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

}  // namespace

std::string EncodeRecord(const Record& record) {
  std::string out;
  for (const auto& [k, v] : record) {
    absl::StrAppend(&out, k, "=", absl::CEscape(v), "\n");
  }
  return out;
}

absl::StatusOr<Record> DecodeRecord(absl::string_view text) {
  Record r;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    size_t eq = line.find('=');
    std::string value;
    if (eq == absl::string_view::npos || !absl::CUnescape(line.substr(eq + 1), &value)) {
      return absl::DataLossError(absl::StrCat("malformed rendezvous record line '", line, "'"));
    }
    r[std::string(line.substr(0, eq))] = std::move(value);
  }
  return r;
}

Rendezvous::Rendezvous(store::Store* store, RendezvousConfig config)
    : store_(store), config_(std::move(config)), host_(config_.node_rank == 0) {}

std::string Rendezvous::Key(int64_t round, absl::string_view name) {
  return absl::StrCat("rdzv/r/", round, "/", name);
}

absl::Status Rendezvous::Publish(const Record& job) {
  absl::Status s = store_->Set(kJobKey, EncodeRecord(job));
  if (s.ok()) s = store_->Set(kCurrentKey, "0");
  return Annotate(s, "publishing the job settings");
}

absl::StatusOr<Record> Rendezvous::FetchJob(const Record& expected) {
  auto text = store_->Get(kJobKey, config_.timeout);
  if (!text.ok()) {
    return Annotate(text.status(),
                    "waiting for the master node (node rank 0) to publish "
                    "the job settings");
  }
  ASSIGN_OR_RETURN(auto job, DecodeRecord(*text));
  for (const auto& [k, v] : expected) {
    auto it = job.find(k);
    if (it != job.end() && it->second != v) {
      absl::Status error = absl::InvalidArgumentError(
          absl::StrCat("this node's ", k, " '", v, "' differs from the master node's '", it->second,
                       "': every node must be started with the same ", k));
      // Let the master (and through it every node) fail now, with the cause,
      // instead of waiting for this node until the rendezvous times out.
      (void)store_->CompareSet(
          kAbortKey, "",
          absl::StrCat("node rank ", config_.node_rank, " cannot join: ", error.message()));
      return error;
    }
  }
  return job;
}

absl::StatusOr<int64_t> Rendezvous::CurrentRound() {
  auto text = store_->Get(kCurrentKey, config_.timeout);
  if (!text.ok()) return Annotate(text.status(), "reading the current round");
  int64_t r = 0;
  if (!absl::SimpleAtoi(*text, &r)) {
    return absl::DataLossError(absl::StrCat("bad current round '", *text, "'"));
  }
  return r;
}

absl::StatusOr<RoundInfo> Rendezvous::Join(int64_t round) {
  const absl::Time deadline = absl::Now() + config_.timeout + config_.last_call;
  for (int64_t r = round;; ++r) {
    auto n = store_->Add(Key(r, "count"), 1);
    if (!n.ok()) return Annotate(n.status(), absl::StrCat("joining round ", r));
    const int slot = static_cast<int>(*n - 1);
    absl::Status s = store_->Set(Key(r, absl::StrCat("member/", slot)),
                                 EncodeRecord({{"node_rank", absl::StrCat(config_.node_rank)},
                                               {"host", config_.host_name}}));
    if (!s.ok()) return Annotate(s, absl::StrCat("joining round ", r));
    bool excluded = false;
    absl::StatusOr<RoundInfo> info = absl::UnknownError("unread");
    while (true) {
      if (is_host()) {
        s = store_->Set(kCurrentKey, absl::StrCat(r));
        if (!s.ok()) return Annotate(s, absl::StrCat("opening round ", r));
        return CloseAsHost(r, slot);
      }
      if (!config_.dynamic_host) {
        info = ReadClosed(r, slot, deadline, &excluded);
        break;
      }
      // N4: wait in slices, claiming the host key if its holder is gone.
      const absl::Time slice = std::min(deadline, absl::Now() + config_.watch_period);
      info = ReadClosed(r, slot, slice, &excluded);
      if (info.ok() || excluded || !absl::IsDeadlineExceeded(info.status()) ||
          absl::Now() >= deadline) {
        break;
      }
      ASSIGN_OR_RETURN(auto claimed, config_.claim_host());
      if (claimed) SetHost(true);
    }
    if (!excluded) return info;
  }
}

absl::StatusOr<RoundInfo> Rendezvous::CloseAsHost(int64_t round, int my_slot) {
  const std::string closed_key = Key(round, "closed");
  auto fail = [&](absl::Status error) -> absl::Status {
    // Every waiting node learns the reason (N1).
    (void)store_->Set(closed_key, EncodeRecord({{"status", "error"},
                                                {"code", absl::StrCat(error.raw_code())},
                                                {"message", std::string(error.message())}}));
    return error;
  };
  struct Member {
    int slot;
    int node_rank;
    std::string host;
  };
  auto read_members = [&]() -> absl::StatusOr<std::vector<Member>> {
    ASSIGN_OR_RETURN(auto n, store_->Add(Key(round, "count"), 0));
    std::vector<Member> members;
    for (int slot = 0; slot < n; ++slot) {
      auto text = store_->Get(Key(round, absl::StrCat("member/", slot)), kMemberKeyTimeout);
      if (!text.ok()) continue;  // A node that died right after arriving.
      auto rec = DecodeRecord(*text);
      if (!rec.ok()) return rec.status();
      members.push_back({slot, ToInt(*rec, "node_rank", -1), (*rec)["host"]});
    }
    return members;
  };

  // Wait for MIN arrivals: slot MIN-1 exists once MIN nodes took a slot.
  // Wait in slices, to notice a node that aborted (kAbortKey).
  const int min = config_.min_nodes, max = config_.max_nodes;
  const absl::Time arrival_deadline = absl::Now() + config_.timeout;
  absl::Status s;
  while (true) {
    s = store_->Wait(
        {Key(round, absl::StrCat("member/", min - 1))},
        std::min(absl::Seconds(1), std::max(absl::ZeroDuration(), arrival_deadline - absl::Now())));
    if (s.ok() || s.code() != absl::StatusCode::kDeadlineExceeded) break;
    auto aborted = store_->Get(kAbortKey, absl::ZeroDuration());
    if (aborted.ok()) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("rendezvous round ", round, " aborted: ", *aborted)));
    }
    if (absl::Now() >= arrival_deadline) break;
  }
  if (!s.ok()) {
    if (s.code() != absl::StatusCode::kDeadlineExceeded) return fail(s);
    auto members = read_members();
    if (!members.ok()) return fail(members.status());
    std::set<int> present;
    for (const Member& m : *members) present.insert(m.node_rank);
    std::vector<int> missing;
    if (min == max) {
      for (int r = 0; r < max; ++r) {
        if (!present.count(r)) missing.push_back(r);
      }
    }
    std::vector<std::string> seen;
    for (int r : present) seen.push_back(r < 0 ? "(unranked)" : absl::StrCat(r));
    return fail(absl::DeadlineExceededError(absl::StrCat(
        "rendezvous round ", round, " timed out after ", DurationText(config_.timeout), ": ",
        members->size(), " of ", min, " required nodes arrived (node ranks ",
        absl::StrJoin(seen, ", "), ")",
        missing.empty() ? ""
                        : absl::StrCat("; missing node rank", missing.size() == 1 ? " " : "s ",
                                       absl::StrJoin(missing, ", ")))));
  }
  if (max > min) {
    // Last call: give more nodes a chance to arrive, up to MAX.
    (void)store_->Wait({Key(round, absl::StrCat("member/", max - 1))}, config_.last_call);
  }
  auto members = read_members();
  if (!members.ok()) return fail(members.status());
  if (config_.dynamic_host) {
    // N4: the host first, the others in arrival order; node ranks aside
    // (a host that died may still have its member record with rank 0).
    std::stable_sort(members->begin(), members->end(), [my_slot](const Member& a, const Member& b) {
      return (a.slot == my_slot) > (b.slot == my_slot);
    });
  } else {
    std::stable_sort(members->begin(), members->end(), [](const Member& a, const Member& b) {
      auto key = [](const Member& m) { return m.node_rank < 0 ? INT_MAX : m.node_rank; };
      return key(a) < key(b);
    });
  }
  std::set<int> ranks;
  for (const Member& m : *members) {
    if (config_.dynamic_host) break;
    if (m.node_rank >= 0 && !ranks.insert(m.node_rank).second) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("two nodes joined round ", round, " with node rank ", m.node_rank,
                       " (one on host ", m.host, "): every node needs its own --node_rank")));
    }
    if (min == max && (m.node_rank < 0 || m.node_rank >= max)) {
      return fail(absl::InvalidArgumentError(absl::StrCat("node on host ", m.host,
                                                          " joined with node rank ", m.node_rank,
                                                          ", which is not below --nnodes ", max)));
    }
  }
  if (static_cast<int>(members->size()) > max) members->resize(max);
  auto port = config_.pick_master_port();
  if (!port.ok()) return fail(port.status());
  auto restarts = store_->Add("rdzv/restarts", 0);
  if (!restarts.ok()) return fail(restarts.status());

  RoundInfo info;
  info.round = round;
  info.group_world_size = static_cast<int>(members->size());
  info.master_port = *port;
  info.restart_count = static_cast<int>(*restarts);
  std::vector<int> slots;
  for (const Member& m : *members) {
    slots.push_back(m.slot);
    info.node_ranks.push_back(m.node_rank);
    info.hosts.push_back(m.host);
  }
  info.group_rank = 0;  // The host sorts first.
  s = store_->Set(closed_key, EncodeRecord({{"status", "ok"},
                                            {"slots", absl::StrJoin(slots, ",")},
                                            {"node_ranks", absl::StrJoin(info.node_ranks, ",")},
                                            {"hosts", absl::StrJoin(info.hosts, ",")},
                                            {"master_port", absl::StrCat(*port)},
                                            {"restarts", absl::StrCat(*restarts)}}));
  if (!s.ok()) return Annotate(s, absl::StrCat("closing round ", round));
  return info;
}

absl::StatusOr<RoundInfo> Rendezvous::ReadClosed(int64_t round, int slot, absl::Time deadline,
                                                 bool* excluded) {
  *excluded = false;
  auto text = store_->Get(Key(round, "closed"), Left(deadline));
  if (!text.ok()) {
    if (text.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous round ", round, " was not completed within ",
                       DurationText(config_.timeout + config_.last_call),
                       " (the master node, node rank 0, closes it once enough nodes "
                       "arrived; is it running, and is the job already at its maximum "
                       "node count?): ",
                       text.status().message()));
    }
    return Annotate(text.status(), absl::StrCat("rendezvous round ", round));
  }
  ASSIGN_OR_RETURN(auto rec, DecodeRecord(*text));
  if ((rec)["status"] != "ok") {
    return absl::Status(static_cast<absl::StatusCode>(ToInt(rec, "code", 2)),
                        absl::StrCat("master node: ", (rec)["message"]));
  }
  std::vector<int> slots = ToInts((rec)["slots"]);
  auto it = std::find(slots.begin(), slots.end(), slot);
  if (it == slots.end()) {
    *excluded = true;
    return absl::AbortedError("not in this round");
  }
  RoundInfo info;
  info.round = round;
  info.group_rank = static_cast<int>(it - slots.begin());
  info.group_world_size = static_cast<int>(slots.size());
  info.node_ranks = ToInts((rec)["node_ranks"]);
  info.hosts = absl::StrSplit((rec)["hosts"], ',');
  info.master_port = ToInt(rec, "master_port", 0);
  info.restart_count = ToInt(rec, "restarts", 0);
  return info;
}

}  // namespace baton::launcher
