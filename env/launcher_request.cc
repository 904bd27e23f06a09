#include "env/launcher_request.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/file_io.h"

namespace baton {

absl::string_view ActionName(LauncherRequest::Action action) {
  return action == LauncherRequest::Action::kDrop ? "drop" : "restart";
}

std::string EncodeLauncherRequest(const LauncherRequest& request) {
  return absl::StrCat("action=", ActionName(request.action), "\nrank=", request.rank,
                      "\nfrom=", request.from,
                      "\nreason=", absl::StrReplaceAll(request.reason, {{"\r", " "}, {"\n", " "}}),
                      "\nid=", request.id, "\n");
}

absl::StatusOr<LauncherRequest> DecodeLauncherRequest(absl::string_view text) {
  std::optional<std::string> action, rank, from, reason, id;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.first == "action") action = std::string(kv.second);
    if (kv.first == "rank") rank = std::string(kv.second);
    if (kv.first == "from") from = std::string(kv.second);
    if (kv.first == "reason") reason = std::string(kv.second);
    if (kv.first == "id") id = std::string(kv.second);
  }
  LauncherRequest out;
  if (action == "restart") {
    out.action = LauncherRequest::Action::kRestart;
  } else if (action == "drop") {
    out.action = LauncherRequest::Action::kDrop;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "launcher request: action must be restart or drop, got '", action.value_or(""), "'"));
  }
  if (!rank.has_value() || !absl::SimpleAtoi(*rank, &out.rank) || out.rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launcher request: rank must be a worker's rank (>= 0), got '", rank.value_or(""), "'"));
  }
  if (!from.has_value() || !absl::SimpleAtoi(*from, &out.from)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launcher request: from must be the asking worker's rank, got '", from.value_or(""), "'"));
  }
  out.reason = reason.value_or("");
  out.id = id.value_or("");
  return out;
}

absl::Status SendLauncherRequest(const std::string& dir, const LauncherRequest& request) {
  // Unique within the job's node (pid, count), in the order of sending
  // within one process (the time first).
  static std::atomic<uint64_t> sent{0};
  LauncherRequest r = request;
  r.id = absl::StrCat(absl::ToUnixNanos(absl::Now()), "-", ::getpid(), "-", sent.fetch_add(1));
  const std::string path = absl::StrCat(dir, "/", r.id, kLauncherRequestSuffix);
  absl::Status s = WriteFileAtomically(path, {EncodeLauncherRequest(r)}, 0600);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("cannot send baton-run the request to ",
                                            ActionName(request.action), " worker ", request.rank,
                                            ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status SendLauncherRequest(const LauncherRequest& request) {
  const char* dir = std::getenv(kEnvLauncherRequests);
  if (dir == nullptr || *dir == '\0') {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot ", ActionName(request.action), " worker ", request.rank, ": ", kEnvLauncherRequests,
        " is not set, so this worker was not started by baton-run, which "
        "alone can stop and start workers"));
  }
  return SendLauncherRequest(dir, request);
}

}  // namespace baton
