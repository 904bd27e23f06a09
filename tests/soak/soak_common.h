// Shared pieces of the soak job (soak_job.cc): its flags, the functions the
// roles call on each other, the remote-object class, the parameter-server
// spec, the failure classification and the leak measurements. Every role
// includes this header, so callers and callees agree on names and
// signatures.
//
// Roles (baton-run --role hub:1 --role ps:1 --role trainer:N): the hub
// (rank 0, serves the store) and the parameter server live for the whole
// job; trainers are killed and restarted. Only trainers call the hub and the
// PS, and the hub and PS call each other, never a trainer (a restarted
// trainer can be called by nobody: AgentOptions::restarts.rejoin).
#ifndef BATON_TESTS_SOAK_SOAK_COMMON_H_
#define BATON_TESTS_SOAK_SOAK_COMMON_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "env/env.h"
#include "ps/spec.h"
#include "rpc/agent.h"
#include "rref/rref.h"

namespace baton::soak {

struct Flags {
  // Seconds of mixed load, counted on the hub from the moment every trainer
  // said hello; then the hub tells the trainers to stop.
  int64_t duration_s = 75;
  // Seconds the hub waits after every trainer's first hello before it
  // measures its baseline (file descriptors): warm-up.
  int64_t warm_s = 3;
  // Pause between two iterations of a trainer (keeps the 2-core machine
  // usable for others; it is pacing, not synchronization).
  int64_t pace_ms = 10;
  // File descriptors a long-lived worker may have gained between the warm
  // baseline and the end. A restarted trainer talks to the hub and the PS
  // over a gRPC connection (one socket on each) where its first incarnation
  // used a shared-memory link (none), so up to one per trainer is expected;
  // the rest is margin.
  int64_t fd_slack = 8;
  // Every RPC of the workload uses this timeout.
  int64_t call_timeout_s = 15;
};

// --name=value flags; INVALID_ARGUMENT naming an unknown or malformed one.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv);

// What each role needs at hand.
struct Worker {
  Flags flags;
  LaunchEnv env;
  std::string name;  // "hub0", "ps0", "trainer1", ...
  std::shared_ptr<rpc::FunctionRegistry> registry;
  std::shared_ptr<rref::RRefService> rrefs;
  std::unique_ptr<rpc::RpcAgent> agent;
};

// Prints "[name] text @<Unix milliseconds>" on stdout, flushed (the driver
// reads these lines; the times order lines of different processes).
void Say(const std::string& who, const std::string& text);

// ---- Workload values ----

// A tag names the trainer incarnation an RRef value was made for:
// {rank, incarnation (BATON_RESTART_COUNT), sequence, kind}.
using Tag = std::vector<int64_t>;
at::Tensor TagTensor(const Tag& tag);
// The tag a tensor made by TagTensor carries; INVALID_ARGUMENT otherwise.
absl::StatusOr<Tag> TagOf(const at::Tensor& t);
std::string TagText(const Tag& tag);
inline constexpr int64_t kKindRemote = 1;  // remote(hub, make_fn)
inline constexpr int64_t kKindLent = 2;    // hub-owned, lent through the PS

// A remote object owned by the hub, one per trainer incarnation: it counts
// the adds it got and says whose it is.
class Accumulator {
 public:
  Accumulator(int64_t rank, int64_t incarnation) : rank_(rank), incarnation_(incarnation) {}
  // {rank, incarnation, adds so far (this one included)}.
  std::vector<int64_t> add(at::Tensor x);
  int64_t rank() const { return rank_; }
  int64_t incarnation() const { return incarnation_; }

