#include "python/src/hosted_optimizer.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "dist_autograd/dist_autograd.h"

namespace baton::python {

std::shared_ptr<HostedOptimizer> OptimizerHost::Find(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = hosted_.find(key);
  return it == hosted_.end() ? nullptr : it->second.lock();
}

void OptimizerHost::Add(const std::string& key, const std::shared_ptr<HostedOptimizer>& o) {
  absl::MutexLock lock(&mu_);
  hosted_[key] = o;
}

void OptimizerHost::Remove(const std::string& key, const HostedOptimizer* o) {
  absl::MutexLock lock(&mu_);
  auto it = hosted_.find(key);
  if (it == hosted_.end()) return;
  // Only its own entry: a live one under the same key stays.
  auto live = it->second.lock();
  if (live == nullptr || live.get() == o) hosted_.erase(it);
}

absl::Status InstallOptimizerHost(rpc::FunctionRegistry& registry) {
  auto host = std::make_shared<OptimizerHost>();
  registry.SetExtension(host);
  return registry.Register(
      kOptimizerStep,
      [weak = std::weak_ptr<OptimizerHost>(host)](const std::string& key,
                                                  int64_t context_id) -> absl::StatusOr<bool> {
        auto h = weak.lock();
        std::shared_ptr<HostedOptimizer> o = h != nullptr ? h->Find(key) : nullptr;
        if (o == nullptr) {
          return absl::NotFoundError(absl::StrCat("no optimizer '", key,
                                                  "' on this worker (its DistributedOptimizer "
                                                  "was dropped, or this worker restarted)"));
        }
        RETURN_IF_ERROR(o->Step(context_id));
        return true;
      });
}

absl::StatusOr<std::shared_ptr<HostedOptimizer>> HostedOptimizer::Create(
    rpc::Runtime& agent, const std::string& key, const dist_optim::OptimizerOptions& options,
    std::vector<at::Tensor> params) {
  auto host = agent.registry().GetExtension<OptimizerHost>();
  if (host == nullptr) {
    return absl::FailedPreconditionError("this agent hosts no optimizers (InstallOptimizerHost)");
  }
  if (host->Find(key) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("an optimizer '", key, "' is hosted already"));
  }
  ASSIGN_OR_RETURN(auto opt, dist_optim::FunctionalOptimizer::Create(options, std::move(params)));
  std::shared_ptr<HostedOptimizer> out(new HostedOptimizer(agent, host, key, std::move(opt)));
  host->Add(key, out);
  return out;
}

HostedOptimizer::~HostedOptimizer() { host_->Remove(key_, this); }

absl::Status HostedOptimizer::Step(int64_t context_id) {
  absl::MutexLock lock(&mu_);
  const auto& params = optimizer_->params();
  std::vector<at::Tensor> grads(params.size());
  auto g = dist_autograd::GetGradients(agent_.handle(), context_id);
  if (g.ok()) {
    for (size_t i = 0; i < params.size(); ++i) grads[i] = g->Get(params[i]);
  } else if (g.status().code() != absl::StatusCode::kNotFound) {
    return g.status();
  }  // else: the context never reached this worker; no parameter has a gradient
  return optimizer_->Step(grads);
}

}  // namespace baton::python
