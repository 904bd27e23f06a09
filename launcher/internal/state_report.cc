#include "launcher/internal/state_report.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "obs/http_server.h"
#include "obs/metrics.h"
#include "obs/state.h"

namespace baton::launcher::internal {
namespace {

constexpr absl::string_view kSocketPrefix = "rank";
constexpr absl::string_view kSocketSuffix = ".sock";
constexpr char kReportDirFile[] = "report_dir";
// A Unix socket path holds at most 107 bytes; keep room for "/rank<N>.sock".
constexpr size_t kMaxDirLength = 80;

// FNV-1a: stable across processes, for run ids that cannot be a file name.
uint64_t Fnv1a(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool PlainName(absl::string_view s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string StateDir(const std::string& run_id) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string hashed = absl::StrCat("run-", absl::Hex(Fnv1a(run_id), absl::kZeroPad16));
  const std::string name = PlainName(run_id) ? run_id : hashed;
  // $TMPDIR, unless a socket path in it would be too long for the kernel.
  for (const std::string& root : {std::string(tmp != nullptr ? tmp : ""), std::string("/tmp")}) {
    if (root.empty()) continue;
    const std::string base = absl::StrCat(root, "/baton-", ::getuid());
    for (const std::string& n : {name, hashed}) {
      std::string dir = absl::StrCat(base, "/", n);
      if (dir.size() <= kMaxDirLength) return dir;
    }
  }
  return absl::StrCat("/tmp/baton-", ::getuid(), "/", hashed);
}

std::string StateSocket(const std::string& state_dir, int rank) {
  return absl::StrCat(state_dir, "/", kSocketPrefix, rank, kSocketSuffix);
}

absl::Status PrepareStateDir(const std::string& state_dir, const std::string& report_dir) {
  RETURN_IF_ERROR(MakeDirs(state_dir));
  // Private: the sockets answer anyone who can reach them.
  const size_t slash = state_dir.rfind('/');
  for (const std::string& d : {state_dir.substr(0, slash), state_dir}) {
    if (::chmod(d.c_str(), 0700) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("cannot make ", d, " private (chmod 0700)"));
    }
  }
  return WriteFileAtomically(absl::StrCat(state_dir, "/", kReportDirFile), {report_dir});
}

std::string ReportDirOf(const std::string& state_dir) {
  auto d = ReadFile(absl::StrCat(state_dir, "/", kReportDirFile));
  if (d.ok() && !d->empty()) return *d;
  return absl::StrCat(state_dir, "-reports");
}

std::vector<std::pair<int, std::string>> StateSockets(const std::string& state_dir) {
  std::vector<std::pair<int, std::string>> out;
  DIR* d = ::opendir(state_dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    absl::string_view name = e->d_name;
    if (!absl::ConsumePrefix(&name, kSocketPrefix) || !absl::ConsumeSuffix(&name, kSocketSuffix)) {
      continue;
    }
    int rank = 0;
    if (absl::SimpleAtoi(name, &rank) && rank >= 0) {
      out.emplace_back(rank, absl::StrCat(state_dir, "/", e->d_name));
    }
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// How much longer than the local deadline a worker gets to gather the
// other nodes' states (it waits up to 3 s for each: rpc/agent_state.cc).
constexpr absl::Duration kJobStateWait = absl::Seconds(4);

// GET `path` from every worker's socket at once, each within `timeout`:
// the bodies of the answers that came back 200, else why not.
std::vector<absl::StatusOr<std::string>> AskAll(
    const std::vector<std::pair<int, std::string>>& sockets, const std::string& path,
    absl::Duration timeout) {
  std::vector<absl::StatusOr<std::string>> answers(sockets.size(), absl::UnknownError("not asked"));
  std::vector<std::thread> askers;
  for (size_t i = 0; i < sockets.size(); ++i) {
    askers.emplace_back([&, i] {
      auto r = obs::HttpGet(absl::StrCat("unix:", sockets[i].second), path, timeout);
      if (!r.ok()) {
        answers[i] = r.status();
      } else if (obs::HttpStatus(*r) != 200) {
        answers[i] = absl::UnavailableError(absl::StrCat("answered ", obs::HttpStatus(*r)));
      } else {
        answers[i] = obs::HttpBody(*r);
      }
    });
  }
  for (auto& t : askers) t.join();
  return answers;
}

}  // namespace

proto::StateReport CollectReport(const std::string& run_id, const std::string& reason,
                                 const std::string& state_dir, absl::Duration timeout,
                                 bool whole_job) {
  const auto sockets = StateSockets(state_dir);
  const auto answers = AskAll(sockets, "/state", timeout);
  std::vector<proto::WorkerState> workers;
  std::map<int, std::string> unanswered;
  std::set<int> here;
  int world_size = 0;
  std::string relay;  // the socket of a local worker that answered
  for (size_t i = 0; i < sockets.size(); ++i) {
    here.insert(sockets[i].first);
    proto::WorkerState w;
    absl::Status s = answers[i].ok() ? obs::FromJson(*answers[i], &w) : answers[i].status();
    if (s.ok()) {
      world_size = std::max(world_size, w.world_size());
      if (relay.empty()) relay = sockets[i].second;
      workers.push_back(std::move(w));
    } else {
      unanswered[sockets[i].first] = std::string(s.message());
    }
  }
  // The ranks on other nodes: one local worker asks them through RPC
  // (GET /job_state), so that any node's report covers the whole job.
  std::set<int> elsewhere;
  for (int r = 0; whole_job && r < world_size; ++r) {
    if (here.count(r) == 0) elsewhere.insert(r);
  }
  if (!elsewhere.empty()) {
    proto::JobState job;
    const auto answer = AskAll({{-1, relay}}, "/job_state", timeout + kJobStateWait).front();
    const absl::Status s = answer.ok() ? obs::FromJson(*answer, &job) : answer.status();
    for (proto::WorkerState& w : *job.mutable_workers()) {
      if (elsewhere.erase(w.rank()) > 0) workers.push_back(std::move(w));
    }
    for (const proto::Field& f : job.unanswered()) {
      int rank = -1;
      if (absl::SimpleAtoi(f.key(), &rank) && elsewhere.erase(rank) > 0) {
        unanswered[rank] = f.value();
      }
    }
    for (int rank : elsewhere) {
      unanswered[rank] =
          s.ok() ? "on another node; the job state did not include it"
                 : absl::StrCat("on another node, asked through a local worker: ", s.message());
    }
  }
  std::sort(workers.begin(), workers.end(),
            [](const auto& a, const auto& b) { return a.rank() < b.rank(); });
  return obs::BuildReport(run_id, reason, std::move(workers), unanswered, absl::Now());
}

absl::StatusOr<std::string> WriteReport(const proto::StateReport& report, const std::string& dir) {
  RETURN_IF_ERROR(MakeDirs(dir));
  const std::string path =
      absl::StrCat(dir, "/state_report_",
                   absl::FormatTime("%Y%m%d-%H%M%E3S", absl::FromUnixMicros(report.time_unix_us()),
                                    absl::UTCTimeZone()),
                   ".json");
  RETURN_IF_ERROR(WriteFileAtomically(path, {obs::ToJson(report)}));
  return path;
}

std::string ScrapeNode(const std::string& state_dir, absl::Duration timeout) {
  const auto sockets = StateSockets(state_dir);
  const auto answers = AskAll(sockets, "/metrics", timeout);
  std::vector<std::pair<std::string, std::string>> sources;
  for (size_t i = 0; i < sockets.size(); ++i) {
    if (answers[i].ok()) sources.emplace_back(absl::StrCat(sockets[i].first), *answers[i]);
  }
  const auto n = static_cast<double>(sources.size());
  obs::MetricsWriter w;
  w.Gauge("baton_node_workers_scraped", "Workers on this node whose metrics this scrape holds.", n);
  w.Gauge("baton_node_workers_unanswered",
          "Workers on this node that serve their state but gave no metrics to this scrape.",
          static_cast<double>(sockets.size()) - n);
  return absl::StrCat(w.text(), obs::MergeExpositions("rank", sources));
}

int DumpState(const std::string& run_id) {
  const std::string dir = StateDir(run_id);
  if (StateSockets(dir).empty()) {
    Logger("baton-run")
        .Error(absl::StrCat("no worker of run '", run_id,
                            "' serves its state on this node (looked in ", dir, ")"));
    return 1;
  }
  const proto::StateReport report =
      CollectReport(run_id, "baton-run --dump", dir, absl::Seconds(5));
  std::fputs(obs::ReportText(report).c_str(), stdout);
  std::fflush(stdout);
  auto path = WriteReport(report, ReportDirOf(dir));
  if (!path.ok()) {
    Logger("baton-run")
        .Error(absl::StrCat("the report was not written: ", path.status().message()));
    return 1;
  }
  Logger("baton-run").Info(absl::StrCat("state report written to ", *path));
  return 0;
}

StateWatcher::StateWatcher(Options options) : o_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

StateWatcher::~StateWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void StateWatcher::RequestReport(std::string reason) {
  absl::MutexLock lock(&mu_);
  requests_.push_back(std::move(reason));
}

void StateWatcher::Report(const proto::StateReport& report) {
  std::fputs(obs::ReportText(report).c_str(), stderr);
  auto path = WriteReport(report, ReportDirOf(o_.state_dir));
  o_.log(path.ok() ? absl::StrCat("state report written to ", *path)
                   : absl::StrCat("the state report was not written: ", path.status().message()));
}

void StateWatcher::Loop() {
  constexpr absl::Duration kAskTimeout = absl::Seconds(2);
  const bool watch = o_.hang_timeout > absl::ZeroDuration();
  const absl::Duration period =
      watch ? std::clamp(o_.hang_timeout / 4, absl::Milliseconds(100), absl::Seconds(5))
            : absl::InfiniteDuration();
  std::map<int, int64_t> last;
  absl::Time last_progress = absl::Now();
  bool reported = false;
  while (true) {
    std::vector<std::string> requests;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !requests_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&woken), period);
      if (stop_) return;
      requests.swap(requests_);
    }
    for (const std::string& reason : requests) {
      Report(CollectReport(o_.run_id, reason, o_.state_dir, kAskTimeout));
    }
    if (!watch) continue;
    // --hang_timeout: progress is any change of a worker's counters.
    const proto::StateReport now_state =
        CollectReport(o_.run_id, "progress check", o_.state_dir, kAskTimeout, /*whole_job=*/false);
    std::map<int, int64_t> totals;
    for (const auto& w : now_state.workers()) totals[w.rank()] = obs::TotalProgress(w);
    const absl::Time now = absl::Now();
    if (totals != last) {
      last = std::move(totals);
      last_progress = now;
      reported = false;
      continue;
    }
    const absl::Duration still = now - last_progress;
    if (reported || now_state.edges().empty() || still < o_.hang_timeout) continue;
    o_.log(absl::StrCat("no worker on this node made progress for ", absl::FormatDuration(still),
                        " (--hang_timeout) while some wait; reporting their state"));
    Report(CollectReport(
        o_.run_id,
        absl::StrCat("no progress for ", absl::FormatDuration(still), " (--hang_timeout)"),
        o_.state_dir, kAskTimeout));
    reported = true;
  }
}

}  // namespace baton::launcher::internal
