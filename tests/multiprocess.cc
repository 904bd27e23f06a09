#include "tests/multiprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace baton::testing {
namespace {

std::map<std::string, Scenario>& Scenarios() {
  static auto* m = new std::map<std::string, Scenario>();
  return *m;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

bool RegisterScenario(const std::string& name, Scenario fn) {
  Scenarios()[name] = std::move(fn);
  return true;
}

int MaybeRunScenario(int argc, char** argv) {
  const std::string flag = "--baton_scenario=";
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], flag)) {
      const std::string name = std::string(argv[i]).substr(flag.size());
      auto it = Scenarios().find(name);
      if (it == Scenarios().end()) {
        std::fprintf(stderr, "unknown scenario %s\n", name.c_str());
        return 3;
      }
      const int code = it->second();
      std::fflush(stdout);
      std::fflush(stderr);
      return code;
    }
  }
  return -1;
}

namespace {

std::vector<WorkerResult> RunWorkersOnce(const std::string& scenario, int world_size,
                                         absl::Duration timeout,
                                         const std::map<std::string, std::string>& extra_env) {
  const int port = FreePort();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  std::vector<WorkerResult> results(world_size);
  std::vector<pid_t> pids(world_size, -1);
  std::vector<std::string> logs(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      const auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["RANK"] = std::to_string(rank);
    env["WORLD_SIZE"] = std::to_string(world_size);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port);
    for (const auto& [k, v] : extra_env) env[k] = v;
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);

    logs[rank] = absl::StrCat(dir, "/", scenario, ".", getpid(), ".", rank, ".log");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, logs[rank].c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    std::string self = "/proc/self/exe";
    std::string arg = "--baton_scenario=" + scenario;
    char* argv[] = {self.data(), arg.data(), nullptr};
    if (posix_spawn(&pids[rank], "/proc/self/exe", &actions, &attr, argv, envp.data()) != 0) {
      pids[rank] = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  const absl::Time deadline = absl::Now() + timeout;
  int remaining = 0;
  for (int r = 0; r < world_size; ++r) {
    results[r].rank = r;
    if (pids[r] > 0) ++remaining;
  }
  bool killed = false;
  while (remaining > 0) {
    for (int r = 0; r < world_size; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      const pid_t got = waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
        pids[r] = -1;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (!killed && absl::Now() > deadline) {
      for (int r = 0; r < world_size; ++r) {
        if (pids[r] > 0) {
          results[r].timed_out = true;
          kill(pids[r], SIGKILL);
        }
      }
      killed = true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (int r = 0; r < world_size; ++r) {
    results[r].output = ReadFile(logs[r]);
    unlink(logs[r].c_str());
  }
  return results;
}

}  // namespace

std::vector<WorkerResult> RunWorkers(const std::string& scenario, int world_size,
                                     absl::Duration timeout,
                                     const std::map<std::string, std::string>& extra_env) {
  // The port was free when chosen; another test running at the same time
  // may bind it first. Rank 0 then cannot serve the store: run again on a
  // new port (nothing else is retried).
  std::vector<WorkerResult> results;
  for (int attempt = 0; attempt < 3; ++attempt) {
    results = RunWorkersOnce(scenario, world_size, timeout, extra_env);
    if (results.empty() ||
        results[0].output.find("store server could not listen on") == std::string::npos) {
      break;
    }
  }
  return results;
}

std::string Describe(const std::vector<WorkerResult>& results) {
  std::string out;
  for (const auto& r : results) {
    absl::StrAppend(&out, "---- rank ", r.rank, ": exit ", r.exit_code, " signal ", r.signal,
                    r.timed_out ? " TIMED OUT" : "", "\n", r.output, "\n");
  }
  return out;
}

}  // namespace baton::testing
