// The pipeline runtime's remote functions and their messages
// (pipeline/pipeline.h describes the protocol), shared by the driver
// (pipeline/driver.h) and the stage server (pipeline/stage_server.h).
// Internal to //pipeline and its protocol tests.
//
// Contract: every message is a plain struct that travels as its listed
// fields (BATON_CODEC_FIELDS, rpc/codec.h), so a peer built with other
// fields is refused as an argument type mismatch and a field that fails to
// decode is named in the DATA_LOSS error. Decoding checks the encoding only:
// the receiver checks the values and names the field it refuses
// ("ConfigureRequest.workers is 0, not in [1, 65536]").
//
// Thread-safety: constants and plain values.
#ifndef BATON_PIPELINE_INTERNAL_FUNCTIONS_H_
#define BATON_PIPELINE_INTERNAL_FUNCTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "pipeline/schedule.h"
#include "rpc/codec.h"
#include "rpc/function.h"

namespace baton::pipeline::internal {

// Worker counts, micro-batches, stages: a configure request beyond this is
// refused (it bounds what a peer can make a stage server allocate).
inline constexpr int32_t kMaxCount = 1 << 16;

// One schedule action (pipeline::Action); `kind` is an ActionKind.
struct WireAction {
  int32_t kind = 0;
  int32_t microbatch = 0;
  int32_t stage = 0;
  BATON_CODEC_FIELDS(WireAction, kind, microbatch, stage);
};

inline bool IsActionKind(int32_t kind) {
  return kind >= static_cast<int32_t>(ActionKind::kForward) &&
         kind <= static_cast<int32_t>(ActionKind::kRecvGradient);
}

inline WireAction ToWire(const Action& a) {
  return {static_cast<int32_t>(a.kind), a.microbatch, a.stage};
}

// REQUIRES IsActionKind(a.kind).
inline Action FromWire(const WireAction& a) {
  return {static_cast<ActionKind>(a.kind), a.microbatch, a.stage};
}

// One worker's part of the job.
struct ConfigureRequest {
  std::string schedule;  // the schedule's name, for messages
  int32_t workers = 0;   // ScheduleSpec
  int32_t microbatches = 0;
  int32_t chunks = 0;
  int32_t rank = 0;                        // the receiving worker, in [0, workers)
  std::vector<WireAction> actions;         // its action list, in order
  std::vector<int32_t> cuts;               // stages + 1 cut points (pipeline/model.h)
  std::string optimizer;                   // dist_optim::EncodeOptions
  int64_t batch_size = 0;                  // rows per step, a multiple of microbatches
  std::vector<std::string> stage_workers;  // the name of every worker, by rank
  std::string restore_file;                // a state to load (StageRunner::LoadState), or ""
  BATON_CODEC_FIELDS(ConfigureRequest, schedule, workers, microbatches, chunks, rank, actions, cuts,
                     optimizer, batch_size, stage_workers, restore_file);
};

// -> the steps the worker has taken (restored ones included).
inline const rpc::Function<int64_t(ConfigureRequest)> kConfigureFn("baton.pipeline.configure");

struct StepRequest {
  int64_t step = 0;                   // the step's id, never reused
  std::optional<at::Tensor> inputs;   // the batch's, to the worker of stage 0
  std::optional<at::Tensor> targets;  // the batch's, to the worker of the last stage
  BATON_CODEC_FIELDS(StepRequest, step, inputs, targets);
};

// One executed action (pipeline::TimelineEvent of the replying worker).
struct WireEvent {
  WireAction action;
  double start_us = 0;  // absolute microseconds (absl::Now())
  double end_us = 0;
  BATON_CODEC_FIELDS(WireEvent, action, start_us, end_us);
};

struct StepReply {
  std::vector<double> losses;  // per micro-batch, from the worker of the last stage
  std::vector<WireEvent> events;
  int32_t peak_stashed = 0;
  double compute_us = 0;
  double optimizer_us = 0;
  BATON_CODEC_FIELDS(StepReply, losses, events, peak_stashed, compute_us, optimizer_us);
};

inline const rpc::Function<StepReply(StepRequest)> kRunStepFn("baton.pipeline.run_step");

// An activation or gradient for one of the receiver's stages
// (pipeline::StageMessage).
struct Delivery {
  int64_t step = 0;
  int32_t kind = 0;   // MessageKind: 0 activation, 1 gradient
  int32_t stage = 0;  // the receiving stage
  int32_t microbatch = 0;
  at::Tensor tensor;
  BATON_CODEC_FIELDS(Delivery, step, kind, stage, microbatch, tensor);
};

inline const rpc::Function<void(Delivery)> kDeliverFn("baton.pipeline.deliver");

// The step fails with this status (StatusFromWire(code, message)).
struct AbortRequest {
  int64_t step = 0;
  int32_t code = 0;  // absl::StatusCode
  std::string message;
  BATON_CODEC_FIELDS(AbortRequest, step, code, message);
};

inline const rpc::Function<void(AbortRequest)> kAbortFn("baton.pipeline.abort");

// (file) -> (): writes this worker's state there (atomically).
inline const rpc::Function<void(std::string)> kSaveFn("baton.pipeline.save");

// (stage) -> that stage's parameters.
inline const rpc::Function<std::vector<at::Tensor>(int64_t)> kParametersFn(
    "baton.pipeline.parameters");

// () -> (): releases StageServer::WaitForFinish().
inline const rpc::Function<void()> kFinishFn("baton.pipeline.finish");

}  // namespace baton::pipeline::internal

#endif  // BATON_PIPELINE_INTERNAL_FUNCTIONS_H_
