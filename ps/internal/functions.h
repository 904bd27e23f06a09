// The parameter server's remote functions, shared by PsServer and PsClient.
// Internal to //ps. Argument lists are positional (see ps/server.h for
// what each returns); every request names the trainer and its clock.
//
// Thread-safety: constants.
#ifndef BATON_PS_INTERNAL_FUNCTIONS_H_
#define BATON_PS_INTERNAL_FUNCTIONS_H_

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

#include "rpc/function.h"

namespace baton::ps::internal {

using Names = std::vector<std::string>;
using Tensors = std::vector<at::Tensor>;

// (trainer, spec fingerprint) -> (the clock it continues from, its session).
inline const rpc::Function<std::tuple<int64_t, int64_t>(int32_t, std::string)> kJoinFn(
    "baton.ps.join");
// (trainer, tables, flat chunks) -> number of tables this call initialized.
inline const rpc::Function<int64_t(int32_t, Names, Tensors)> kInitFn("baton.ps.init_dense");
// (trainer, session, clock, tables, ids or undefined) -> (staleness, values).
inline const rpc::Function<std::tuple<int64_t, Tensors>(int32_t, int64_t, int64_t, Names,
                                                        Tensors)>
    kPullFn("baton.ps.pull");
// (trainer, session, clock, end_clock, tables, ids or undefined, gradients)
// -> clock.
inline const rpc::Function<int64_t(int32_t, int64_t, int64_t, bool, Names, Tensors, Tensors)>
    kPushFn("baton.ps.push");
// () -> (table names, counters): ps/server.cc packs ShardStats.
inline const rpc::Function<std::tuple<Names, std::vector<int64_t>>()> kStatsFn("baton.ps.stats");
// () -> path of the checkpoint written.
inline const rpc::Function<std::string()> kCheckpointFn("baton.ps.checkpoint");

}  // namespace baton::ps::internal

#endif  // BATON_PS_INTERNAL_FUNCTIONS_H_
