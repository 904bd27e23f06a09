// The optimizers a Python worker hosts for DistributedOptimizer
// (python/baton/distributed/optim.py), stepped by a function registered in
// C++ so that a step costs its owner no pickling and no GIL.
//
// Contract:
// - InstallOptimizerHost(registry) adds the host (a registry extension) and
//   registers kOptimizerStep; call it before the agent starts, on every
//   Python worker.
// - A HostedOptimizer is made on a parameter owner (by the Python
//   _LocalOptimizer that remote() creates there) and is listed under its key
//   until it is destroyed. Keys are unique per creating process and object.
// - kOptimizerStep(key, context_id) steps that optimizer with the gradients
//   the context accumulated on this worker (dist_autograd::GetGradients). A
//   parameter without a gradient is skipped; so is every parameter when the
//   context never reached this worker. Steps of one optimizer are
//   serialized. Errors: NOT_FOUND naming the key when no optimizer is listed
//   under it (its DistributedOptimizer was dropped, or this is a new
//   incarnation of the owner); the optimizer's own errors (a gradient whose
//   shape does not match) with their codes.
//
// Thread-safety: safe for concurrent use; nothing here takes the GIL.
#ifndef BATON_PYTHON_SRC_HOSTED_OPTIMIZER_H_
#define BATON_PYTHON_SRC_HOSTED_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dist_optim/functional_optimizer.h"
#include "rpc/agent.h"
#include "rpc/function.h"

namespace baton::python {

inline const rpc::Function<bool(std::string, int64_t)> kOptimizerStep{
    "baton.python.optimizer_step"};

class HostedOptimizer;

class OptimizerHost {
 public:
  std::shared_ptr<HostedOptimizer> Find(const std::string& key) const;

 private:
  friend class HostedOptimizer;
  void Add(const std::string& key, const std::shared_ptr<HostedOptimizer>& o);
  void Remove(const std::string& key, const HostedOptimizer* o);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<HostedOptimizer>> hosted_ ABSL_GUARDED_BY(mu_);
};

absl::Status InstallOptimizerHost(rpc::FunctionRegistry& registry);

class HostedOptimizer {
 public:
  // Lists the optimizer under `key` on the agent's host. INVALID_ARGUMENT
  // for bad options or parameters; FAILED_PRECONDITION without a host;
  // ALREADY_EXISTS for a key already listed.
  static absl::StatusOr<std::shared_ptr<HostedOptimizer>> Create(
      rpc::Runtime& agent, const std::string& key, const dist_optim::OptimizerOptions& options,
      std::vector<at::Tensor> params);
  ~HostedOptimizer();  // unlists it
  HostedOptimizer(const HostedOptimizer&) = delete;
  HostedOptimizer& operator=(const HostedOptimizer&) = delete;

  absl::Status Step(int64_t context_id);

 private:
  HostedOptimizer(rpc::Runtime& agent, std::shared_ptr<OptimizerHost> host, std::string key,
                  std::unique_ptr<dist_optim::FunctionalOptimizer> optimizer)
      : agent_(agent),
        host_(std::move(host)),
        key_(std::move(key)),
        optimizer_(std::move(optimizer)) {}

  rpc::Runtime& agent_;
  const std::shared_ptr<OptimizerHost> host_;
  const std::string key_;
  absl::Mutex mu_;
  const std::unique_ptr<dist_optim::FunctionalOptimizer> optimizer_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_HOSTED_OPTIMIZER_H_
