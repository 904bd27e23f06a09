// The agent/observer protocol's remote functions (rl/reinforce_agent.h
// describes the protocol), shared by ReinforceAgent and ObserverClient.
// Internal to //rl.
//
// Thread-safety: constants.
#ifndef BATON_RL_INTERNAL_FUNCTIONS_H_
#define BATON_RL_INTERNAL_FUNCTIONS_H_

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "rpc/function.h"

namespace baton::rl::internal {

// (observer name) -> (session, round, steps per round, stop).
inline const rpc::Function<std::tuple<int64_t, int64_t, int64_t, bool>(std::string)> kJoinFn(
    "baton.rl.join");
// (session, round, step, observation) -> action.
inline const rpc::Function<int64_t(int64_t, int64_t, int64_t, std::vector<float>)> kActFn(
    "baton.rl.act");
// (session, round, rewards, episode ends) -> (next round, stop).
inline const rpc::Function<std::tuple<int64_t, bool>(int64_t, int64_t, std::vector<float>,
                                                     std::vector<int32_t>)>
    kFinishFn("baton.rl.finish");
// (session) -> ().
inline const rpc::Function<void(int64_t)> kLeaveFn("baton.rl.leave");

}  // namespace baton::rl::internal

#endif  // BATON_RL_INTERNAL_FUNCTIONS_H_
