// The pipeline runtime's remote functions (pipeline/pipeline.h describes the
// protocol), shared by Pipeline (the driver) and StageServer. Internal to
// //pipeline.
//
// Thread-safety: constants.
#ifndef BATON_PIPELINE_INTERNAL_FUNCTIONS_H_
#define BATON_PIPELINE_INTERNAL_FUNCTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

#include "rpc/function.h"

namespace baton::pipeline::internal {

// (schedule name, {workers, microbatches, chunks, this worker}, actions as
// (kind, microbatch, stage) triples, cut points, optimizer options
// (dist_optim::EncodeOptions), batch size, stage worker names, state file to
// restore or "") -> steps taken.
inline const rpc::Function<int64_t(std::string, std::vector<int64_t>, std::vector<int64_t>,
                                   std::vector<int64_t>, std::string, int64_t,
                                   std::vector<std::string>, std::string)>
    kConfigureFn("baton.pipeline.configure");

// (losses per micro-batch, events as (kind, microbatch, stage, start us,
// end us) quintuples, peak stash, compute us, optimizer us).
using StepReply = std::tuple<std::vector<double>, std::vector<double>, int64_t, double, double>;
// (step id, inputs or none, targets or none) -> the report.
inline const rpc::Function<StepReply(int64_t, std::optional<at::Tensor>,
                                     std::optional<at::Tensor>)>
    kRunStepFn("baton.pipeline.run_step");

// (step id, kind (0 activation, 1 gradient), receiving stage, microbatch, tensor).
inline const rpc::Function<void(int64_t, int64_t, int64_t, int64_t, at::Tensor)> kDeliverFn(
    "baton.pipeline.deliver");

// (step id, status code, message): the step fails with that status.
inline const rpc::Function<void(int64_t, int64_t, std::string)> kAbortFn("baton.pipeline.abort");

// (file) -> (): writes this worker's state there (atomically).
inline const rpc::Function<void(std::string)> kSaveFn("baton.pipeline.save");

// (stage) -> that stage's parameters.
inline const rpc::Function<std::vector<at::Tensor>(int64_t)> kParametersFn(
    "baton.pipeline.parameters");

// () -> (): releases StageServer::WaitForFinish().
inline const rpc::Function<void()> kFinishFn("baton.pipeline.finish");

}  // namespace baton::pipeline::internal

#endif  // BATON_PIPELINE_INTERNAL_FUNCTIONS_H_
