#include "launcher/internal/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"

namespace baton::launcher::internal {
namespace {

bool IsExecutable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

absl::StatusOr<std::string> Resolve(const std::string& program,
                                    const std::vector<std::string>& env) {
  if (program.empty()) return absl::InvalidArgumentError("empty program name");
  if (absl::StrContains(program, "/")) {
    if (IsExecutable(program)) return program;
    return absl::NotFoundError(
        absl::StrCat("program '", program, "' does not exist or is not executable"));
  }
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const std::string& kv : env) {
    if (absl::StartsWith(kv, "PATH=")) path = kv.substr(5);
  }
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", program);
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("program '", program, "' not found in PATH"));
}

}  // namespace

absl::StatusOr<SpawnedProcess> Spawn(const SpawnRequest& request) {
  if (request.argv.empty()) return absl::InvalidArgumentError("empty argv");
  ASSIGN_OR_RETURN(auto exe, Resolve(request.argv[0], request.env));

  // Everything the child needs is prepared before fork: after fork only
  // async-signal-safe calls are allowed (the launcher has gRPC threads).
  std::vector<char*> argv, envp;
  for (const auto& a : request.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : request.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  sigset_t empty;
  sigemptyset(&empty);

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(e)));
  }
  if (pid == 0) {
    // Child. Own process group, so a stop signal reaches its descendants and
    // a Ctrl-C on the terminal reaches only the launcher (which forwards it).
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // The launcher already died.
    // Undo the launcher's signal setup.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD}) {
      ::signal(sig, SIG_DFL);
    }
    ::sigprocmask(SIG_SETMASK, &empty, nullptr);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::execve(exe.c_str(), argv.data(), envp.data());
    const char msg[] = "baton-run: exec failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  // Parent: also set the group here, so a stop that comes before the child
  // ran setpgid still reaches it.
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  return SpawnedProcess{pid, out[0], err[0]};
}

std::string SignalName(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev == nullptr ? absl::StrCat("signal ", signal) : absl::StrCat("SIG", abbrev);
}

std::string ExitInfo::Describe() const {
  if (exited) return absl::StrCat("exit code ", exit_code);
  return absl::StrCat("signal ", signal, " (", SignalName(signal), ")");
}

bool TryReap(pid_t pid, ExitInfo* info) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  info->time = absl::Now();
  if (r < 0) {  // Not our child any more (should not happen): treat as lost.
    info->exited = false;
    info->signal = SIGKILL;
    return true;
  }
  if (WIFEXITED(status)) {
    info->exited = true;
    info->exit_code = WEXITSTATUS(status);
  } else {
    info->exited = false;
    info->signal = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
  }
  return true;
}

void SignalGroup(pid_t pgid, int signal) {
  if (pgid > 0) ::kill(-pgid, signal);
}

}  // namespace baton::launcher::internal
