#include "bench/worker_procs.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace baton::bench {
namespace {

constexpr int kReportFd = 3;
constexpr int kReleaseFd = 4;

// Moves `fd` to a number >= 10 with close-on-exec, so that the dup2()s of
// posix_spawn onto fds 3 and 4 never clobber a source.
int MoveHigh(int fd) {
  const int high = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  return high;
}

bool Failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return "stopped";
}

// The environment of a worker: the driver's, with the rendezvous variables
// replaced (and baton-run's marker removed, so FromEnv reads these).
std::vector<std::string> WorkerEnv(const WorkerSpec& spec, int world, int port) {
  static const char* const kOwn[] = {
      "RANK=",         "WORLD_SIZE=",        "MASTER_ADDR=",
      "MASTER_PORT=",  "BATON_WORKER_NAME=", "BATON_ELASTIC_LAUNCHED=",
      "BATON_REJOIN=",
  };
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    bool own = false;
    for (const char* k : kOwn) own = own || absl::StartsWith(*e, k);
    if (!own) env.emplace_back(*e);
  }
  env.push_back(absl::StrCat("RANK=", spec.rank));
  env.push_back(absl::StrCat("WORLD_SIZE=", world));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back(absl::StrCat("MASTER_PORT=", port));
  env.push_back(absl::StrCat("BATON_WORKER_NAME=", spec.name));
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerGroup>> WorkerGroup::Spawn(
    const std::vector<WorkerSpec>& specs, const std::vector<std::string>& args, int master_port) {
  // A release written to a worker that has exited must not kill the driver.
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<WorkerGroup> group(new WorkerGroup());
  const int world = static_cast<int>(specs.size());
  for (int i = 0; i < world; ++i) {
    int report[2], release[2];
    if (pipe2(report, O_CLOEXEC) != 0 || pipe2(release, O_CLOEXEC) != 0) {
      return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    Worker w;
    w.name = specs[i].name;
    w.report_fd = MoveHigh(report[0]);
    w.release_fd = MoveHigh(release[1]);
    const int child_report = MoveHigh(report[1]);
    const int child_release = MoveHigh(release[0]);

    std::vector<std::string> argv_s = {"/proc/self/exe"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    argv_s.push_back(absl::StrCat("--worker=", i));
    std::vector<std::string> env_s = WorkerEnv(specs[i], world, master_port);
    std::vector<char*> argv = Pointers(argv_s), env = Pointers(env_s);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, child_report, kReportFd);
    posix_spawn_file_actions_adddup2(&fa, child_release, kReleaseFd);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    const int rc = posix_spawn(&w.pid, "/proc/self/exe", &fa, &attr, argv.data(), env.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(child_report);
    close(child_release);
    if (rc != 0) {
      close(w.report_fd);
      close(w.release_fd);
      return absl::InternalError(
          absl::StrCat("posix_spawn of worker '", w.name, "': ", std::strerror(rc)));
    }
    group->workers_.push_back(std::move(w));  // the destructor reaps it from now on
  }
  return group;
}

WorkerGroup::~WorkerGroup() {
  KillAll();
  for (auto& w : workers_) {
    if (!w.exited && w.pid > 0) waitpid(w.pid, &w.status, 0);
    if (w.report_fd >= 0) close(w.report_fd);
    if (w.release_fd >= 0) close(w.release_fd);
  }
}

void WorkerGroup::Release(int w) {
  const int fd = workers_[w].release_fd;
  if (fd < 0) return;
  const char byte = 'g';
  ssize_t n;
  do {
    n = write(fd, &byte, 1);
  } while (n < 0 && errno == EINTR);
}

void WorkerGroup::ReleaseAll() {
  for (int w = 0; w < size(); ++w) Release(w);
}

void WorkerGroup::CloseReleases() {
  for (auto& w : workers_) {
    if (w.release_fd >= 0) close(w.release_fd);
    w.release_fd = -1;
  }
}

void WorkerGroup::KillAll() {
  for (auto& w : workers_) {
    if (!w.exited && w.pid > 0) kill(w.pid, SIGKILL);
  }
}

absl::Status WorkerGroup::Wait(absl::Duration timeout, absl::Duration grace,
                               const std::function<void(int, const std::string&)>& on_line) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Time kill_at = absl::InfiniteFuture();
  bool failed = false, timed_out = false;
  std::vector<std::string> errors;
  auto deliver = [&](int i, std::string line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    on_line(i, line);
  };
  while (true) {
    // Reap.
    for (auto& w : workers_) {
      if (w.exited) continue;
      int status = 0;
      if (waitpid(w.pid, &status, WNOHANG) == w.pid) {
        w.exited = true;
        w.status = status;
        if (Failed(status)) {
          failed = true;
          errors.push_back(
              absl::StrCat("worker '", w.name, "' (pid ", w.pid, "): ", Describe(status)));
        }
      }
    }
    bool running = false;
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int i = 0; i < size(); ++i) {
      running = running || !workers_[i].exited;
      if (workers_[i].report_fd >= 0) {
        fds.push_back(pollfd{workers_[i].report_fd, POLLIN, 0});
        who.push_back(i);
      }
    }
    if (!running && fds.empty()) break;
    // Read what is there (a worker's pipe reaches EOF at its exit).
    if (!fds.empty()) {
      if (poll(fds.data(), fds.size(), 50) > 0) {
        for (size_t k = 0; k < fds.size(); ++k) {
          if (fds[k].revents == 0) continue;
          Worker& w = workers_[who[k]];
          char buf[65536];
          const ssize_t n = read(w.report_fd, buf, sizeof(buf));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            close(w.report_fd);
            w.report_fd = -1;
            if (!w.partial.empty()) deliver(who[k], std::move(w.partial));
            w.partial.clear();
            continue;
          }
          w.partial.append(buf, n);
          size_t start = 0, nl;
          while ((nl = w.partial.find('\n', start)) != std::string::npos) {
            deliver(who[k], w.partial.substr(start, nl - start));
            start = nl + 1;
          }
          w.partial.erase(0, start);
        }
      }
    } else {
      usleep(50 * 1000);
    }
    const absl::Time now = absl::Now();
    if (failed && kill_at == absl::InfiniteFuture()) {
      CloseReleases();  // workers blocked in WaitRelease() give up
      kill_at = now + grace;
    }
    if (now >= kill_at) KillAll();
    if (now >= deadline && !timed_out) {
      timed_out = true;
      std::vector<std::string> left;
      for (auto& w : workers_) {
        if (!w.exited) left.push_back(w.name);
      }
      if (!left.empty()) {
        errors.push_back(absl::StrCat("timed out after ", absl::FormatDuration(timeout),
                                      "; killed ", absl::StrJoin(left, ", ")));
        CloseReleases();
        KillAll();
      }
    }
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrJoin(errors, "; "));
}

WorkerChannel WorkerChannel::Open() {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) _exit(1);  // the driver died before the line above
  return WorkerChannel();
}

void WorkerChannel::Send(const std::string& line) {
  const std::string data = line + "\n";
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = write(kReportFd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the driver is gone; the death signal follows
    off += static_cast<size_t>(n);
  }
}

bool WorkerChannel::WaitRelease() {
  char byte;
  ssize_t n;
  do {
    n = read(kReleaseFd, &byte, 1);
  } while (n < 0 && errno == EINTR);
  return n == 1;
}

int WorkerIndex(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--worker=", 9) == 0) return std::atoi(argv[i] + 9);
  }
  return -1;
}

std::vector<std::string> ForwardedArgs(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--worker=", 9) != 0) out.emplace_back(argv[i]);
  }
  return out;
}

}  // namespace baton::bench
