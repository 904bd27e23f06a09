// NodeAgent's recovery (launcher/node_agent.h): what a failed worker costs
// (the round, its role, or itself, by --restart_policy), and the host's
// claim, checks and failover on etcd.
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "launcher/internal/node_agent_impl.h"

namespace baton::launcher {
namespace {

using internal::IsMissingKey;
using internal::kFollowUpTimeout;
using internal::kHostKey;
using internal::kSummaryTailLines;
using internal::Log;
using internal::Worker;

}  // namespace

Record NodeAgent::Impl::FailureRecord(const RoundInfo& round, int i) {
  const Worker& w = group_->worker(i);
  return {
      {"kind", "failure"},
      {"rank", absl::StrCat(w.rank)},
      {"local_rank", absl::StrCat(w.local_rank)},
      {"role", o_.roles[w.role_index].name},
      {"role_rank", absl::StrCat(w.role_rank)},
      {"node_rank", absl::StrCat(node_rank_)},
      {"group_rank", absl::StrCat(round.group_rank)},
      {"host", host_name_},
      {"pid", absl::StrCat(w.pid)},
      {"reason", w.stop_reason.empty() ? w.exit.Describe()
                                       : absl::StrCat(w.stop_reason, " (", w.exit.Describe(), ")")},
      {"time", absl::FormatTime("%Y-%m-%d %H:%M:%E3S %Z", w.exit.time, absl::LocalTimeZone())},
      {"error_file", w.error_file},
      {"error_content", group_->ErrorFileContent(i)},
      {"log", w.log_path},
      {"tail", group_->Tail(i, kSummaryTailLines)}};
}

absl::Status NodeAgent::Impl::ReportFailure(const RoundInfo& round, int i) {
  const std::string key = Rendezvous::Key(round.round, "end");
  const std::string record = EncodeRecord(FailureRecord(round, i));
  ASSIGN_OR_RETURN(auto won, store_->CompareSet(key, "", record));
  if (won != record) return absl::OkStatus();  // Someone else was first.
  auto n = store_->Add("rdzv/restarts", 1);
  if (!n.ok()) return n.status();
  return store_->Set(Rendezvous::Key(round.round, "end_restart"), absl::StrCat(*n));
}

absl::Status NodeAgent::Impl::ReportRoleFailure(const RoundInfo& round, int role, int gen, int i) {
  const std::string base =
      Rendezvous::Key(round.round, absl::StrCat("role/", o_.roles[role].name, "/", gen, "/"));
  const std::string record = EncodeRecord(FailureRecord(round, i));
  ASSIGN_OR_RETURN(auto won, store_->CompareSet(base + "end", "", record));
  if (won != record) return absl::OkStatus();
  auto n = store_->Add("rdzv/restarts", 1);
  if (!n.ok()) return n.status();
  if (*n > o_.max_restarts) {
    // Out of restarts: the failure ends the whole round.
    auto end = store_->CompareSet(Rendezvous::Key(round.round, "end"), "", record);
    if (!end.ok()) return end.status();
    if (*end == record) {
      absl::Status s = store_->Set(Rendezvous::Key(round.round, "end_restart"), absl::StrCat(*n));
      if (!s.ok()) return s;
    }
  }
  return store_->Set(base + "restart", absl::StrCat(*n));
}

absl::Status NodeAgent::Impl::RestartWorker(const RoundInfo& round, int i) {
  const Record record = FailureRecord(round, i);
  ASSIGN_OR_RETURN(auto n, store_->Add("rdzv/restarts", 1));
  if (n > o_.max_restarts) {
    const std::string rec = EncodeRecord(record);
    auto end = store_->CompareSet(Rendezvous::Key(round.round, "end"), "", rec);
    if (!end.ok()) return end.status();
    if (*end == rec) {
      return store_->Set(Rendezvous::Key(round.round, "end_restart"), absl::StrCat(n));
    }
    return absl::OkStatus();
  }
  const Worker& w = group_->worker(i);
  Log(absl::StrCat("role ", o_.roles[w.role_index].name, ": rank ", w.rank, " ",
                   record.at("reason"), "; restarting that worker alone (restart ", n, "/",
                   o_.max_restarts, ")"));
  return group_->StartWorker(i, static_cast<int>(n));
}

absl::StatusOr<bool> NodeAgent::Impl::MaybeRestartRole(const RoundInfo& round, int role, int* gen,
                                                       bool* reported_done) {
  const std::string base =
      Rendezvous::Key(round.round, absl::StrCat("role/", o_.roles[role].name, "/", *gen, "/"));
  auto end = store_->Get(base + "end", absl::ZeroDuration());
  if (!end.ok()) {
    if (IsMissingKey(end.status())) return false;
    return end.status();
  }
  ASSIGN_OR_RETURN(auto n_text, store_->Get(base + "restart", kFollowUpTimeout));
  int n = 0;
  (void)absl::SimpleAtoi(n_text, &n);
  if (n > o_.max_restarts) return false;  // The round end carries it.
  auto rec = DecodeRecord(*end);
  Log(absl::StrCat("role ", o_.roles[role].name, ": rank ", rec.ok() ? (*rec)["rank"] : "?", " ",
                   rec.ok() ? (*rec)["reason"] : "failed",
                   "; restarting the role's workers (restart ", n, "/", o_.max_restarts, ")"));
  group_->Stop(role, SIGTERM, o_.stop_timeout);
  if (*reported_done) {
    auto del =
        store_->Delete(Rendezvous::Key(round.round, absl::StrCat("done/", round.group_rank)));
    if (!del.ok()) return del.status();
    *reported_done = false;
  }
  absl::Status s = store::Barrier(*store_, base + "stopped", round.group_rank,
                                  round.group_world_size, o_.rdzv_timeout);
  if (!s.ok()) return s;
  ++*gen;
  s = group_->Start(role, n);
  if (!s.ok()) return s;
  return true;
}

// Host failover (etcd, elastic; rendezvous.h, N4): the host holds the job's
// host key on its etcd session, which expires --heartbeat_timeout after the
// host stops (dies or hangs). A node that finds the key gone claims it:
// exactly one claim creates it. While a round runs, the new host ends it as
// node_lost and closes the next; while a round forms, it closes that one
// (Rendezvous::Join). A host that finds the key no longer its own steps
// down.
absl::StatusOr<bool> NodeAgent::Impl::ClaimHost() {
  auto created = etcd_->CreateOnSession(kHostKey, host_claim_, o_.HeartbeatTimeout());
  if (!created.ok() || !*created) return created;
  const bool first = node_rank_ < 0 && !rdzv_;
  node_rank_ = 0;
  if (rdzv_) rdzv_->SetNodeRank(0);
  Log(first ? "this node hosts the rendezvous (it holds the job's host key in etcd)"
            : "the rendezvous host is gone (its etcd session expired); this node hosts the "
              "rendezvous now");
  return true;
}

absl::Status NodeAgent::Impl::WatchHost(const RoundInfo& round) {
  auto holder = store_->Get(kHostKey, absl::ZeroDuration());
  if (holder.ok()) return absl::OkStatus();
  if (!absl::IsDeadlineExceeded(holder.status())) return holder.status();
  auto claimed = ClaimHost();
  if (!claimed.ok() || !*claimed) return claimed.status();
  rdzv_->SetHost(true);
  return store_
      ->CompareSet(
          Rendezvous::Key(round.round, "end"), "",
          EncodeRecord(
              {{"kind", "node_lost"},
               {"group_rank", "0"},
               {"node_rank", round.node_ranks.empty() ? "0" : absl::StrCat(round.node_ranks[0])},
               {"host", round.hosts.empty() ? "?" : round.hosts[0]}}))
      .status();
}

absl::Status NodeAgent::Impl::HostChecks(const RoundInfo& round) {
  const int k = round.group_world_size;
  const std::string end_key = Rendezvous::Key(round.round, "end");
  if (dynamic_host_) {
    auto holder = store_->Get(kHostKey, absl::ZeroDuration());
    if (!holder.ok() && !absl::IsDeadlineExceeded(holder.status())) return holder.status();
    if (!holder.ok() || *holder != host_claim_) {
      Log("another node took over the rendezvous host (this node was silent too long); "
          "stepping down");
      rdzv_->SetHost(false);
      node_rank_ = -1;
      rdzv_->SetNodeRank(-1);
      return absl::OkStatus();
    }
  }
  // Success: every node reported done.
  std::vector<std::string> done;
  for (int g = 0; g < k; ++g) {
    done.push_back(Rendezvous::Key(round.round, absl::StrCat("done/", g)));
  }
  if (store_->Wait(done, absl::ZeroDuration()).ok()) {
    return store_->CompareSet(end_key, "", EncodeRecord({{"kind", "success"}})).status();
  }
  const absl::Time now = absl::Now();
  // Heartbeats of the other nodes.
  if (heartbeats_.size() != static_cast<size_t>(k)) {
    heartbeats_.assign(k, {-1, now});
  }
  for (int g = 1; g < k; ++g) {
    ASSIGN_OR_RETURN(auto hb, store_->Add(Rendezvous::Key(round.round, absl::StrCat("hb/", g)), 0));
    if (hb != heartbeats_[g].first) {
      heartbeats_[g] = {hb, now};
    } else if (now - heartbeats_[g].second > o_.HeartbeatTimeout()) {
      return store_
          ->CompareSet(end_key, "",
                       EncodeRecord({{"kind", "node_lost"},
                                     {"group_rank", absl::StrCat(g)},
                                     {"node_rank", absl::StrCat(round.node_ranks[g])},
                                     {"host", round.hosts[g]}}))
          .status();
    }
  }
  // Elastic: a node waits for the next round and there is room for it.
  if (k < o_.max_nodes) {
    ASSIGN_OR_RETURN(auto waiting, store_->Add(Rendezvous::Key(round.round + 1, "count"), 0));
    if (waiting > 0) {
      return store_->CompareSet(end_key, "", EncodeRecord({{"kind", "node_joined"}})).status();
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::launcher
