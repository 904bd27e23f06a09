// DistributedOptimizer: one optimizer over parameters that live on several
// workers, stepped with the gradients of a distributed autograd context.
//
//   dist_optim::Install(*rrefs);                  // every worker, before RpcAgent::Create
//   auto opt = dist_optim::DistributedOptimizer::Create(
//       *agent, dist_optim::OptimizerOptions::SGD(0.05), param_rrefs).value();
//   {
//     dist_autograd::Context ctx(*agent);
//     ... forward through remote modules, loss ...
//     absl::Status s = dist_autograd::Backward(*agent, ctx.id(), {loss});
//     if (s.ok()) s = opt->Step(ctx.id());        // every owner at once
//   }
//
// Contract:
// - Create() groups the parameter RRefs by owner and creates one local
//   optimizer (a remote object, dist_optim::LocalOptimizer) on each owner,
//   over the parameters that owner holds, in the order given. Parameters are
//   updated in place on their owners: every holder of the tensor sees it.
// - Step(context_id) asks every owner at once to step with the gradients that
//   context accumulated there (dist_autograd::GetGradients), and returns when
//   all have stepped, or with the first error, naming the owner. A parameter
//   without a gradient in the context is skipped, as torch::optim skips a
//   parameter whose .grad is undefined; an owner the context never reached
//   skips all of its parameters.
// - The update rules are LibTorch 1.13's (dist_optim/functional_optimizer.h):
//   SGD (momentum, dampening, nesterov, weight decay), Adam, AdamW, Adagrad,
//   RMSprop.
// - Concurrency between trainers: each trainer has its own DistributedOptimizer
//   (and optimizer state) over possibly shared parameters. By default every
//   step on an owner holds that owner's lock, shared by all optimizers on the
//   worker, so concurrent steps on shared parameters are serialized
//   (Mode::kLocked). Mode::kHogwild drops the lock: updates of concurrent
//   trainers interleave, the user's explicit choice.
// - State: SaveState() returns each owner's optimizer state (keyed by owner
//   name); LoadState() restores it into an optimizer over the same parameters.
//   Both take the owner's lock in either mode.
// - Every call is bounded by the timeout given at Create (0: the agent's
//   rpc_timeout).
//
// Thread-safety: a DistributedOptimizer is safe for concurrent use; steps of
// one optimizer from several threads are serialized by the owners' locks
// (kLocked) or race by design (kHogwild).
#ifndef BATON_DIST_OPTIM_DISTRIBUTED_OPTIMIZER_H_
#define BATON_DIST_OPTIM_DISTRIBUTED_OPTIMIZER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dist_optim/functional_optimizer.h"
#include "rpc/agent.h"
#include "rref/rref.h"

namespace baton::dist_optim {

class LocalOptimizer;
struct OwnerLock;

// Registers the LocalOptimizer remote class and the per-worker owner lock.
// Call on every worker, before RpcAgent::Create. Needs the RRef service;
// distributed autograd must be installed on the same registry to step.
void Install(rref::RRefService& rrefs);

class DistributedOptimizer {
 public:
  enum class Mode { kLocked, kHogwild };
  struct Settings {
    Mode mode = Mode::kLocked;
    absl::Duration timeout = absl::ZeroDuration();
  };

  // INVALID_ARGUMENT for bad options or no parameters; an owner's failure to
  // create its optimizer (e.g. a parameter that is not a floating-point
  // tensor) is returned naming that owner.
  static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      rpc::RpcAgent& agent, const OptimizerOptions& options,
      const std::vector<rref::RRef<at::Tensor>>& params, Settings settings);
  static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      rpc::RpcAgent& agent, const OptimizerOptions& options,
      const std::vector<rref::RRef<at::Tensor>>& params) {
    return Create(agent, options, params, Settings());
  }

  absl::Status Step(int64_t context_id);

  absl::StatusOr<std::map<std::string, std::string>> SaveState();
  absl::Status LoadState(const std::map<std::string, std::string>& state);

  const OptimizerOptions& options() const { return options_; }
  // The workers that own parameters, in the order of their first parameter.
  std::vector<std::string> owners() const;

 private:
  struct Owner {
    rpc::WorkerInfo worker;
    rref::RRef<LocalOptimizer> optimizer;
  };
  DistributedOptimizer(rpc::RpcAgent& agent, OptimizerOptions options, absl::Duration timeout,
                       std::vector<Owner> owners)
      : agent_(agent), options_(options), timeout_(timeout), owners_(std::move(owners)) {}

  rpc::RpcAgent& agent_;
  const OptimizerOptions options_;
  const absl::Duration timeout_;
  const std::vector<Owner> owners_;
};

// The optimizer on one owner (a remote object; users do not create it).
// Methods throw baton::Error with the failure's status.
class LocalOptimizer {
 public:
  LocalOptimizer(std::string options, std::vector<rref::RRef<at::Tensor>> params, bool hogwild);
  bool step(int64_t context_id);
  std::string save_state();
  bool load_state(std::string state);
  int64_t num_params() const;

 private:
  rpc::Runtime* agent_ = nullptr;
  std::shared_ptr<OwnerLock> owner_lock_;
  bool hogwild_ = false;
  std::unique_ptr<FunctionalOptimizer> optimizer_;
};

}  // namespace baton::dist_optim

#endif  // BATON_DIST_OPTIM_DISTRIBUTED_OPTIMIZER_H_
