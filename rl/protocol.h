// The agent/observer protocol as an observer sees it: AgentLink is how an
// observer reaches the agent (rl/reinforce_agent.h describes the protocol
// and its guarantees). Two links exist: over RPC (rl/observer.h,
// RpcAgentLink) and in process (rl/reinforce_agent.h,
// ReinforceAgent::LocalLink), so the same observer loop runs in a job and in
// a single-process test.
//
// Contract of every link: each call returns the agent's reply or its error
// unchanged (ABORTED: this session was dropped or left; join again), or
// DEADLINE_EXCEEDED / UNAVAILABLE when the agent cannot be reached in time.
//
// Thread-safety: a link may be used from one thread at a time.
#ifndef BATON_RL_PROTOCOL_H_
#define BATON_RL_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton::rl {

struct JoinReply {
  int64_t session = 0;
  int64_t round = 0;            // the round to play
  int64_t steps_per_round = 0;  // steps to play in it
  bool stop = false;            // training is over: leave
};

struct RoundReply {
  int64_t next_round = 0;
  bool stop = false;
};

class AgentLink {
 public:
  virtual ~AgentLink() = default;
  // May wait for the next round (or the first one) to start.
  virtual absl::StatusOr<JoinReply> Join(const std::string& observer) = 0;
  virtual absl::StatusOr<int64_t> Act(int64_t session, int64_t round, int64_t step,
                                      const std::vector<float>& observation) = 0;
  // Waits for the round's update.
  virtual absl::StatusOr<RoundReply> Finish(int64_t session, int64_t round,
                                            const std::vector<float>& rewards,
                                            const std::vector<int32_t>& episode_ends) = 0;
  virtual absl::Status Leave(int64_t session) = 0;
};

}  // namespace baton::rl

#endif  // BATON_RL_PROTOCOL_H_
