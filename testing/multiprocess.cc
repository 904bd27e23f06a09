#include "testing/multiprocess.h"

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
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "testing/eventually.h"
#include "testing/fork_server.h"

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

namespace {

int RunScenario(const std::string& name) {
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

}  // namespace

int MaybeRunScenario(int argc, char** argv) {
  const std::string flag = "--baton_scenario=";
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], flag))
      return RunScenario(std::string(argv[i]).substr(flag.size()));
    if (std::strcmp(argv[i], kForkServerFlag) == 0) RunForkServer(&RunScenario);
  }
  return -1;
}

namespace {

// The test process's fork server (testing/fork_server.h), started on the first
// RunWorkers; null where it cannot be used, and then workers are spawned.
ForkServer* Server() {
  static ForkServer* const server = []() -> ForkServer* {
    const char* off = std::getenv("BATON_TEST_NO_FORK_SERVER");
    if (off != nullptr && std::string(off) == "1") return nullptr;
    absl::StatusOr<std::unique_ptr<ForkServer>> started = ForkServer::Start();
    if (!started.ok()) {
      std::fprintf(stderr, "multiprocess: spawning workers (%s)\n",
                   started.status().ToString().c_str());
      return nullptr;
    }
    return started->release();  // lives as long as the test process
  }();
  return server;
}

// Appends every thread's stack of the live worker `pid` to its log, through
// gdb when the machine has it (tools/install_deps.sh installs it): a timed-out
// run then shows where each worker waited. Bounded: gdb is killed after 60 s.
void AppendStacks(pid_t pid, const std::string& log) {
  static const char* const kGdb = "/usr/bin/gdb";
  {
    std::ofstream out(log, std::ios::app);
    out << "\n[multiprocess] timed out; the stacks of worker pid " << pid
        << (access(kGdb, X_OK) == 0 ? " follow\n" : " are not shown: no /usr/bin/gdb\n");
  }
  if (access(kGdb, X_OK) != 0) return;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const std::string pid_text = std::to_string(pid);
  std::vector<std::string> args = {"gdb", "-nx",    "-q",  "-batch",
                                   "-p",  pid_text, "-ex", "thread apply all bt"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t gdb = -1;
  if (posix_spawn(&gdb, kGdb, &actions, nullptr, argv.data(), environ) == 0) {
    int status = 0;
    if (!Eventually([&] { return waitpid(gdb, &status, WNOHANG) != 0; }, absl::Seconds(60))) {
      kill(gdb, SIGKILL);
      waitpid(gdb, &status, 0);
    }
  }
  posix_spawn_file_actions_destroy(&actions);
}

// Runs the workers through the fork server: the same results as spawning
// them, or an error (the server went away) before any worker started.
absl::Status RunThroughServer(ForkServer& server, const std::string& scenario,
                              const std::vector<std::map<std::string, std::string>>& envs,
                              const std::vector<std::string>& logs, absl::Duration timeout,
                              std::vector<WorkerResult>& results) {
  std::map<pid_t, int> rank_of;
  for (size_t rank = 0; rank < envs.size(); ++rank) {
    absl::StatusOr<pid_t> pid = server.Spawn(scenario, logs[rank], envs[rank]);
    if (!pid.ok()) {
      for (const auto& [p, r] : rank_of) server.Kill(p).IgnoreError();
      if (rank_of.empty()) return pid.status();
      results[rank].output = pid.status().ToString();
      continue;
    }
    rank_of[*pid] = static_cast<int>(rank);
  }
  absl::Time deadline = absl::Now() + timeout;
  bool killed = false;
  while (!rank_of.empty()) {
    pid_t pid = -1;
    int status = 0;
    absl::StatusOr<bool> exited = server.WaitExit(deadline, &pid, &status);
    if (!exited.ok()) {
      for (const auto& [p, r] : rank_of) {
        results[r].output = absl::StrCat("fork server: ", exited.status().ToString(), "\n");
      }
      return absl::OkStatus();
    }
    if (*exited) {
      auto it = rank_of.find(pid);
      if (it == rank_of.end()) continue;  // a worker of an earlier run, killed then
      if (WIFEXITED(status)) results[it->second].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) results[it->second].signal = WTERMSIG(status);
      rank_of.erase(it);
      continue;
    }
    if (killed) {  // killed and still not reported: give up on them
      for (const auto& [p, r] : rank_of) results[r].output = "not reaped after SIGKILL\n";
      return absl::OkStatus();
    }
    for (const auto& [p, r] : rank_of) AppendStacks(p, logs[r]);
    for (const auto& [p, r] : rank_of) {
      results[r].timed_out = true;
      server.Kill(p).IgnoreError();
    }
    killed = true;
    deadline = absl::Now() + absl::Seconds(30);
  }
  return absl::OkStatus();
}

std::vector<WorkerResult> RunWorkersOnce(const std::string& scenario, int world_size,
                                         absl::Duration timeout,
                                         const std::map<std::string, std::string>& extra_env) {
  const int port = FreePort();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  std::vector<WorkerResult> results(world_size);
  for (int r = 0; r < world_size; ++r) results[r].rank = r;
  std::vector<pid_t> pids(world_size, -1);
  std::vector<std::string> logs(world_size);
  std::vector<std::map<std::string, std::string>> envs(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    std::map<std::string, std::string>& env = envs[rank];
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
    logs[rank] = absl::StrCat(dir, "/", scenario, ".", getpid(), ".", rank, ".log");
  }
  if (ForkServer* server = Server();
      server != nullptr && RunThroughServer(*server, scenario, envs, logs, timeout, results).ok()) {
    for (int r = 0; r < world_size; ++r) {
      results[r].output += ReadFile(logs[r]);
      unlink(logs[r].c_str());
    }
    return results;
  }
  for (int rank = 0; rank < world_size; ++rank) {
    const std::map<std::string, std::string>& env = envs[rank];
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);

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
  int remaining = 0;
  for (int r = 0; r < world_size; ++r) {
    if (pids[r] > 0) ++remaining;
  }
  // Reaps the workers that exited; true once none is left.
  auto reap = [&] {
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
    return remaining == 0;
  };
  bool unreaped = false;
  if (!Eventually(reap, timeout)) {
    for (int r = 0; r < world_size; ++r) {
      if (pids[r] > 0) AppendStacks(pids[r], logs[r]);
    }
    for (int r = 0; r < world_size; ++r) {
      if (pids[r] > 0) {
        results[r].timed_out = true;
        kill(pids[r], SIGKILL);
      }
    }
    unreaped = !Eventually(reap, absl::Seconds(30));
  }
  for (int r = 0; r < world_size; ++r) {
    results[r].output = ReadFile(logs[r]);
    if (unreaped && pids[r] > 0) results[r].output += "not reaped after SIGKILL\n";
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
