// An observer of an agent/observer reinforcement-learning job: it plays
// CartPole rounds for the agent (rl/reinforce_agent.h describes the
// protocol) and asks it for an action at every step.
//
//   auto link = rl::RpcAgentLink(*rpc_agent, {.agent = "agent"});
//   rl::CartPole env(seed);
//   auto result = rl::RunObserver(*link, env, {.name = rpc_agent->self().name});
//
// Contract of RunObserver():
// - It joins, then plays every round it is given: the environment is reset
//   at the start of each round and whenever an episode ends, one Act per
//   step, then Finish with the round's rewards and the steps on which
//   episodes ended. When the agent says stop, it leaves and returns; an
//   agent gone by then (the leave fails with UNAVAILABLE) counts as left.
// - If the agent dropped it (ABORTED: it was silent too long), it joins
//   again, as a new session, and goes on (`rejoins` counts this); its
//   unfinished round is lost, as the agent discarded it.
// - Any other error is returned with the round and step it happened at.
// - `quit`, when set, is polled at every step: returning true makes it leave
//   and return (CANCELLED).
//
// Thread-safety: RunObserver() uses the link and the environment from the
// calling thread only.
#ifndef BATON_RL_OBSERVER_H_
#define BATON_RL_OBSERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rl/cartpole.h"
#include "rl/protocol.h"
#include "rpc/agent.h"

namespace baton::rl {

struct RpcLinkOptions {
  std::string agent = "agent";  // the agent's worker name
  // Act's timeout; Join and Finish wait for rounds, up to wait_timeout.
  absl::Duration act_timeout = absl::Seconds(30);
  absl::Duration wait_timeout = absl::Minutes(10);
};

std::unique_ptr<AgentLink> RpcAgentLink(rpc::RpcAgent& agent, RpcLinkOptions options);

struct ObserverOptions {
  std::string name;             // how the agent's log names this observer
  bool record_latency = false;  // keep every Act's round-trip time
  std::function<bool()> quit;   // polled at every step
};

struct ObserverResult {
  int64_t rounds = 0;    // finished
  int64_t steps = 0;     // acted
  int64_t episodes = 0;  // ended within finished rounds
  int64_t rejoins = 0;
  std::vector<double> act_latency_us;  // with record_latency
};

absl::StatusOr<ObserverResult> RunObserver(AgentLink& link, CartPole& env,
                                           const ObserverOptions& options);

}  // namespace baton::rl

#endif  // BATON_RL_OBSERVER_H_
