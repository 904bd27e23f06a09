// Pipeline-parallel training over baton's RPC: stage workers serve their
// model chunks (StageServer), one driver runs the training steps (Pipeline).
//
//   // Every process builds the same seeded model:
//   torch::nn::Sequential MakeModel() { torch::manual_seed(0); return ...; }
//
//   // Stage workers ("stage0".."stage{p-1}"):
//   auto server = pipeline::StageServer::Create(*registry, {MakeModel});
//   ... create the agent with `registry` ...
//   server->WaitForFinish(job_timeout);
//
//   // The driver:
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
// How a step runs. The driver sends each stage worker one run_step call:
// the batch's inputs to the worker of stage 0, the targets to the worker of
// the last stage, nothing else. Each worker executes its action list
// (pipeline/stage.h, guarantees PP1-PP8) on its own stage thread; activations
// and gradients go from stage to stage as baton.pipeline.deliver calls,
// never through the driver. The last stage computes the loss. Each worker
// steps its own optimizers after its last action, and the replies carry the
// losses and the timeline.
//
// Guarantees of this layer (tests/pipeline/pipeline_test.cc):
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
//     never reused, so late messages of a failed step are rejected.
// PL4 Checkpoints: SaveCheckpoint() has every stage worker write its state
//     (parameters, optimizer state, steps) to checkpoint_dir/step-K/, then
//     records K in checkpoint_dir/LATEST (written to a temporary file and
//     renamed). Create() restores the step named by LATEST when there is
//     one, so a job restarted by baton-run resumes where the last checkpoint
//     left it; a checkpoint of another model or split is refused with
//     INVALID_ARGUMENT naming the worker.
//
// Thread-safety: Pipeline is used by one thread. StageServer is safe for
// concurrent calls; its stage thread runs one step at a time and a second
// concurrent run_step is refused with FAILED_PRECONDITION.
#ifndef BATON_PIPELINE_PIPELINE_H_
#define BATON_PIPELINE_PIPELINE_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dist_optim/optimizer_options.h"
#include "pipeline/model.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"
#include "rpc/agent.h"
#include "rpc/function.h"

namespace baton::pipeline {

// Builds the whole model; must give the same architecture and initial
// values in every process (seed it).
using ModelFactory = std::function<torch::nn::Sequential()>;

struct StageServerOptions {
  ModelFactory model;
  LossFn loss = SumCrossEntropy;
  // LibTorch intra-op threads of the stage thread; 0: those of the thread
  // that creates the server (at::get_num_threads()), e.g. 1 after
  // torch::set_num_threads(1) in main().
  int torch_threads = 0;
};

class StageServer {
 public:
  // Registers the baton.pipeline.* functions on `registry` (before or after
  // the agent starts). INVALID_ARGUMENT without a model factory.
  static absl::StatusOr<std::unique_ptr<StageServer>> Create(rpc::FunctionRegistry& registry,
                                                             StageServerOptions options);
  ~StageServer();  // stops the stage thread; later calls get UNAVAILABLE
  StageServer(const StageServer&) = delete;
  StageServer& operator=(const StageServer&) = delete;

  // Returns when the driver calls Pipeline::Finish(), or DEADLINE_EXCEEDED.
  absl::Status WaitForFinish(absl::Duration timeout);
  // Steps this worker completed (restored ones included).
  int64_t steps_taken() const;

  class Impl;

 private:
  explicit StageServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

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
  std::vector<int> peak_stashed;       // per worker
  std::vector<TimelineEvent> events;   // microseconds from the step's first action
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

#endif  // BATON_PIPELINE_PIPELINE_H_
