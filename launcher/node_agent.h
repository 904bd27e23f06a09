// NodeAgent: the part of baton-run that runs on each node. It rendezvouses
// with the other nodes (see rendezvous.h), starts this node's workers with
// their environment (env/env.h's contract, built in
// internal/worker_group.cc), watches them, and on a failure stops the
// group on every node and starts it again, until --max_restarts runs out;
// then it prints a summary of the first failure and fails.
//
// Processes: workers are started from the thread that calls Run() (it must
// be the main thread; see internal/process.h), each as the leader of its own
// process group with PR_SET_PDEATHSIG(SIGKILL). Stopping sends the stop
// signal to the group, waits --stop_timeout, then sends SIGKILL. When a
// worker exits, what is left of its process group is killed at once, so no
// descendant outlives its worker (descendants that leave the group, e.g.
// daemons calling setsid(), are outside this guarantee).
//
// Threading: Run() is called once, from the main thread; RequestStop() may
// be called from any thread (baton-run calls it from its signal thread).
#ifndef BATON_LAUNCHER_NODE_AGENT_H_
#define BATON_LAUNCHER_NODE_AGENT_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "launcher/options.h"

namespace baton::launcher {

// Exit codes of baton-run.
inline constexpr int kExitSuccess = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

class NodeAgent {
 public:
  // `job_token`: from ResolveJobToken (launcher/options.h): required when
  // the job spans nodes, and checked by the rendezvous store; empty in a
  // one-node job makes the agent create one, which reaches the workers
  // through their environment only (never through a store).
  NodeAgent(LaunchOptions options, std::string job_token);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Runs the job to its end and returns baton-run's exit code: 0 when every
  // worker of one round exited 0, 128+N when stopped by signal N, 1
  // otherwise (the reason is printed to stderr).
  int Run();

  // Asks Run() to stop: the workers get `signal`, then SIGKILL after the
  // grace period. A second request cuts the grace period short.
  void RequestStop(int signal);

  // Writes the state report of this node's workers (who waits on whom;
  // obs/state.h) to stderr and as JSON beside the logs, soon, from another
  // thread (baton-run calls it on SIGUSR1).
  void RequestStateReport();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::launcher

#endif  // BATON_LAUNCHER_NODE_AGENT_H_
