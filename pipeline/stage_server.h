// StageServer: a stage worker of pipeline training (pipeline/pipeline.h
// describes the protocol). It serves the baton.pipeline.* functions through
// which the driver (pipeline/driver.h) configures it with its part of the
// schedule and of the model, runs training steps on it, checkpoints it and
// reads its parameters.
//
//   torch::nn::Sequential MakeModel() { torch::manual_seed(0); return ...; }
//
//   auto registry = std::make_shared<rpc::FunctionRegistry>();
//   auto server = pipeline::StageServer::Create(*registry, {MakeModel});
//   auto agent = rpc::RpcAgent::Create(options, registry).value();
//   server->WaitForFinish(job_timeout);   // until the driver's Finish()
//   agent->Shutdown();
//
// Contract:
// - configure builds the whole model with the factory, keeps the slices of
//   its stages at the driver's cut points (PL1 in pipeline/driver.h) in a
//   StageRunner (pipeline/stage.h) and, when asked, loads a saved state
//   (PL4). A request whose values do not fit is refused with
//   INVALID_ARGUMENT naming the field, e.g. "ConfigureRequest.workers is 0,
//   not in [1, 65536]", "ConfigureRequest.actions[3].kind is 9, not an
//   action kind", or cut points that do not split the model.
// - run_step runs the step on the server's stage thread and answers when
//   the step ends: no executor thread waits for a step. One step at a time:
//   a run_step, configure, save or parameters call while a step runs is
//   refused with FAILED_PRECONDITION.
// - deliver hands activations and gradients to the runner (INVALID_ARGUMENT
//   naming the field for a message kind that does not exist, the runner's
//   PP7 for the rest); abort makes a step fail with the driver's
//   status (PP5).
// PL5 Closing: destroying the server fails its step promptly instead of
//     leaving it to the step's deadline. A step still queued fails at once;
//     a running one is aborted (StageRunner::Abort): its waits wake and it
//     fails after the action it is executing with UNAVAILABLE "pipeline
//     stage server closed during step K", changing no parameter (PP5); a
//     step already past its last action completes. Either way its run_step
//     call is answered. The destructor returns once the stage thread has
//     stopped: after that action and the acknowledgements of the step's
//     sends in flight, each bounded by the step's deadline. Calls that reach
//     the server later fail with UNAVAILABLE.
//
// Thread-safety: the remote functions may be called concurrently, from any
// thread. WaitForFinish() and steps_taken() may be called from any thread,
// but not concurrently with the destructor.
#ifndef BATON_PIPELINE_STAGE_SERVER_H_
#define BATON_PIPELINE_STAGE_SERVER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipeline/model.h"
#include "pipeline/stage.h"
#include "rpc/function.h"

namespace baton::pipeline {

struct StageServerOptions {
  ModelFactory model;
  LossFn loss = SumCrossEntropy;
  // LibTorch intra-op threads of the stage thread; 0: those of the thread
  // that creates the server (at::get_num_threads()), e.g. 1 after
  // torch::set_num_threads(1) in main().
  int torch_threads = 0;
  // Where this worker's stages compute (pipeline/stage.h, PP9). On a GPU,
  // set AgentOptions::devices.maps for the neighbouring stage workers so
  // that activations and gradients go device to device (through CUDA IPC
  // on one host, with AgentCollaborators::cuda_channel); toward a worker
  // with no map they go through host memory. Configure fails with
  // INVALID_ARGUMENT for a device this process cannot use.
  torch::Device device = torch::kCPU;
};

class StageServer {
 public:
  // Registers the baton.pipeline.* functions on `registry` (before or after
  // the agent starts). INVALID_ARGUMENT without a model factory or a loss.
  static absl::StatusOr<std::unique_ptr<StageServer>> Create(rpc::FunctionRegistry& registry,
                                                             StageServerOptions options);
  ~StageServer();  // PL5: fails a step in flight, stops the stage thread
  StageServer(const StageServer&) = delete;
  StageServer& operator=(const StageServer&) = delete;

  // Returns when the driver calls Pipeline::Finish(), or DEADLINE_EXCEEDED.
  absl::Status WaitForFinish(absl::Duration timeout);
  // Steps this worker completed (restored ones included).
  int64_t steps_taken() const;

 private:
  class Impl;
  explicit StageServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace baton::pipeline

#endif  // BATON_PIPELINE_STAGE_SERVER_H_
