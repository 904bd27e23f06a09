#include "testing/fork_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/eventually.h"

extern char** environ;

namespace baton::testing {
namespace {

constexpr int kServerFd = 3;

// A message is a list of strings: a u32 count, then each string as a u32
// length and its bytes (host order: both ends are one machine).
using Message = std::vector<std::string>;

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool WriteMessage(int fd, const Message& message) {
  std::string out;
  auto put_u32 = [&out](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put_u32(static_cast<uint32_t>(message.size()));
  for (const std::string& s : message) {
    put_u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  return WriteAll(fd, out.data(), out.size());
}

// Reads exactly `size` bytes, waiting at most until `deadline` for each.
// DEADLINE_EXCEEDED before the first byte of a message only (`started`
// false); a peer that stops mid-message is UNAVAILABLE.
absl::Status ReadExactly(int fd, char* data, size_t size, absl::Time deadline, bool started) {
  while (size > 0) {
    pollfd p{fd, POLLIN, 0};
    const absl::Duration left = deadline - absl::Now();
    const int ms = left <= absl::ZeroDuration()
                       ? 0
                       : static_cast<int>(absl::ToInt64Milliseconds(left + absl::Milliseconds(1)));
    const int ready = ::poll(&p, 1, deadline == absl::InfiniteFuture() ? -1 : ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (!started) return absl::DeadlineExceededError("no message");
      return absl::UnavailableError("fork server: message cut short");
    }
    const ssize_t n = ::read(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("fork server: connection closed");
    started = true;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<Message> ReadMessage(int fd, absl::Time deadline) {
  uint32_t count = 0;
  if (absl::Status s = ReadExactly(fd, reinterpret_cast<char*>(&count), sizeof(count), deadline,
                                   /*started=*/false);
      !s.ok()) {
    return s;
  }
  // Nothing after the first byte waits on the caller's deadline: the rest of
  // a message follows at once.
  const absl::Time rest = absl::Now() + absl::Seconds(10);
  if (count > 1 << 16) return absl::DataLossError("fork server: bad message");
  Message message(count);
  for (std::string& s : message) {
    uint32_t size = 0;
    if (absl::Status st = ReadExactly(fd, reinterpret_cast<char*>(&size), sizeof(size), rest, true);
        !st.ok()) {
      return st;
    }
    if (size > (1u << 24)) return absl::DataLossError("fork server: bad message");
    s.resize(size);
    if (absl::Status st = ReadExactly(fd, s.data(), size, rest, true); !st.ok()) return st;
  }
  return message;
}

// An exit report, {"exit", pid, wait status}.
bool ParseExit(const Message& m, int* pid, int* wait_status) {
  return m.size() == 3 && m[0] == "exit" && absl::SimpleAtoi(m[1], pid) &&
         absl::SimpleAtoi(m[2], wait_status);
}

int ThreadCount() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n;
}

// In the forked child: becomes the worker the request describes.
[[noreturn]] void BecomeWorker(const Message& request, int signal_fd, const sigset_t& mask,
                               int (*run_scenario)(const std::string&)) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::close(kServerFd);
  ::close(signal_fd);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  const int log = ::open(request[2].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) std::_Exit(126);
  ::dup2(log, 1);
  ::dup2(log, 2);
  ::close(log);
  ::clearenv();
  for (size_t i = 3; i < request.size(); ++i) {
    ::putenv(::strdup(request[i].c_str()));  // putenv keeps the string: never freed
  }
  std::exit(run_scenario(request[1]));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ForkServer>> ForkServer::Start() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::UnavailableError(absl::StrCat("fork server: socketpair: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], kServerFd);  // dup2 clears CLOEXEC
  std::string self = "/proc/self/exe";
  std::string flag = kForkServerFlag;
  char* argv[] = {self.data(), flag.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, self.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return absl::UnavailableError(absl::StrCat("fork server: posix_spawn: ", std::strerror(rc)));
  }
  std::unique_ptr<ForkServer> server(new ForkServer(pid, fds[0]));
  // The first message says whether the server can fork (one thread).
  absl::StatusOr<Message> hello = ReadMessage(server->fd_, absl::Now() + absl::Seconds(60));
  if (!hello.ok()) return hello.status();
  if (hello->empty() || (*hello)[0] != "ready") {
    return absl::FailedPreconditionError(
        absl::StrCat("fork server: ", hello->size() > 1 ? (*hello)[1] : "refused"));
  }
  return server;
}

ForkServer::~ForkServer() {
  ::close(fd_);  // the server kills and reaps its children, then exits
  int status = 0;
  if (!Eventually([&] { return ::waitpid(pid_, &status, WNOHANG) != 0; }, absl::Seconds(30))) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
  }
}

absl::StatusOr<std::string> ForkServer::ReadReply(absl::Time deadline) {
  for (;;) {
    absl::StatusOr<Message> m = ReadMessage(fd_, deadline);
    if (!m.ok()) return m.status();
    int pid = 0, status = 0;
    if (ParseExit(*m, &pid, &status)) {
      early_exits_[pid] = status;
      continue;
    }
    if (m->size() == 2 && (*m)[0] == "pid") return (*m)[1];
    return absl::FailedPreconditionError(
        absl::StrCat("fork server: ", m->size() > 1 ? (*m)[1] : "refused"));
  }
}

absl::StatusOr<pid_t> ForkServer::Spawn(const std::string& scenario, const std::string& log,
                                        const std::map<std::string, std::string>& env) {
  Message request = {"spawn", scenario, log};
  for (const auto& [k, v] : env) request.push_back(k + "=" + v);
  if (!WriteMessage(fd_, request)) return absl::UnavailableError("fork server: gone");
  absl::StatusOr<std::string> reply = ReadReply(absl::Now() + absl::Seconds(30));
  if (!reply.ok()) return reply.status();
  int pid = 0;
  if (!absl::SimpleAtoi(*reply, &pid) || pid <= 0) {
    return absl::DataLossError("fork server: bad pid");
  }
  return static_cast<pid_t>(pid);
}

absl::Status ForkServer::Kill(pid_t pid) {
  if (!WriteMessage(fd_, {"kill", std::to_string(pid)})) {
    return absl::UnavailableError("fork server: gone");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ForkServer::WaitExit(absl::Time deadline, pid_t* pid, int* wait_status) {
  if (!early_exits_.empty()) {
    *pid = early_exits_.begin()->first;
    *wait_status = early_exits_.begin()->second;
    early_exits_.erase(early_exits_.begin());
    return true;
  }
  absl::StatusOr<Message> m = ReadMessage(fd_, deadline);
  if (absl::IsDeadlineExceeded(m.status())) return false;
  if (!m.ok()) return m.status();
  int p = 0;
  if (!ParseExit(*m, &p, wait_status))
    return absl::DataLossError("fork server: unexpected message");
  *pid = p;
  return true;
}

void RunForkServer(int (*run_scenario)(const std::string& name)) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) std::_Exit(0);  // the test process is already gone
  const int threads = ThreadCount();
  if (threads != 1) {
    WriteMessage(kServerFd,
                 {"refused", absl::StrCat(threads, " threads at start; fork is unsafe")});
    std::_Exit(0);
  }
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, &old);
  const int signal_fd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0 || !WriteMessage(kServerFd, {"ready"})) std::_Exit(0);
  std::set<pid_t> children;
  auto reap = [&children](int options) {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, options)) > 0) {
      children.erase(pid);
      WriteMessage(kServerFd, {"exit", std::to_string(pid), std::to_string(status)});
    }
  };
  for (;;) {
    // Waits without a deadline on purpose: the server lives exactly as long
    // as its test process, whose end closes the socket (or kills it).
    pollfd p[2] = {{kServerFd, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents != 0) {
      signalfd_siginfo info;
      while (::read(signal_fd, &info, sizeof(info)) > 0) {
      }
      reap(WNOHANG);
    }
    if (p[0].revents == 0) continue;
    absl::StatusOr<Message> request = ReadMessage(kServerFd, absl::InfiniteFuture());
    if (!request.ok() || request->empty()) break;
    const std::string& verb = (*request)[0];
    if (verb == "spawn" && request->size() >= 3) {
      std::fflush(nullptr);
      const pid_t pid = ::fork();
      if (pid == 0) BecomeWorker(*request, signal_fd, old, run_scenario);
      if (pid < 0) {
        WriteMessage(kServerFd, {"refused", absl::StrCat("fork: ", std::strerror(errno))});
        continue;
      }
      children.insert(pid);
      WriteMessage(kServerFd, {"pid", std::to_string(pid)});
    } else if (verb == "kill" && request->size() == 2) {
      int pid = 0;
      if (absl::SimpleAtoi((*request)[1], &pid) && children.count(pid) > 0) ::kill(pid, SIGKILL);
    } else {
      break;
    }
  }
  for (pid_t pid : children) ::kill(pid, SIGKILL);
  for (pid_t pid : std::set<pid_t>(children)) ::waitpid(pid, nullptr, 0);
  std::_Exit(0);
}

}  // namespace baton::testing
