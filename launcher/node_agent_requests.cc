// The workers' requests to baton-run (env/launcher_request.h, LR1-LR5):
// read from this node's directory, carried out here or forwarded to the
// node that runs the worker through the round's rendezvous keys.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/file_io.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "env/launcher_request.h"
#include "launcher/internal/node_agent_impl.h"

namespace baton::launcher {

using internal::Log;

namespace {

// The complete requests in `dir`, oldest name first (LR1: a name that
// starts with '.' is one still being written).
std::vector<std::string> RequestFiles(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const absl::string_view name = e->d_name;
      if (name.empty() || name[0] == '.' || !absl::EndsWith(name, kLauncherRequestSuffix)) {
        continue;
      }
      names.emplace_back(name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The round's forwarded requests: slot k holds the k-th, "requests/count"
// how many slots are filled.
std::string Slot(const RoundInfo& round, int64_t slot) {
  return Rendezvous::Key(round.round, absl::StrCat("requests/", slot));
}
std::string SlotCount(const RoundInfo& round) {
  return Rendezvous::Key(round.round, "requests/count");
}

}  // namespace

absl::Status NodeAgent::Impl::HandleRequests(const RoundInfo& round) {
  const bool shared = round.group_world_size > 1;
  const int world_size = o_.local_world_size() * round.group_world_size;
  for (const std::string& name : RequestFiles(requests_dir_)) {
    const std::string path = absl::StrCat(requests_dir_, "/", name);
    absl::StatusOr<std::string> text = ReadFile(path);
    ::unlink(path.c_str());
    if (!text.ok()) continue;  // gone meanwhile
    absl::StatusOr<LauncherRequest> request = DecodeLauncherRequest(*text);
    if (!request.ok()) {
      Log(absl::StrCat("ignored a worker's request (", name, "): ", request.status().message()));
      continue;
    }
    if (group_->IndexOfRank(request->rank) >= 0 || !shared || request->rank >= world_size) {
      CarryOut(*request);
      continue;
    }
    // Another node's worker (LR2). The round's forwarded requests fill
    // slots 0, 1, ... each taken by a CompareSet (two nodes never fill one
    // slot; a request's id makes two alike requests two), and then counted:
    // a count of c means slots [0, c) are filled.
    const std::string encoded = EncodeLauncherRequest(*request);
    for (int64_t slot = next_request_slot_;; ++slot) {
      ASSIGN_OR_RETURN(std::string held, store_->CompareSet(Slot(round, slot), "", encoded));
      if (held == encoded) break;
    }
    RETURN_IF_ERROR(store_->Add(SlotCount(round), 1).status());
  }
  // Read with an Add, not a Get: over a partition it fails (and the node
  // fences itself) where a Get of a missing key would only look missing.
  if (shared && absl::Now() - last_request_poll_ >= internal::kHeartbeatPeriodMax) {
    last_request_poll_ = absl::Now();
    ASSIGN_OR_RETURN(int64_t count, store_->Add(SlotCount(round), 0));
    for (; next_request_slot_ < count; ++next_request_slot_) {
      ASSIGN_OR_RETURN(std::string held,
                       store_->Get(Slot(round, next_request_slot_), internal::kFollowUpTimeout));
      absl::StatusOr<LauncherRequest> request = DecodeLauncherRequest(held);
      if (request.ok() && group_->IndexOfRank(request->rank) >= 0) CarryOut(*request);
    }
  }
  group_->EscalateStops(absl::Now());
  return absl::OkStatus();
}

void NodeAgent::Impl::DiscardRequests() {
  // Requests of an earlier round name processes that are gone (LR5).
  for (const std::string& name : RequestFiles(requests_dir_)) {
    ::unlink(absl::StrCat(requests_dir_, "/", name).c_str());
  }
}

void NodeAgent::Impl::CarryOut(const LauncherRequest& request) {
  const int i = group_->IndexOfRank(request.rank);
  const std::string what =
      absl::StrCat(ActionName(request.action), " of rank ", request.rank, " asked by rank ",
                   request.from, request.reason.empty() ? "" : ": ", request.reason);
  if (i < 0) {
    Log(absl::StrCat(what, ": no worker of this job has that rank; nothing done"));
    return;
  }
  const bool drop = request.action == LauncherRequest::Action::kDrop;
  const internal::Worker& w = group_->worker(i);
  const std::string reason =
      absl::StrCat(drop ? "dropped" : "stopped for a restart", " at the request of rank ",
                   request.from, request.reason.empty() ? "" : ": ", request.reason);
  switch (group_->StopOnRequest(i, drop, reason, absl::Now() + o_.stop_timeout)) {
    case internal::WorkerGroup::StopOutcome::kNotRunning:
      Log(absl::StrCat(what, ": it is not running (ended or restarting); nothing done"));
      return;
    case internal::WorkerGroup::StopOutcome::kAlreadyStopping:
      Log(absl::StrCat(what, ": it is already being stopped (", w.stop_reason, "); nothing more"));
      return;
    case internal::WorkerGroup::StopOutcome::kStopping: break;
  }
  Log(absl::StrCat(
      what, ": sent SIGTERM to rank ", w.rank, " (role ", o_.roles[w.role_index].name, ", pid ",
      w.pid, "), SIGKILL after ", DurationText(o_.stop_timeout),
      drop ? "; the round goes on without it" : "; its restart policy starts it again"));
}

}  // namespace baton::launcher
