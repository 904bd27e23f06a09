// StageRunner: what one pipeline worker runs in a training step. It holds
// the worker's model chunks (one per virtual stage it owns), executes its
// schedule action list (pipeline/schedule.h) in order, exchanges activations
// and their gradients with the neighbouring stages through a StageLink,
// accumulates gradients over the micro-batches and, after the flush, steps
// each chunk's functional optimizer (dist_optim/functional_optimizer.h).
// pipeline/stage_server.h puts runners behind RPC; tests also connect runners on
// threads of one process with LocalStageLink.
//
// Guarantees (tests/pipeline/stage_test.cc tests each by name):
// PP1 Schedule as data: a step executes exactly the worker's action list, in
//     order; the runner knows nothing of GPipe or 1F1B.
// PP2 Same result as one process: micro-batch i's loss is
//     loss_fn(output_i, target_i) / batch_size, loss_fn returning the SUM
//     over the micro-batch's examples, so the step's loss is the mean over
//     the whole batch and the accumulated gradients are its gradients. After
//     k steps the parameters equal single-process training on the same
//     batches up to float rounding (1e-6 float32, 1e-12 float64).
// PP3 Activation memory: a micro-batch's stashed forward state (input and
//     output of a chunk) is freed by its backward; StepReport::peak_stashed
//     counts the most (micro-batch, stage) states held at once. GPipe holds
//     m * chunks; 1F1B at most workers - worker.
// PP4 Direct data path: activations and gradients go stage to stage through
//     the link; only the batch's inputs (to the worker of stage 0) and
//     targets (to the worker of the last stage) come from the driver.
// PP5 Failure is contained: a step that fails (a neighbour's error or death,
//     a deadline, Abort(), an exception in a module or the loss) returns an
//     error naming this worker's stage, the micro-batch and what it was
//     doing or waiting for. It leaves no stashed state or accumulated
//     gradient behind, so the next step starts clean, and it changes neither
//     parameters nor optimizer state: a worker steps its optimizers only
//     after every one of its actions succeeded. Worker w's last backward
//     needs the gradients of every later stage, so a worker completes only
//     once every stage has run every backward: a failure in a forward, a
//     backward, the loss or the inputs, or a deadline before that point,
//     leaves every worker's parameters as they were. (A worker that dies
//     after its last backward may leave the others stepped; recovery then
//     goes through a checkpoint, see pipeline/driver.h.)
// PP6 Checkpoint: SaveState()/LoadState() carry every chunk's parameters and
//     optimizer state and the number of steps taken; training resumed from a
//     saved state continues exactly as if never stopped.
// PP7 Bad messages are rejected, never crash: Deliver() answers
//     INVALID_ARGUMENT for a stage this worker does not own, a micro-batch
//     out of range, an undefined tensor or a message kind the schedule never
//     receives; ALREADY_EXISTS for a duplicate; FAILED_PRECONDITION for a
//     step that already finished; RESOURCE_EXHAUSTED when more than
//     2 x stages x microbatches messages are pending.
// PP8 Timeline: every step reports each action's start and end (absolute
//     microseconds, absl::Now()), the compute time and the peak stash, from
//     which the driver draws the trace and the measured bubble.
// PP9 Device: a runner whose StageConfig::device is a GPU keeps its chunks,
//     their optimizer state and its stashed tensors there. Inputs, targets
//     and received tensors that arrive elsewhere are moved onto it; what it
//     sends leaves from it (a CUDA tensor travels as the agent's device maps
//     and CUDA channel say, rpc/agent.h). Each forward and backward ends when
//     its kernels have ended, so PP8's timeline and bubble are device time.
//     Checkpoints (PP6) hold host bytes, loadable on any device.
//
// Thread-safety: RunStep() is called by one thread at a time (the stage's
// thread); Deliver() and Abort() may be called from any thread at any time,
// also during RunStep(). SaveState(), LoadState() and Parameters() REQUIRE
// that no RunStep() is running.
#ifndef BATON_PIPELINE_STAGE_H_
#define BATON_PIPELINE_STAGE_H_

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dist_optim/functional_optimizer.h"
#include "pipeline/schedule.h"

