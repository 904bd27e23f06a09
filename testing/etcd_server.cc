#include "testing/etcd_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/syscall.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/ports.h"
#include "testing/temp_dir.h"

namespace baton::testing {
namespace {

constexpr char kEtcd[] = "/usr/bin/etcd";
constexpr char kEtcdctl[] = "/usr/bin/etcdctl";
// iproute2, for EtcdServerOptions::netns.
constexpr char kIp[] = "/usr/bin/ip";

// Runs argv with stdout and stderr into `out_fd` (or /dev/null if -1); the
// child dies with this thread's process.
pid_t Spawn(const std::vector<std::string>& argv, int out_fd) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const int fd = out_fd >= 0 ? out_fd : ::open("/dev/null", O_WRONLY);
  ::dup2(fd, STDOUT_FILENO);
  ::dup2(fd, STDERR_FILENO);
  ::execv(cargv[0], cargv.data());
  ::_exit(127);
}

// Waits for `pid`, at most `timeout`; true if it exited (status in *status).
// Polls a pidfd, so the wait ends the moment the child does.
bool WaitExit(pid_t pid, absl::Duration timeout, int* status) {
  const absl::Time deadline = absl::Now() + timeout;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  bool exited = false;
  while (!exited) {
    const pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) {
      exited = true;
      break;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) break;
    pollfd p{pidfd, POLLIN, 0};
    // Without pidfds (Linux < 5.3) the poll is a bounded nap.
    ::poll(pidfd >= 0 ? &p : nullptr, pidfd >= 0 ? 1 : 0,
           static_cast<int>(pidfd >= 0 ? left : std::min<int64_t>(left, 10)));
  }
  if (pidfd >= 0) ::close(pidfd);
  return exited;
}

}  // namespace

bool EtcdServer::Available() { return ::access(kEtcd, X_OK) == 0; }

absl::StatusOr<std::unique_ptr<EtcdServer>> EtcdServer::Start(EtcdServerOptions options) {
  if (!Available()) return absl::UnavailableError("etcd: /usr/bin/etcd is not installed");
  std::unique_ptr<EtcdServer> s(new EtcdServer());
  const int client = FreePort();
  const int peer = FreePort();
  if (client <= 0 || peer <= 0) return absl::UnavailableError("etcd: no free port");
  // Ports are free here; in a fresh network namespace every port is.
  s->endpoint_ = absl::StrCat(options.host, ":", client);
  s->data_dir_ = MakeTempDir("etcd");
  const std::string peer_url = absl::StrCat("http://", options.host, ":", peer);
  const bool tls = !options.tls_dir.empty();
  const std::string client_url = absl::StrCat(tls ? "https://" : "http://", s->endpoint_);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return absl::UnavailableError("etcd: pipe failed");
  std::vector<std::string> argv = {kEtcd,
                                   "--name",
                                   "baton-test",
                                   "--data-dir",
                                   s->data_dir_,
                                   "--listen-client-urls",
                                   client_url,
                                   "--advertise-client-urls",
                                   client_url,
                                   "--listen-peer-urls",
                                   peer_url,
                                   "--initial-advertise-peer-urls",
                                   peer_url,
                                   "--initial-cluster",
                                   absl::StrCat("baton-test=", peer_url),
                                   "--logger",
                                   "zap",
                                   "--log-outputs",
                                   "stderr"};
  if (tls) {
    const std::string& d = options.tls_dir;
    argv.insert(argv.end(), {"--cert-file", d + "/etcd.pem", "--key-file", d + "/etcd.key",
                             "--trusted-ca-file", d + "/ca.pem", "--client-cert-auth"});
  }
  if (!options.netns.empty()) {
    argv.insert(argv.begin(), {kIp, "netns", "exec", options.netns});
  }
  s->pid_ = Spawn(argv, fds[1]);
  ::close(fds[1]);
  s->drain_ = std::thread([srv = s.get(), fd = fds[0]] { srv->Drain(fd); });
  if (absl::Status ready = s->WaitReady(options.timeout); !ready.ok()) return ready;
  if (options.auth) {
    const std::string e = absl::StrCat("--endpoints=", s->endpoint_);
    for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
             {kEtcdctl, e, "user", "add", absl::StrCat("root:", options.root_password)},
             {kEtcdctl, e, "auth", "enable"}}) {
      const pid_t pid = Spawn(cmd, -1);
      int status = 0;
      if (!WaitExit(pid, options.timeout, &status) || !WIFEXITED(status) ||
          WEXITSTATUS(status) != 0) {
        ::kill(pid, SIGKILL);
        return absl::UnavailableError(
            absl::StrCat("etcd: `etcdctl ", cmd[2], " ", cmd[3], "` failed (status ", status, ")"));
      }
    }
  }
  return s;
}

void EtcdServer::Drain(int fd) {
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    absl::MutexLock lock(&mu_);
    if (n <= 0) {
      closed_ = true;
      break;
    }
    log_.append(buf, static_cast<size_t>(n));
    // etcd 3.4 (zap): "serving client traffic insecurely" or "... securely".
    if (absl::StrContains(log_, "serving client traffic") ||
        absl::StrContains(log_, "ready to serve client requests")) {
      ready_ = true;
    }
    if (log_.size() > (16 << 10)) log_.erase(0, log_.size() - (16 << 10));
  }
  ::close(fd);
}

std::string EtcdServer::LogTail() const {
  absl::MutexLock lock(&mu_);
  return log_.substr(log_.size() > 4000 ? log_.size() - 4000 : 0);
}

absl::Status EtcdServer::WaitReady(absl::Duration timeout) {
  bool ready, closed;
  {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_ || closed_; };
    mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
    ready = ready_;
    closed = closed_;
  }
  if (ready) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      closed ? "etcd exited before it was ready"
             : absl::StrCat("etcd did not become ready within ", absl::FormatDuration(timeout)),
      "; it said:\n", LogTail()));
}

void EtcdServer::Stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int status = 0;
  if (!WaitExit(pid_, absl::Seconds(5), &status)) {
    ::kill(pid_, SIGKILL);
    WaitExit(pid_, absl::Seconds(5), &status);
  }
  pid_ = -1;
  if (drain_.joinable()) drain_.join();
}

void EtcdServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  WaitExit(pid_, absl::Seconds(5), &status);
  pid_ = -1;
  if (drain_.joinable()) drain_.join();
}

EtcdServer::~EtcdServer() {
  Stop();
  if (drain_.joinable()) drain_.join();
  if (!data_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(data_dir_, ignored);
  }
}

}  // namespace baton::testing
