// ReinforceAgent: the agent of an agent/observer reinforcement-learning job.
// It owns the policy (rl/policy.h) and trains it with REINFORCE; observers
// run environments and ask it for an action at every step. Observers may
// join at any time and may die at any time.
//
//   auto agent = rl::ReinforceAgent::Create(options, rpc_agent->executor(), &timer).value();
//   agent->Register(registry);             // before the RPC agent serves
//   agent->WaitStopped(absl::Minutes(10));  // solved, out of episodes, or Stop()
//   agent->WaitAllLeft(absl::Seconds(30));
//
// The observer's side is rl/observer.h; the wire functions are in
// rl/internal/functions.h. The bookkeeping of the protocol (members, rounds,
// deadlines, counting, stopping) is rl::Rounds (rl/rounds.h), which the
// agent holds under its lock; the agent itself does the RPC side: replies,
// batching, the update, and one timer set to Rounds' next deadline.
//
// The protocol, in rounds (as in the peer, PyTorch's async-execution
// tutorial): in round k every member plays exactly steps_per_round steps
// (resetting its environment whenever an episode ends), asking for one action
// per step; when every member finished its steps (or was dropped), the agent
// makes one REINFORCE update from the members' steps and round k+1 starts.
//
// Guarantees (tested by name in tests/rl/reinforce_agent_test.cc, and the
// bookkeeping's part on a fake clock in tests/rl/rounds_test.cc):
// R1 Rounds. The policy does not change during a round: every action of
//    round k comes from the parameters after update k-1. Update k uses
//    exactly the steps of the members that finished round k, each once.
// R2 REINFORCE. Update k minimizes sum over members and steps of
//    -log pi(a_t | s_t) * G_t, divided by the number of members, with G
//    normalized per episode (rl/returns.h) and log pi computed with the
//    dropout masks the actions were drawn with (rl/policy.h), by one Adam
//    step. It equals that loss computed directly with LibTorch.
// R3 Batching. With `batched`, one forward pass answers every member waiting
//    for an action (rpc::Batcher; the batch size follows the number of
//    members still playing the round, and max_batch_delay bounds the wait
//    for one that is late). Without it, each request runs its own forward.
// R4 Dropping. A member that sends nothing for observer_timeout while the
//    round waits for it is dropped: its steps of the round are discarded, the
//    round goes on without it, and the log names it. Later calls with its
//    session fail with ABORTED ("dropped ... join again"). Leave() drops a
//    member at once.
// R5 Joining. Join() returns a new session. A join while a round runs is
//    admitted when the next round starts (the reply waits until then); the
//    first round waits for min_observers joins, at most first_round_wait
//    after the first one.
// R6 Stopping. Training stops when the running reward exceeds
//    solve_threshold (solved), when max_episodes episodes were counted, or on
//    Stop(): the round's Finish replies say stop, joins are answered with
//    stop, and WaitStopped() returns.
// R7 Bad input. A call with an unknown session, a round or step that is not
//    the member's next one, an observation that is not 4 finite floats, or
//    rewards and episode ends that do not describe steps_per_round steps
//    fails with INVALID_ARGUMENT or FAILED_PRECONDITION naming the observer,
//    and changes nothing.
//
// Counting (as in the peer): every episode that ends within a round updates
// the running reward (rl/returns.h), members in session order, then in time
// order; an episode cut by the end of a round is trained on but not
// counted.
//
// Thread-safety: all methods are safe for concurrent use. Batches of acts
// and updates run on the executor given to Create(), never on a timer
// thread. No callback (set_log, set_on_round, a future's continuation) runs
// under the agent's lock. `executor` and `timer` must outlive the agent's use
// (Close() first).
#ifndef BATON_RL_REINFORCE_AGENT_H_
#define BATON_RL_REINFORCE_AGENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rl/protocol.h"
#include "rpc/executor.h"
#include "rpc/function.h"
#include "rpc/future.h"
#include "rpc/timer.h"