 private:
  const int64_t rank_, incarnation_;
  absl::Mutex mu_;
  int64_t adds_ ABSL_GUARDED_BY(mu_) = 0;
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};
void RegisterAccumulator(rref::RRefService& rrefs);

// ---- Functions on the hub ----
// hello(rank, incarnation, pid): a trainer incarnation starts.
inline const rpc::Function<bool(int64_t, int64_t, int64_t)> hello_fn("soak.hello");
// tick(rank, incarnation, x) -> (stop, x + 1): the plain call of each step.
inline const rpc::Function<std::tuple<bool, at::Tensor>(int64_t, int64_t, at::Tensor)> tick_fn(
    "soak.tick");
// make(tag): the value of a remote() RRef owned by the hub.
inline const rpc::Function<at::Tensor(Tag)> make_fn("soak.make");
// lend(tag): an RRef the hub owns, forked to the PS (kept under the tag's
// key) and to the caller.
inline const rpc::Function<rref::RRef<at::Tensor>(Tag)> lend_fn("soak.lend");
// forward(x): tanh(x W1) on the hub, then W2 on the PS (nested call);
// recorded by distributed autograd when called inside a context.
inline const rpc::Function<at::Tensor(at::Tensor)> forward_fn("soak.forward");
// apply(context): SGD with the context's gradients on the hub and the PS;
// returns how many gradients were found (2 when backward reached both).
inline const rpc::Function<int64_t(int64_t)> apply_fn("soak.apply");
// done(rank, incarnation, counters): a trainer incarnation finished.
inline const rpc::Function<bool(int64_t, int64_t, std::vector<int64_t>)> done_fn("soak.done");

// ---- Functions on the PS ----
inline const rpc::Function<bool(std::string, rref::RRef<at::Tensor>)> keep_fn("soak.keep");
inline const rpc::Function<rref::RRef<at::Tensor>(std::string)> take_fn("soak.take");
inline const rpc::Function<at::Tensor(at::Tensor)> ps_forward_fn("soak.ps_forward");
inline const rpc::Function<int64_t(int64_t)> ps_apply_fn("soak.ps_apply");
// Drops every RRef still kept (lent to a trainer that died before taking it).
inline const rpc::Function<int64_t()> drop_kept_fn("soak.drop_kept");
// The PS's leak measurements (LeakState::ToVector), and the ids of RRefs it
// still holds.
inline const rpc::Function<std::vector<int64_t>()> ps_state_fn("soak.ps_state");
// confirmations(): the PS's death confirmations, (rank, Unix micros) pairs.
inline const rpc::Function<std::vector<int64_t>()> confirmations_fn("soak.confirmations");
// The hub is done with its checks: the PS may shut down.
inline const rpc::Function<bool()> finish_fn("soak.finish");

std::string KeepKey(const Tag& tag);

// What a trainer incarnation counts and reports in done().
enum Counter {
  kIterations,
  kCalls,
  kRemotes,
  kForks,
  kAccAdds,
  kAutogradSteps,
  kPsPushes,
  kPsPulls,
  kFailures,
  kNumCounters
};
inline constexpr const char* kCounterNames[kNumCounters] = {
    "iterations",     "calls",     "remotes",  "forks",   "acc_adds",
    "autograd_steps", "ps_pushes", "ps_pulls", "failures"};

// The parameter-server tables: a dense table of 64 KiB (its pulls and pushes
// take the same-host bulk segments) and a small embedding table.
ps::PsSpec MakeSpec(int num_trainers);

// ---- Failures ----
// Classifies an error seen by a worker:
//   "named/<CODE>/<worker>"  UNAVAILABLE naming a worker that can die (a
//                            trainer), or DEADLINE_EXCEEDED, ABORTED,
//                            RESOURCE_EXHAUSTED or CANCELLED naming any
//                            worker of the job;
//   "shutdown/<CODE>"        the agent is shutting down;
//   "UNEXPLAINED/<CODE>"     anything else: no named worker, another code, or
//                            UNAVAILABLE naming a worker that never dies.
std::string ClassifyFailure(const absl::Status& s, const std::vector<std::string>& mortal,
                            const std::vector<std::string>& everyone);
// Prints "[who] FAILURE op=<op> class=<class> msg=<message>" and returns the class.
std::string ReportFailure(const std::string& who, const std::string& op, const absl::Status& s,
                          const std::vector<std::string>& mortal,
                          const std::vector<std::string>& everyone);

// ---- Leaks ----
int64_t CountOpenFds();
// What this process's descriptors point to, counted by kind ("socket",
// "pipe", "anon_inode:[eventfd]", or the file's path).
using FdKinds = std::map<std::string, int64_t>;
FdKinds OpenFdKinds();
// "socket+2 anon_inode:[pidfd]+1": the kinds whose counts changed.
std::string FdDiff(const FdKinds& before, const FdKinds& after);

// One long-lived worker's leak measurements.
struct LeakState {
  int64_t rref_owned = 0, rref_held = 0, rref_early = 0, rref_unanswered = 0;
  int64_t contexts = 0;
  int64_t pending_outgoing = 0, running_incoming = 0, shm_busy_segments = 0;
  int64_t fds = 0;
  int64_t kept = 0;  // PS: RRefs still kept for a trainer
  // Ids of RRefs still held (worker, local pairs), for the hub to attribute.
  std::vector<int64_t> held_ids;

  static LeakState Measure(Worker& w, int64_t kept);
  std::vector<int64_t> ToVector() const;
  static LeakState FromVector(const std::vector<int64_t>& v);
  std::string ToString() const;
};

// Runs a role; returns the process exit code.
int RunHub(Worker& w);
int RunPs(Worker& w);
int RunTrainer(Worker& w);

// Names of the workers of the job, and of those that may die (trainers).
std::vector<std::string> AllNames(const LaunchEnv& env);
std::vector<std::string> TrainerNames(const LaunchEnv& env);

// Creates w.agent from the environment (calls bounded by the flags' call
// timeout, shutdown by 30 s) and attaches w.rrefs. Every peer death the
// agent confirms is printed as PEER_FAILURE with its class
// (ClassifyFailure) and passed to `on_death`.
absl::Status StartAgent(Worker& w, std::function<void(int peer)> on_death);
inline constexpr char kHub[] = "hub0";
inline constexpr char kPs[] = "ps0";

// Options of every call of the workload.
inline rpc::CallOptions CallTimeout(const Flags& f) {
  return rpc::CallOptions{absl::Seconds(f.call_timeout_s)};
}
// The smaller of the flag's timeout and what is left of a caller's deadline
// (for nested calls), at least 1 ms.
rpc::CallOptions NestedTimeout(const Flags& f, const rpc::CallContext& ctx);

}  // namespace baton::soak

#endif  // BATON_TESTS_SOAK_SOAK_COMMON_H_
