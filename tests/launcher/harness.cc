#include "tests/launcher/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "testing/eventually.h"

extern char** environ;

namespace baton::launcher::testing {
std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/baton/", path);
}

std::string BatonRunPath() { return Runfile("launcher/baton-run"); }
std::string WorkerScriptPath() { return Runfile("tests/launcher/worker.sh"); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::map<std::string, std::string> ReadEnvFile(const std::string& path) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    out[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return out;
}

bool WaitForFile(const std::string& path, absl::Duration timeout) {
  return ::baton::testing::Eventually([&] { return FileExists(path); }, timeout);
}

bool WaitForPort(int port, absl::Duration timeout) {
  return ::baton::testing::Eventually(
      [&] {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr.sin_port = htons(static_cast<uint16_t>(port));
        const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
        ::close(fd);
        return up;
      },
      timeout);
}

std::vector<pid_t> ProcessesWithMarker(const std::string& marker) {
  const std::string needle = absl::StrCat("BATON_TEST_MARKER=", marker);
  std::vector<pid_t> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z') {
      continue;
    }
    std::string env = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    for (absl::string_view kv : absl::StrSplit(env, '\0')) {
      if (kv == needle) {
        out.push_back(pid);
        break;
      }
    }
  }
  ::closedir(proc);
  return out;
}

std::vector<pid_t> KillMarked(const std::string& marker) {
  std::vector<pid_t> alive = ProcessesWithMarker(marker);
  (void)::baton::testing::Eventually(
      [&] {
        for (pid_t p : alive) ::kill(p, SIGKILL);
        // Reap any that are our own children.
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }
        alive = ProcessesWithMarker(marker);
        return alive.empty();
      },
      absl::Seconds(5));
  return alive;
}

std::string NewMarker() {
  static std::atomic<int> counter{0};
  return absl::StrCat("t", ::getpid(), "_", counter++, "_", absl::ToUnixMicros(absl::Now()));
}

Launcher::Launcher(const std::string& marker, std::vector<std::string> args,
                   std::map<std::string, std::string> extra_env, std::vector<std::string> prefix) {
  output_path_ = absl::StrCat(MakeTempDir("launcher-output"), "/output.txt");
  std::vector<std::string> argv = prefix;
  argv.push_back(BatonRunPath());
  argv.insert(argv.end(), args.begin(), args.end());
  extra_env["BATON_TEST_MARKER"] = marker;
  // baton-run's private temporary directory: inside the test's, so that a
  // SIGKILLed launcher leaves nothing in /tmp.
  if (const char* tmp = std::getenv("TEST_TMPDIR"); tmp != nullptr && !extra_env.count("TMPDIR")) {
    extra_env["TMPDIR"] = tmp;
  }
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view kv(*e);
    if (!extra_env.count(std::string(kv.substr(0, kv.find('='))))) {
      env.emplace_back(kv);
    }
  }
  for (const auto& [k, v] : extra_env) env.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  int out = ::open(output_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::setpgid(0, 0);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    ::execve(cargv[0], cargv.data(), cenv.data());
    if (!absl::StrContains(cargv[0], "/")) ::execvpe(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);
  ::close(out);
}

Launcher::~Launcher() {
  if (!reaped_) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

int Launcher::Wait(absl::Duration timeout) {
  if (reaped_) return code_;
  int status = 0;
  if (!::baton::testing::Eventually([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; },
                                    timeout)) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    reaped_ = true;
    code_ = -1;
    return code_;
  }
  reaped_ = true;
  code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return code_;
}

void Launcher::Signal(int sig) {
  if (!reaped_) ::kill(pid_, sig);
}

std::string Launcher::Output() const { return ReadFile(output_path_); }

}  // namespace baton::launcher::testing
