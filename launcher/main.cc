// baton-run: starts a baton job's workers on this node. See launcher/README.md
// and `baton-run --help`.
//
// Signals: SIGINT, SIGTERM, SIGHUP and SIGQUIT are blocked in every thread
// and taken by one signal thread, which asks the agent to stop; the agent
// forwards the signal to the workers, waits --stop_timeout, then kills them.
// SIGUSR1, taken by the same thread, asks for the state report (who waits
// on whom, docs/observability.md); the workers do not see it.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "env/env.h"
#include "launcher/internal/state_report.h"
#include "launcher/node_agent.h"
#include "launcher/options.h"

int main(int argc, char** argv) {
  using baton::launcher::LaunchUsage;
  std::vector<std::string> args(argv + 1, argv + argc);
  auto options = baton::launcher::ParseLaunchOptions(
      args, [](absl::string_view name) -> std::optional<std::string> {
        const char* v = std::getenv(std::string(name).c_str());
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      });
  if (!options.ok()) {
    std::fprintf(stderr, "baton-run: error: %s\n\n%s",
                 std::string(options.status().message()).c_str(), LaunchUsage().c_str());
    return baton::launcher::kExitUsage;
  }
  if (options->help) {
    std::fputs(LaunchUsage().c_str(), stdout);
    return 0;
  }
  if (!options->dump_run_id.empty()) {
    return baton::launcher::internal::DumpState(options->dump_run_id);
  }

  // Block the stop signals before any thread exists so that every thread
  // inherits the mask; workers get a clean mask at exec.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1}) {
    sigaddset(&stop_signals, sig);
  }
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto token = baton::launcher::ResolveJobToken(*options, std::getenv(baton::kEnvJobToken));
  if (!token.ok()) {
    std::fprintf(stderr, "baton-run: error: %s\n", std::string(token.status().message()).c_str());
    return baton::launcher::kExitUsage;
  }
  baton::launcher::NodeAgent agent(*std::move(options), *std::move(token));
  std::atomic<bool> done{false};
  std::thread signals([&] {
    const timespec period = {0, 200 * 1000 * 1000};
    while (!done.load()) {
      int sig = sigtimedwait(&stop_signals, nullptr, &period);
      if (sig == SIGUSR1) {
        agent.RequestStateReport();
      } else if (sig > 0) {
        agent.RequestStop(sig);
      }
    }
  });
  const int code = agent.Run();
  done.store(true);
  signals.join();
  return code;
}