namespace baton::pipeline {

// The SUM of the per-example losses of one micro-batch (a scalar tensor).
using LossFn =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

// Cross-entropy over class logits, summed (the default).
torch::Tensor SumCrossEntropy(const torch::Tensor& output, const torch::Tensor& target);

enum class MessageKind : int { kActivation = 0, kGradient = 1 };

struct StageMessage {
  int64_t step = 0;
  MessageKind kind = MessageKind::kActivation;
  int stage = 0;  // the receiving stage
  int microbatch = 0;
  torch::Tensor tensor;
};

// How a runner reaches the other workers.
class StageLink {
 public:
  virtual ~StageLink() = default;
  // Sends `message` to worker `to`. `done` runs once, on any thread, with the
  // delivery's status (the receiver's Deliver() status, or a transport
  // error); it must not block.
  virtual void Send(int to, StageMessage message, absl::AnyInvocable<void(absl::Status)> done) = 0;
  // For error messages, e.g. "worker 'stage2'".
  virtual std::string Describe(int worker) const = 0;
};

struct StageConfig {
  ScheduleSpec spec;
  int worker = 0;
  std::vector<Action> actions;  // this worker's list
  int64_t batch_size = 1;       // REQUIRES batch_size % spec.microbatches == 0
  dist_optim::OptimizerOptions optimizer;
  // Where this worker's chunks live and compute (PP9). Not on the wire: the
  // worker's own choice (StageServerOptions::device).
  torch::Device device = torch::kCPU;
};

struct StepInputs {
  int64_t step = 0;       // strictly increasing across a runner's steps
  torch::Tensor inputs;   // [batch, ...] on the worker of stage 0, else undefined
  torch::Tensor targets;  // [batch, ...] on the worker of the last stage, else undefined
  absl::Time deadline = absl::InfiniteFuture();
};

struct StepReport {
  int worker = 0;
  std::vector<double> losses;  // per micro-batch, last stage's worker only
  // Absolute microseconds (absl::Now()); receives only when they waited.
  std::vector<TimelineEvent> events;
  int peak_stashed = 0;
  double compute_us = 0;    // forwards and backwards
  double optimizer_us = 0;  // the optimizer steps after the flush
};

class StageRunner {
 public:
  // `chunks[c]` is the module of virtual stage c * spec.workers + worker; its
  // parameters are the ones the optimizer updates. INVALID_ARGUMENT for a
  // config that does not fit (wrong number of chunks, an action for a stage
  // this worker does not own, batch not divisible by m, bad optimizer).
  static absl::StatusOr<std::unique_ptr<StageRunner>> Create(
      StageConfig config, std::vector<torch::nn::Sequential> chunks, LossFn loss = SumCrossEntropy);

  absl::StatusOr<StepReport> RunStep(StepInputs inputs, StageLink& link);

  absl::Status Deliver(StageMessage message);
  // Makes a running (or the next) step `step` fail with `why`.
  void Abort(int64_t step, absl::Status why);

  absl::StatusOr<std::string> SaveState() const;
  absl::Status LoadState(const std::string& bytes);
  int64_t steps_taken() const { return steps_taken_; }

  // What the runner does now, for the hang report: the step and action
  // (empty between steps), since when, and for a receive the stage whose
  // message it waits for; and how many actions it has run in all.
  struct Activity {
    int64_t step = -1;
    std::string action;
    absl::Time since;
    int waits_for_stage = -1;
    int64_t actions_done = 0;
  };
  Activity CurrentActivity() const;

  // Every chunk's parameters, chunk by chunk (shared with the runner).
  std::vector<torch::Tensor> Parameters() const;
  // The parameters of one stage; empty if this worker does not own it.
  std::vector<torch::Tensor> StageParameters(int stage) const;
  const StageConfig& config() const { return config_; }

 private:
  struct Chunk {
    int stage = 0;
    torch::nn::Sequential module;
    std::vector<torch::Tensor> params;
    std::unique_ptr<dist_optim::FunctionalOptimizer> optimizer;
  };
  using Key = std::tuple<int64_t, int, int, int>;  // step, kind, stage, microbatch

  StageRunner(StageConfig config, std::vector<Chunk> chunks, LossFn loss);
  // Waits for the message (step, kind, stage, mb) until the deadline or an abort.
  absl::StatusOr<torch::Tensor> Receive(int64_t step, MessageKind kind, int stage, int mb,
                                        absl::Time deadline);
  absl::Status Run(const StepInputs& in, StageLink& link, StepReport& report);
  void EndStep(int64_t step);
  Chunk& chunk_of(int stage) { return chunks_[stage / config_.spec.workers]; }
  std::string Where(const Action& a) const;

  const StageConfig config_;
  std::vector<Chunk> chunks_;
  const LossFn loss_;
  int64_t steps_taken_ = 0;  // RunStep's thread only

  mutable absl::Mutex mu_;
  int64_t finished_step_ ABSL_GUARDED_BY(mu_) = -1;  // messages at or below are stale
  std::map<Key, torch::Tensor> inbox_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, absl::Status> aborts_ ABSL_GUARDED_BY(mu_);
  int pending_sends_ ABSL_GUARDED_BY(mu_) = 0;
  Activity activity_ ABSL_GUARDED_BY(mu_);
  absl::Status send_error_ ABSL_GUARDED_BY(mu_);
};

// Connects runners of one process (tests): Send() calls the receiver's
// Deliver() directly, with a copy of the tensor. Kill(w) makes every later
// message to w fail with UNAVAILABLE, as if w had died.
class LocalStageLink : public StageLink {
 public:
  explicit LocalStageLink(std::vector<StageRunner*> runners) : runners_(std::move(runners)) {}
  void Send(int to, StageMessage message, absl::AnyInvocable<void(absl::Status)> done) override;
  std::string Describe(int worker) const override;
  void Kill(int worker);

 private:
  std::vector<StageRunner*> runners_;
  absl::Mutex mu_;
  std::vector<int> killed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::pipeline

#endif  // BATON_PIPELINE_STAGE_H_
