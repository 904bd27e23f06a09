// DistributedDataParallel: data-parallel training of a torch::nn::Module over
// a ProcessGroup. Gradients are averaged across ranks during backward, one
// bucket at a time, so communication overlaps the rest of the backward pass.
//
//   auto ddp = DistributedDataParallel::Create(model.ptr(), pg).value();
//   auto loss = torch::mse_loss(model->forward(x), y);
//   loss.backward();          // gradients are averaged when this returns
//   optimizer.step();
//
// Contract:
//  - Create broadcasts every parameter and buffer from rank 0, so all ranks
//    start identical. Every rank must call Create, and then run the same
//    number of backward passes (the buckets' all-reduces are collectives).
//  - Parameters (those with requires_grad) are packed, in reverse order of
//    module->parameters() (the order backward produces them), into buckets of
//    at most DdpOptions::bucket_cap_bytes; a bucket's all-reduce starts as
//    soon as all its gradients are ready and every earlier bucket has
//    started (the same bucket order on every rank).
//  - After backward, each parameter's gradient is the mean over ranks.
//  - Inside a NoSync() scope backward only accumulates locally; the next
//    backward outside it averages the accumulated gradients.
//  - A parameter that gets no gradient in a backward: with
//    find_unused_parameters it counts as a zero gradient on this rank; without
//    it, backward throws baton::Error (FAILED_PRECONDITION) naming the
//    parameters. A failed or timed-out all-reduce also throws baton::Error
//    from backward(), the one exception type of the user-facing API.
//  - GPU buckets (NCCL): backward does not wait on the host. The current
//    stream waits for each bucket's all-reduce (Work::WaitOnStream), so the
//    averaged gradients and the optimizer step queue behind it, as with
//    torch's DDP. An all-reduce that fails after that aborts the group, and
//    the next backward's all-reduce fails at once.
//  - DDP+RPC hybrid: with DdpOptions::gradient_source set, DDP installs no
//    autograd hooks; gradients are read and written through the source (for
//    example a distributed-autograd context instead of .grad), and whoever
//    produces them calls MarkGradientReady(i) as each is ready (optional, for
//    overlap) and then FinishGradients(), or simply SyncGradients().
//
// Thread-safety: one training thread drives a DDP object. Autograd hooks may
// fire on autograd worker threads; the reducer state is guarded internally.
#ifndef BATON_COMM_DDP_H_
#define BATON_COMM_DDP_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/torch_compat.h"
#include "comm/process_group.h"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace baton::comm {

// Where DDP reads each parameter's gradient and writes the averaged one.
// Indices are positions in DistributedDataParallel::parameters().
class GradientSource {
 public:
  virtual ~GradientSource() = default;
  // The local gradient of parameter `index`, or an undefined tensor if it has
  // none in this iteration.
  virtual at::Tensor Get(size_t index, const at::Tensor& param) = 0;
  // Stores the averaged gradient. `grad` is a view of DDP's bucket that is
  // valid only during the call: copy it to keep it.
  virtual void Set(size_t index, const at::Tensor& param, const at::Tensor& grad) = 0;
};

// The default source: each parameter's .grad.
class ParamGradSource final : public GradientSource {
 public:
  at::Tensor Get(size_t index, const at::Tensor& param) override;
  void Set(size_t index, const at::Tensor& param, const at::Tensor& grad) override;
};

struct DdpOptions {
  int64_t bucket_cap_bytes = 25 << 20;
  bool find_unused_parameters = false;
  // Broadcast buffers from rank 0 at construction (and in SyncBuffers).
  bool broadcast_buffers = true;
  // Bound on waiting for the buckets at the end of backward; zero means the
  // group's timeout.
  absl::Duration timeout = absl::ZeroDuration();
  // Null: gradients live in .grad and autograd hooks drive the reduction.
  std::shared_ptr<GradientSource> gradient_source;
};

namespace internal {
class Reducer;
}  // namespace internal

class DistributedDataParallel {
 public:
  // REQUIRES: `group` is a member handle; every parameter is dense,
  // contiguous and on the group backend's device.
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      std::shared_ptr<torch::nn::Module> module, ProcessGroup group, DdpOptions options = {});
  ~DistributedDataParallel();

  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() { return *module_; }
  const std::vector<at::Tensor>& parameters() const { return params_; }
  const ProcessGroup& group() const { return group_; }
  // The bucket of each parameter, for tests and tuning.
  std::vector<std::vector<size_t>> bucket_layout() const;

  // RAII scope in which backward does not communicate.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel* ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  NoSyncGuard NoSync() { return NoSyncGuard(this); }

  // Broadcasts buffers from rank 0 again (e.g. before each forward, as torch
  // does with broadcast_buffers).
  absl::Status SyncBuffers();

  // External-gradient path (see the contract above).
  void MarkGradientReady(size_t index);
  absl::Status FinishGradients();
  absl::Status SyncGradients();

 private:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroup group,
                          DdpOptions options);

  std::shared_ptr<torch::nn::Module> module_;
  ProcessGroup group_;
  DdpOptions options_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<internal::Reducer> reducer_;
  // Keeps the AccumulateGrad nodes (and so our hooks) alive with the module.
  std::vector<torch_compat::NodePtr<>> accumulators_;
};

}  // namespace baton::comm

#endif  // BATON_COMM_DDP_H_
