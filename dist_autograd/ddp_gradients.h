// The DDP+RPC hybrid: DistributedDataParallel (comm/ddp.h) averaging the
// gradients that a distributed-autograd context holds, instead of .grad.
//
//   auto source = std::make_shared<dist_autograd::ContextGradients>(*agent);
//   comm::DdpOptions options;
//   options.gradient_source = source;
//   auto ddp = comm::DistributedDataParallel::Create(local_model, trainers_group, options).value();
//   {
//     dist_autograd::Context ctx(*agent);
//     ... forward through remote layers (RPC) and ddp->module() ...
//     dist_autograd::Backward(*agent, ctx.id(), {loss});
//     source->Use(ctx.id());         // NOT_FOUND if the context is not here
//     ddp->SyncGradients();          // the local module's gradients, averaged over the trainers
//     dist_optimizer->Step(ctx.id());
//   }
//
// Contract: Get reads a parameter's gradient from the context set by Use()
// (undefined if it has none there, which DDP's SyncGradients counts as zero);
// Set replaces it with DDP's average (a copy). Use() checks that the context
// exists on this worker; if it ends while DDP runs, Get finds no gradients.
//
// Thread-safety: Use() and the DDP calls it serves run on the training
// thread; the context itself is safe for concurrent use.
#ifndef BATON_DIST_AUTOGRAD_DDP_GRADIENTS_H_
#define BATON_DIST_AUTOGRAD_DDP_GRADIENTS_H_

#include <atomic>
#include <cstdint>

#include "comm/ddp.h"
#include "dist_autograd/dist_autograd.h"
#include "rpc/agent.h"

namespace baton::dist_autograd {

class ContextGradients final : public comm::GradientSource {
 public:
  explicit ContextGradients(rpc::RpcAgent& agent) : agent_(agent) {}

  absl::Status Use(int64_t context_id);

  at::Tensor Get(size_t index, const at::Tensor& param) override;
  void Set(size_t index, const at::Tensor& param, const at::Tensor& grad) override;

 private:
  rpc::RpcAgent& agent_;
  std::atomic<int64_t> context_id_{0};
};

}  // namespace baton::dist_autograd

#endif  // BATON_DIST_AUTOGRAD_DDP_GRADIENTS_H_