namespace baton::rl {

struct ReinforceOptions {
  int64_t steps_per_round = 500;
  double gamma = 0.99;
  double lr = 1e-2;  // Adam
  uint64_t seed = 0;
  bool batched = true;
  absl::Duration max_batch_delay = absl::Milliseconds(5);
  int min_observers = 1;
  absl::Duration first_round_wait = absl::Seconds(60);
  absl::Duration observer_timeout = absl::Seconds(5);
  double solve_threshold = 475.0;
  int64_t max_episodes = 0;  // 0: no limit
};

// One line of progress, after each update.
struct RoundSummary {
  int64_t round = 0;
  int64_t members = 0;   // observers whose steps went into the update
  int64_t episodes = 0;  // counted so far
  double running_reward = 0;
  double seconds = 0;      // since the first round began
  double steps_per_s = 0;  // all observers, since the first round began
  double mean_batch = 0;   // requests per forward pass, this round
  double update_ms = 0;
  int64_t observers_alive = 0;  // members and waiting joiners
  int64_t dropped = 0;          // so far
  int64_t solved_at = -1;       // the episode at which it was solved
};

struct ReinforceStats {
  int64_t rounds = 0;
  int64_t episodes = 0;
  double running_reward = 0;
  int64_t solved_at = -1;
  double solved_reward = 0;  // the running reward at solved_at
  int64_t steps = 0;         // env steps acted on, all rounds
  int64_t forwards = 0;
  int64_t joined = 0;
  int64_t dropped = 0;
  int64_t left = 0;
  int64_t alive = 0;
  double seconds = 0;  // since the first round began
  // Episodes counted per session (who contributed).
  std::vector<std::pair<int64_t, int64_t>> episodes_by_session;
};

class ReinforceAgent {
 public:
  // REQUIRES: steps_per_round >= 1, 0 < gamma <= 1, lr > 0,
  // min_observers >= 1; executor and timer non-null. INVALID_ARGUMENT else.
  static absl::StatusOr<std::shared_ptr<ReinforceAgent>> Create(ReinforceOptions options,
                                                                rpc::Executor* executor,
                                                                rpc::DeadlineTimer* timer);
  ~ReinforceAgent();

  // Registers baton.rl.{join,act,finish,leave} (rl/internal/functions.h).
  absl::Status Register(rpc::FunctionRegistry& registry);

  // The protocol, callable in process (the registered functions call these).
  rpc::Future<JoinReply> Join(const std::string& observer);
  rpc::Future<int64_t> Act(int64_t session, int64_t round, int64_t step, std::vector<float> obs,
                           absl::Time deadline = absl::InfiniteFuture());
  rpc::Future<RoundReply> Finish(int64_t session, int64_t round, std::vector<float> rewards,
                                 std::vector<int32_t> episode_ends);
  absl::Status Leave(int64_t session);

  // Ends training (R6) with `reason` in the log.
  void Stop(const std::string& reason);
  // True once training stopped; false at the timeout.
  bool WaitStopped(absl::Duration timeout);
  // True once no session is alive (all left or were dropped).
  bool WaitAllLeft(absl::Duration timeout);

  // Called after every update, on the executor, without the agent's lock.
  void set_on_round(std::function<void(const RoundSummary&)> fn);
  // Log lines (joins, drops, stop); stderr by default. Called without the
  // agent's lock, on the thread whose call made the line (a caller, the
  // executor or the timer thread), so possibly on several threads at once:
  // it must be thread-safe, and may call the agent. The lines of one event
  // come in order, and before the replies that reveal the event. Null: no
  // log.
  void set_log(std::function<void(const std::string&)> fn);

  ReinforceStats stats() const;
  // Copies of the policy's parameters (rl/policy.h's order).
  std::vector<at::Tensor> parameters() const;

  // An in-process AgentLink (rl/protocol.h) to this agent: each call waits
  // up to `timeout` for its reply.
  static std::unique_ptr<AgentLink> LocalLink(std::shared_ptr<ReinforceAgent> agent,
                                              absl::Duration timeout);

  // Fails what waits (CANCELLED) and stops the silence checks.
  void Close();

 private:
  class Impl;
  explicit ReinforceAgent(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace baton::rl

#endif  // BATON_RL_REINFORCE_AGENT_H_
