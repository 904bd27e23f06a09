// Pipeline: the driver of pipeline training (pipeline/pipeline.h describes
// the protocol). It computes the stage split, configures every stage worker
// (each runs a StageServer, pipeline/stage_server.h), runs the training
// steps and writes checkpoints and traces. It does not need the stage
// server's code (target //pipeline:driver).
//
//   pipeline::PipelineOptions o;
//   o.stage_workers = {"stage0", "stage1"};
//   o.schedule = *pipeline::OneFOneB({2, /*microbatches=*/8});
//   o.model = MakeModel;                     // for the split only
//   o.batch_size = 128;
//   o.optimizer = dist_optim::OptimizerOptions::SGD(0.2);
//   auto pipe = pipeline::Pipeline::Create(*agent, o);
//   auto r = (*pipe)->Step(x, y);            // r->loss, r->bubble, r->events
//   (*pipe)->Finish();
//
// Guarantees of the pipeline over RPC (tests/pipeline/pipeline_test.cc):
// PL1 The stage split is computed once, by the driver (Split in
//     pipeline/model.h), and sent to every stage worker, so splits by
//     measured time agree everywhere.
// PL2 A step's result is the mean loss over the batch, the measured bubble
//     (1 - sum of the workers' forward/backward time / (workers x the span
//     from the first action's start to the last action's end)) beside the
//     schedule's theoretical bubble, the peak stash per worker, and every
//     worker's timeline relative to the step's first action.
// PL3 Failure: a step fails within step_timeout (plus one RPC round trip)
//     when a stage worker dies, times out or fails. The driver then aborts
//     the step on the other workers and returns one error that names each
//     failed worker with its stages and, from the workers that were waiting
//     for it, the stage and micro-batch concerned; the status code is that
//     of the first failure (UNAVAILABLE for a dead worker). Step ids are
//     never reused, so late messages of a failed step are rejected. A reply
//     whose values do not fit the schedule counts as that worker's failure
//     (DATA_LOSS naming the field, e.g. "StepReply.events[2].action.kind").
// PL4 Checkpoints: SaveCheckpoint() has every stage worker write its state
//     (parameters, optimizer state, steps) to checkpoint_dir/step-K/, then
//     records K in checkpoint_dir/LATEST (written to a temporary file and
//     renamed). Create() restores the step named by LATEST when there is
//     one, so a job restarted by baton-run resumes where the last checkpoint
//     left it; a checkpoint of another model or split is refused with
//     INVALID_ARGUMENT naming the worker.
// (PL5, closing a stage server, is in pipeline/stage_server.h.)
//
// Thread-safety: a Pipeline is used by one thread. Its calls block on the
// stage workers, each wait bounded (Step by step_timeout, the others by the
// agent's rpc_timeout).
#ifndef BATON_PIPELINE_DRIVER_H_
#define BATON_PIPELINE_DRIVER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dist_optim/optimizer_options.h"
#include "pipeline/model.h"
#include "pipeline/schedule.h"
#include "rpc/agent.h"

namespace baton::pipeline {

struct PipelineOptions {
  std::vector<std::string> stage_workers;  // worker w of the schedule
  Schedule schedule;                       // e.g. OneFOneB({p, m})
  ModelFactory model;                      // for the split
  Split split = Split::ByParameters();
  int64_t batch_size = 0;  // rows per step, a multiple of the micro-batches
  dist_optim::OptimizerOptions optimizer;
  absl::Duration step_timeout = absl::Seconds(60);
  std::string checkpoint_dir;  // empty: no checkpoints, nothing restored
};

struct StepResult {
  int64_t step = 0;  // 0-based count of the step
  double loss = 0;   // mean over the batch (before this step's update)
  double wall_ms = 0;
  double bubble = 0;
  double theoretical_bubble = 0;
  std::vector<int> peak_stashed;      // per worker
  std::vector<TimelineEvent> events;  // microseconds from the step's first action
};

class Pipeline {
 public:
  // Validates the schedule, computes the split (PL1), configures every
  // stage worker and restores the latest checkpoint (PL4).
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(rpc::RpcAgent& agent,
                                                          PipelineOptions options);

  // One training step on [batch_size, ...] inputs and targets (PL2, PL3).
  absl::StatusOr<StepResult> Step(const torch::Tensor& inputs, const torch::Tensor& targets);

  // Steps completed, restored ones included: the next step's index.
  int64_t steps_done() const { return steps_done_; }
  // The step restored from checkpoint_dir by Create(), or -1.
  int64_t restored_step() const { return restored_step_; }
  const std::vector<int>& cuts() const { return cuts_; }
  const PipelineOptions& options() const { return options_; }

  // PL4. FAILED_PRECONDITION without a checkpoint_dir.
  absl::Status SaveCheckpoint();
  // Copies of every stage's parameters, in model order.
  absl::StatusOr<std::vector<torch::Tensor>> Parameters();
  // The step's summary line, e.g. "loss 0.9812, 41.2 ms, bubble 0.214
  // measured / 0.111 theoretical (1f1b, 2 workers, 8 micro-batches)".
  std::string Summary(const StepResult& r) const;
  absl::Status WriteTrace(const std::string& path, const StepResult& r) const;
  // Releases the stage workers' WaitForFinish().
  absl::Status Finish();

 private:
  Pipeline(rpc::RpcAgent& agent, PipelineOptions options, std::vector<int> cuts)
      : agent_(agent), options_(std::move(options)), cuts_(std::move(cuts)) {}
  absl::Status Configure(const std::string& restore_dir);

  rpc::RpcAgent& agent_;
  const PipelineOptions options_;
  const std::vector<int> cuts_;
  int64_t steps_done_ = 0;
  int64_t next_step_id_ = 0;  // never reused, even by failed steps
  int64_t restored_step_ = -1;
};

}  // namespace baton::pipeline

#endif  // BATON_PIPELINE_DRIVER_H_
