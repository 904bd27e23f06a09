// LoopbackJob: a whole RPC job in one process for tests (test-only target
// //testing/rpc:loopback). Each worker is a real RpcAgent with its own
// registry; they rendezvous through one in-memory store and talk through one
// LoopbackNetwork, whose rules and Kill() inject faults at the transport.
//
//   LoopbackJobOptions o;
//   o.world_size = 3;
//   o.install = [](int rank, FunctionRegistry& r) { r.Register(add_fn, Add); };
//   auto job = LoopbackJob::Start(o).value();
//   job->agent(0).rpc_sync(2, add_fn, 1, 2);
//   job->network().Kill(2);
//   EXPECT_OK(job->ShutdownAll());
//
// Contract: Start() returns once every agent finished its rendezvous, or the
// first error of a worker that had no restart left (the agents already made
// are shut down). ShutdownAll() shuts
// the agents down concurrently, as separate processes would; a killed worker
// shuts down without the agreement, and its errors are not reported. A
// graceful shutdown waits for every worker, so after a kill pass
// graceful=false (else the survivors' barrier ends at shutdown_timeout with
// DEADLINE_EXCEEDED). The destructor shuts down what is left without the
// agreement.
//
// Thread-safety: agent(i) and network() may be used from any thread;
// Start/ShutdownAll from one thread.
#ifndef BATON_TESTING_RPC_LOOPBACK_JOB_H_
#define BATON_TESTING_RPC_LOOPBACK_JOB_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "rpc/agent.h"
#include "store/memory_store.h"
#include "testing/rpc/loopback_transport.h"

namespace baton::rpc::testing {

struct LoopbackJobOptions {
  int world_size = 2;
  // Names are name_prefix + rank.
  std::string name_prefix = "w";
  absl::Duration rpc_timeout = absl::Seconds(20);
  absl::Duration init_timeout = absl::Seconds(20);
  absl::Duration shutdown_timeout = absl::Seconds(10);
  // Registers worker `rank`'s functions (and protocol services) before its
  // agent is created.
  std::function<void(int rank, FunctionRegistry& registry)> install;
  // Adjusts worker `rank`'s options before its agent is created (e.g. flow
  // control limits).
  std::function<void(int rank, AgentOptions& options)> configure;
  // Runs once worker `rank`'s agent exists (e.g. RRefService::Attach).
  std::function<void(int rank, RpcAgent& agent)> attach;
  // Sees each rendezvous step of worker `rank`'s `start`-th start (0: the
  // first); a non-OK status makes that start fail there, as a process that
  // died at that step (AgentCollaborators::rendezvous_observer).
  std::function<absl::Status(int rank, int start, RendezvousStep step)> rendezvous_observer;
  // The clock of every agent's timer (AgentCollaborators::timer): a test's
  // testing::FakeClock moves the agents' call timeouts. Null: the real
  // clock. It must outlive the job.
  const Clock* clock = nullptr;
  // A worker whose start fails is started again, up to this many times,
  // with AgentOptions::restarts.rejoin, as baton-run's per-role restart does.
  int max_restarts = 0;
  // Where set, receives each rank's own result of Start, in rank order: OK,
  // or why its last start failed. It must outlive Start.
  std::vector<absl::Status>* start_results = nullptr;
};

class LoopbackJob {
 public:
  static absl::StatusOr<std::unique_ptr<LoopbackJob>> Start(LoopbackJobOptions options);
  ~LoopbackJob();

  RpcAgent& agent(int rank) { return *agents_[rank]; }
  int world_size() const { return static_cast<int>(agents_.size()); }
  LoopbackNetwork& network() { return *network_; }
  store::MemoryStore& store() { return *store_; }

  // Kills worker `rank` at the transport (LoopbackNetwork::Kill); its agent
  // object stays until ShutdownAll or the destructor, as a process's memory
  // would until it is reaped.
  absl::Status Kill(int rank);
  // Starts a new incarnation of worker `rank` that rejoins the running job
  // (AgentOptions::restarts.rejoin), as baton-run's per-role restart does, with a
  // new registry from `install` and then `attach`; agent(rank) is the new
  // one from then on. `kill_first` kills the old one first (a crash and
  // restart); false leaves it running beside the new one (a process that
  // was taken for dead). The old agent stays until ShutdownAll.
  absl::Status Restart(int rank, bool kill_first = true);
  // The first error of any worker's shutdown, naming the worker.
  absl::Status ShutdownAll(bool graceful = true);

 private:
  LoopbackJob() = default;
  // The options every agent of the job starts with.
  AgentOptions OptionsFor(int rank) const;
  // Starts worker `rank` (its `start`-th start), with its registry and
  // collaborators.
  absl::StatusOr<std::unique_ptr<RpcAgent>> StartOne(int rank, int start, bool rejoin);

  LoopbackJobOptions options_;

  // Declared first: destroyed after the agents that use it.
  std::unique_ptr<LoopbackNetwork> network_;
  std::shared_ptr<store::MemoryStore> store_;
  std::vector<std::unique_ptr<RpcAgent>> agents_;
  std::vector<bool> killed_;
  // Agents replaced by Restart (shut down first, without the agreement).
  std::vector<std::unique_ptr<RpcAgent>> replaced_;
};

}  // namespace baton::rpc::testing

#endif  // BATON_TESTING_RPC_LOOPBACK_JOB_H_
