// ModuleBinding: a torch::nn::Module whose parameters live on the parameter
// servers, one dense table per parameter.
//
//   spec.tables = ps::ModuleBinding::Tables(*model, "mlp", OptimizerOptions::SGD(0.05));
//   ...
//   auto binding = ps::ModuleBinding::Create(*client, *model, "mlp").value();
//   for (...) {
//     binding.Pull();                              // parameters <- servers
//     model->zero_grad(); loss(model->forward(x), y).backward();
//     binding.Push();                              // .grad -> servers, ends the step
//   }
//
// Contract:
// - Tables() names each parameter's table "<prefix>.<parameter name>" (its
//   name in named_parameters()), with the parameter's shape and dtype.
// - Create() offers the module's current values as the tables' initial
//   values (first writer wins: with the same seed on every trainer, any one
//   of them initializes), then Pull() loads what the servers hold.
// - Pull() waits for the previous Push() (its gradients are sent from the
//   parameters' .grad memory, without a copy), then pulls every table in one
//   message per server and copies the values into the parameters in place.
//   Push() sends every parameter's .grad (zeros if it has none) and ends the
//   step; it returns at once. Both are bounded by the client's timeout.
// - Parameters may live on a device (a GPU): the servers always hold host
//   tensors. Pull() then copies the pulled values onto the device in place,
//   and Push() copies each gradient to the host before it returns (so the
//   gradient's memory may be reused at once); host parameters keep the
//   zero-copy paths above.
//
// Thread-safety: not thread-safe; one training loop uses it.
#ifndef BATON_PS_MODULE_BINDING_H_
#define BATON_PS_MODULE_BINDING_H_

#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "absl/status/statusor.h"
#include "ps/client.h"

namespace baton::ps {

class ModuleBinding {
 public:
  static std::vector<TableSpec> Tables(const torch::nn::Module& module, const std::string& prefix,
                                       const dist_optim::OptimizerOptions& optimizer);
  static absl::StatusOr<ModuleBinding> Create(PsClient& client, torch::nn::Module& module,
                                              const std::string& prefix);

  absl::Status Pull();
  rpc::Future<void> Push(bool end_step = true);
  // Waits for the last Push (bounded by the client's timeout).
  absl::Status WaitPushed();

  const std::vector<std::string>& tables() const { return tables_; }

 private:
  ModuleBinding(PsClient& client, std::vector<std::string> tables, std::vector<at::Tensor> params)
      : client_(&client), tables_(std::move(tables)), params_(std::move(params)) {}

  PsClient* client_;
  std::vector<std::string> tables_;
  std::vector<at::Tensor> params_;
  rpc::Future<void> last_push_;
};

}  // namespace baton::ps

#endif  // BATON_PS_MODULE_BINDING_H_
