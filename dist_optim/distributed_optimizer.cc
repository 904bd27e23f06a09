// DistributedOptimizer and the LocalOptimizer it creates on each owner.
#include "dist_optim/distributed_optimizer.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "dist_autograd/dist_autograd.h"

namespace baton::dist_optim {

// Serializes the steps of every LocalOptimizer on one worker (Mode::kLocked).
struct OwnerLock {
  absl::Mutex mu;
};

namespace {

void Check(const absl::Status& s) {
  if (!s.ok()) throw Error(s);
}

// Waits for one future per owner within `timeout` in all; the first error is
// annotated with `what` and the owner's name.
template <typename T, typename Owners>
absl::Status WaitEach(const std::vector<rpc::Future<T>>& futures, const Owners& owners,
                      absl::Duration timeout, const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < futures.size(); ++i) {
    absl::Status s = futures[i].Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!s.ok()) return Annotate(s, absl::StrCat(what, " on worker '", owners[i].worker.name, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

LocalOptimizer::LocalOptimizer(std::string options, std::vector<rref::RRef<at::Tensor>> params,
                               bool hogwild)
    : hogwild_(hogwild) {
  auto decoded = DecodeOptions(options);
  Check(decoded.status());
  if (params.empty()) Check(absl::InvalidArgumentError("no parameters"));
  std::vector<at::Tensor> tensors;
  tensors.reserve(params.size());
  for (const auto& p : params) {
    if (!p.is_owner()) {
      Check(absl::InvalidArgumentError(absl::StrCat(
          "parameter RRef ", p.id(), " is owned by worker '", p.owner_name(), "', not here")));
    }
    tensors.push_back(*p.local_value());  // the owner's tensor itself, shared
  }
  agent_ = params.front().service()->runtime();
  if (agent_ == nullptr) Check(absl::FailedPreconditionError("the agent is shut down"));
  owner_lock_ = agent_->registry().GetExtension<OwnerLock>();
  if (owner_lock_ == nullptr) {
    Check(absl::FailedPreconditionError("dist_optim::Install was not called on this worker"));
  }
  auto opt = FunctionalOptimizer::Create(*decoded, std::move(tensors));
  Check(opt.status());
  optimizer_ = *std::move(opt);
}

bool LocalOptimizer::step(int64_t context_id) {
  const auto& params = optimizer_->params();
  std::vector<at::Tensor> grads(params.size());
  auto g = dist_autograd::GetGradients(agent_->handle(), context_id);
  if (g.ok()) {
    for (size_t i = 0; i < params.size(); ++i) grads[i] = g->Get(params[i]);
  } else if (g.status().code() != absl::StatusCode::kNotFound) {
    Check(g.status());
  }  // else: the context never reached this owner, so no parameter has a gradient
  if (hogwild_) {
    Check(optimizer_->Step(grads));
  } else {
    absl::MutexLock lock(&owner_lock_->mu);
    Check(optimizer_->Step(grads));
  }
  return true;
}

std::string LocalOptimizer::save_state() {
  absl::MutexLock lock(&owner_lock_->mu);
  auto s = optimizer_->SaveState();
  Check(s.status());
  return *std::move(s);
}

bool LocalOptimizer::load_state(std::string state) {
  absl::MutexLock lock(&owner_lock_->mu);
  Check(optimizer_->LoadState(state));
  return true;
}

int64_t LocalOptimizer::num_params() const {
  return static_cast<int64_t>(optimizer_->params().size());
}

void Install(rref::RRefService& rrefs) {
  rrefs.registry().SetExtension(std::make_shared<OwnerLock>());
  rref::RegisterClass<LocalOptimizer>(rrefs, "baton.dist_optim.LocalOptimizer")
      .Constructor<std::string, std::vector<rref::RRef<at::Tensor>>, bool>()
      .Method("step", &LocalOptimizer::step)
      .Method("save_state", &LocalOptimizer::save_state)
      .Method("load_state", &LocalOptimizer::load_state)
      .Method("num_params", &LocalOptimizer::num_params);
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    rpc::RpcAgent& agent, const OptimizerOptions& options,
    const std::vector<rref::RRef<at::Tensor>>& params, Settings settings) {
  RETURN_IF_ERROR(ValidateOptions(options));
  if (params.empty()) return absl::InvalidArgumentError("DistributedOptimizer: no parameters");
  const absl::Duration timeout =
      settings.timeout > absl::ZeroDuration() ? settings.timeout : agent.options().timeouts.rpc;
  // Group by owner, keeping the order of each owner's first parameter.
  std::vector<int> order;
  std::map<int, std::vector<rref::RRef<at::Tensor>>> by_owner;
  for (const auto& p : params) {
    if (!p.valid()) return absl::InvalidArgumentError("DistributedOptimizer: an empty RRef");
    auto [it, inserted] = by_owner.try_emplace(p.owner_id());
    if (inserted) order.push_back(p.owner_id());
    it->second.push_back(p);
  }
  const std::string encoded = EncodeOptions(options);
  const bool hogwild = settings.mode == Mode::kHogwild;
  std::vector<Owner> owners;
  for (int id : order) {
    Owner o;
    absl::StatusOr<rpc::WorkerInfo> worker = agent.worker(id);
    if (!worker.ok()) return Annotate(worker.status(), "DistributedOptimizer");
    o.worker = *std::move(worker);
    // A failure before sending is in created(), waited for below.
    o.optimizer = rref::remote<LocalOptimizer>(agent, id, encoded, by_owner[id], hogwild);
    owners.push_back(std::move(o));
  }
  for (const Owner& o : owners) {
    absl::Status s = o.optimizer.created().Wait(timeout);
    if (!s.ok()) {
      return Annotate(s, absl::StrCat("DistributedOptimizer: creating the optimizer on worker '",
                                      o.worker.name, "'"));
    }
  }
  return std::unique_ptr<DistributedOptimizer>(
      new DistributedOptimizer(agent, options, timeout, std::move(owners)));
}

absl::Status DistributedOptimizer::Step(int64_t context_id) {
  std::vector<rpc::Future<bool>> steps;
  steps.reserve(owners_.size());
  for (const Owner& o : owners_) {
    steps.push_back(o.optimizer.rpc_async(&LocalOptimizer::step, context_id));
  }
  return WaitEach(steps, owners_, timeout_,
                  absl::StrCat("DistributedOptimizer step of context ", context_id));
}

absl::StatusOr<std::map<std::string, std::string>> DistributedOptimizer::SaveState() {
  std::vector<rpc::Future<std::string>> saves;
  for (const Owner& o : owners_)
    saves.push_back(o.optimizer.rpc_async(&LocalOptimizer::save_state));
  RETURN_IF_ERROR(WaitEach(saves, owners_, timeout_, "DistributedOptimizer: saving the state"));
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < saves.size(); ++i) out[owners_[i].worker.name] = saves[i].value();
  return out;
}

absl::Status DistributedOptimizer::LoadState(const std::map<std::string, std::string>& state) {
  for (const Owner& o : owners_) {
    if (state.count(o.worker.name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedOptimizer: the saved state has nothing for worker '", o.worker.name, "'"));
    }
  }
  if (state.size() != owners_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("DistributedOptimizer: the saved state has ",
                                                   state.size(), " owners, this optimizer ",
                                                   owners_.size()));
  }
  std::vector<rpc::Future<bool>> loads;
  for (const Owner& o : owners_) {
    loads.push_back(o.optimizer.rpc_async(&LocalOptimizer::load_state, state.at(o.worker.name)));
  }
  return WaitEach(loads, owners_, timeout_, "DistributedOptimizer: loading the state");
}

std::vector<std::string> DistributedOptimizer::owners() const {
  std::vector<std::string> out;
  for (const Owner& o : owners_) out.push_back(o.worker.name);
  return out;
}

}  // namespace baton::dist_optim
