// The agent/observer protocol's remote functions (rl/reinforce_agent.h
// describes the protocol), shared by ReinforceAgent and the RPC AgentLink
// (rl/observer.h). Internal to //rl.
//
// Every request and reply is a struct whose fields travel by name in the
// order listed (BATON_CODEC_FIELDS, rpc/codec.h): a peer built with other
// fields is refused as an argument type mismatch, and a field that fails to
// decode is named in the error. Leave's reply carries nothing.
//
// Thread-safety: constants and plain values.
#ifndef BATON_RL_INTERNAL_FUNCTIONS_H_
#define BATON_RL_INTERNAL_FUNCTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "rpc/codec.h"
#include "rpc/function.h"

namespace baton::rl::internal {

struct JoinRequest {
  std::string observer;  // how the agent's log names it
  BATON_CODEC_FIELDS(JoinRequest, observer);
};

// rl::JoinReply on the wire.
struct JoinResponse {
  int64_t session = 0;
  int64_t round = 0;
  int64_t steps_per_round = 0;
  bool stop = false;
  BATON_CODEC_FIELDS(JoinResponse, session, round, steps_per_round, stop);
};

struct ActRequest {
  int64_t session = 0;
  int64_t round = 0;
  int64_t step = 0;
  std::vector<float> observation;
  BATON_CODEC_FIELDS(ActRequest, session, round, step, observation);
};

struct ActResponse {
  int64_t action = 0;
  BATON_CODEC_FIELDS(ActResponse, action);
};

struct FinishRequest {
  int64_t session = 0;
  int64_t round = 0;
  std::vector<float> rewards;         // one per step of the round
  std::vector<int32_t> episode_ends;  // the steps on which an episode ended
  BATON_CODEC_FIELDS(FinishRequest, session, round, rewards, episode_ends);
};

// rl::RoundReply on the wire.
struct FinishResponse {
  int64_t next_round = 0;
  bool stop = false;
  BATON_CODEC_FIELDS(FinishResponse, next_round, stop);
};

struct LeaveRequest {
  int64_t session = 0;
  BATON_CODEC_FIELDS(LeaveRequest, session);
};

inline const rpc::Function<JoinResponse(JoinRequest)> kJoinFn("baton.rl.join");
inline const rpc::Function<ActResponse(ActRequest)> kActFn("baton.rl.act");
inline const rpc::Function<FinishResponse(FinishRequest)> kFinishFn("baton.rl.finish");
inline const rpc::Function<void(LeaveRequest)> kLeaveFn("baton.rl.leave");

}  // namespace baton::rl::internal

#endif  // BATON_RL_INTERNAL_FUNCTIONS_H_
