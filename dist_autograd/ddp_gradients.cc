#include "dist_autograd/ddp_gradients.h"

#include <ATen/core/Tensor.h>

namespace baton::dist_autograd {

absl::Status ContextGradients::Use(int64_t context_id) {
  auto g = GetGradients(agent_, context_id);  // checks that the context is here
  if (!g.ok()) return g.status();
  context_id_.store(context_id);
  return absl::OkStatus();
}

at::Tensor ContextGradients::Get(size_t, const at::Tensor& param) {
  auto g = GetGradient(agent_, context_id_.load(), param);
  return g.ok() ? *g : at::Tensor();
}

void ContextGradients::Set(size_t, const at::Tensor& param, const at::Tensor& grad) {
  // The context can only be missing if it ended during DDP's sync; then there
  // is nowhere to put the gradient and nothing to step with it.
  (void)SetGradient(agent_, context_id_.load(), param, grad.clone());
}

}  // namespace baton::dist_autograd
