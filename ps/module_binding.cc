#include "ps/module_binding.h"

#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/status_macros.h"

namespace baton::ps {

namespace {
at::Tensor OnHost(const at::Tensor& t) { return t.device().is_cpu() ? t : t.to(at::kCPU); }
}  // namespace

std::vector<TableSpec> ModuleBinding::Tables(const torch::nn::Module& module,
                                             const std::string& prefix,
                                             const dist_optim::OptimizerOptions& optimizer) {
  std::vector<TableSpec> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    out.push_back(TableSpec::Dense(absl::StrCat(prefix, ".", item.key()),
                                   std::vector<int64_t>(p.sizes().begin(), p.sizes().end()),
                                   p.scalar_type(), optimizer));
  }
  return out;
}

absl::StatusOr<ModuleBinding> ModuleBinding::Create(PsClient& client, torch::nn::Module& module,
                                                    const std::string& prefix) {
  std::vector<std::string> tables;
  std::vector<at::Tensor> params, values;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    tables.push_back(absl::StrCat(prefix, ".", item.key()));
    params.push_back(item.value());
    // The servers hold host tensors: a device parameter offers a host copy.
    values.push_back(OnHost(item.value().detach()));
  }
  if (tables.empty())
    return absl::InvalidArgumentError("ps ModuleBinding: module has no parameters");
  if (absl::Status s = client.InitDense(tables, values); !s.ok()) {
    return Annotate(s, absl::StrCat("ps ModuleBinding '", prefix, "'"));
  }
  ModuleBinding b(client, std::move(tables), std::move(params));
  RETURN_IF_ERROR(b.Pull());
  return b;
}

absl::Status ModuleBinding::WaitPushed() {
  if (!last_push_.valid()) return absl::OkStatus();
  absl::Status s = last_push_.status();
  last_push_ = rpc::Future<void>();
  return s;
}

absl::Status ModuleBinding::Pull() {
  RETURN_IF_ERROR(WaitPushed());
  // Written straight into the parameters' memory (detached aliases).
  std::vector<at::Tensor> into;
  into.reserve(params_.size());
  for (const auto& p : params_) into.push_back(p.detach());
  return client_->PullDenseInto(tables_, std::move(into)).status();
}

rpc::Future<void> ModuleBinding::Push(bool end_step) {
  std::vector<at::Tensor> grads;
  grads.reserve(params_.size());
  for (const auto& p : params_) {
    // A host parameter's gradient is sent from its own memory; a device
    // parameter's is copied to the host first (the copy waits for the
    // backward pass that made it, on the current stream).
    grads.push_back(p.grad().defined() ? OnHost(p.grad()) : at::zeros(p.sizes(), p.scalar_type()));
  }
  last_push_ = client_->PushDense(tables_, grads, end_step);
  return last_push_;
}

}  // namespace baton::ps
