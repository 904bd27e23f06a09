#include "dist_optim/functional_optimizer.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not in ATen.h of LibTorch 2.x)
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "base/byte_io.h"
#include "base/status_macros.h"

namespace baton::dist_optim {
namespace internal {

// One parameter's state, named as in LibTorch's *ParamState. Buffers that the
// options do not use stay undefined. `step` counts the steps in which this
// parameter had a gradient (LibTorch's per-parameter step; SGD uses it only
// to tell the first momentum step).
struct ParamState {
  std::atomic<int64_t> step{0};
  at::Tensor momentum_buffer;  // SGD with momentum != 0, RMSprop momentum > 0
  at::Tensor exp_avg;          // Adam, AdamW
  at::Tensor exp_avg_sq;       // Adam, AdamW
  at::Tensor max_exp_avg_sq;   // Adam, AdamW with amsgrad
  at::Tensor sum;              // Adagrad
  at::Tensor square_avg;       // RMSprop
  at::Tensor grad_avg;         // RMSprop centered
};

}  // namespace internal

namespace {

using internal::ParamState;

// The buffers in their fixed order on the wire; bit i of a state's buffer
// mask stands for kBuffers[i].
struct BufferField {
  const char* name;
  at::Tensor ParamState::*member;
};
const BufferField kBuffers[] = {
    {"momentum_buffer", &ParamState::momentum_buffer},
    {"exp_avg", &ParamState::exp_avg},
    {"exp_avg_sq", &ParamState::exp_avg_sq},
    {"max_exp_avg_sq", &ParamState::max_exp_avg_sq},
    {"sum", &ParamState::sum},
    {"square_avg", &ParamState::square_avg},
    {"grad_avg", &ParamState::grad_avg},
};
constexpr int kNumBuffers = sizeof(kBuffers) / sizeof(kBuffers[0]);

uint8_t BufferMask(const ParamState& s) {
  uint8_t mask = 0;
  for (int b = 0; b < kNumBuffers; ++b) {
    if ((s.*kBuffers[b].member).defined()) mask |= 1 << b;
  }
  return mask;
}

std::string BufferNames(uint8_t mask) {
  std::string names;
  for (int b = 0; b < kNumBuffers; ++b) {
    if (mask & (1 << b)) absl::StrAppend(&names, names.empty() ? "" : ", ", kBuffers[b].name);
  }
  return absl::StrCat("{", names, "}");
}

// "Float[2, 3] on cpu".
std::string Describe(const at::Tensor& t) {
  return absl::StrCat(c10::toString(t.scalar_type()), c10::str(t.sizes()), " on ",
                      t.device().str());
}

absl::Status FromException(const std::exception& e, absl::string_view what) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  return absl::InternalError(absl::StrCat(
      what, ": LibTorch error: ", torch_error ? torch_error->what_without_backtrace() : e.what()));
}

// A fresh state with every buffer the options use, valued as LibTorch
// initializes them. REQUIRES: NoGradGuard.
std::unique_ptr<ParamState> NewState(const OptimizerOptions& o, const at::Tensor& p) {
  auto s = std::make_unique<ParamState>();
  auto zeros = [&] { return at::zeros_like(p, at::MemoryFormat::Preserve); };
  switch (o.kind) {
    case OptimizerKind::kSGD:
      // LibTorch creates this buffer as a copy of the first update; see StepSGD.
      if (o.momentum != 0) s->momentum_buffer = zeros();
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      s->exp_avg = zeros();
      s->exp_avg_sq = zeros();
      if (o.amsgrad) s->max_exp_avg_sq = zeros();
      break;
    case OptimizerKind::kAdagrad:
      s->sum = at::full_like(p, o.initial_accumulator_value, at::TensorOptions(),
                             at::MemoryFormat::Preserve);
      break;
    case OptimizerKind::kRMSprop:
      s->square_avg = zeros();
      if (o.momentum > 0) s->momentum_buffer = zeros();
      if (o.centered) s->grad_avg = zeros();
      break;
  }
  return s;
}

// The update rules. Each mirrors the body of the parameter loop of LibTorch
// 1.13's step() (torch/csrc/api/src/optim/<kind>.cpp), operation for
// operation, so that results match bit for bit. REQUIRES: NoGradGuard.

void StepSGD(const OptimizerOptions& o, at::Tensor& p, const at::Tensor& grad, ParamState& s) {
  const int64_t step = ++s.step;
  at::Tensor d_p = grad;
  if (o.weight_decay != 0) d_p = d_p.add(p, o.weight_decay);
  if (o.momentum != 0) {
    at::Tensor& buf = s.momentum_buffer;
    if (step == 1) {
      buf.copy_(d_p);  // LibTorch: buf = clone(d_p).
    } else {
      buf.mul_(o.momentum).add_(d_p, 1 - o.dampening);
    }
    d_p = o.nesterov ? d_p.add(buf, o.momentum) : buf;
  }
  p.add_(d_p, -1 * o.lr);
}

// Adam (decoupled = false) and AdamW (decoupled = true).
void StepAdam(const OptimizerOptions& o, bool decoupled, at::Tensor& p, const at::Tensor& grad,
              ParamState& s) {
  if (decoupled && o.weight_decay != 0) p.mul_(1 - o.lr * o.weight_decay);
  const int64_t step = ++s.step;
  const double bias_correction1 = 1 - std::pow(o.beta1, step);
  const double bias_correction2 = 1 - std::pow(o.beta2, step);
  at::Tensor g = grad;
  if (!decoupled && o.weight_decay != 0) g = g.add(p, o.weight_decay);

  s.exp_avg.mul_(o.beta1).add_(g, 1 - o.beta1);
  s.exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  at::Tensor denom;
  if (o.amsgrad) {
    at::max_out(s.max_exp_avg_sq, s.exp_avg_sq, s.max_exp_avg_sq);
    denom = (s.max_exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
  } else {
    denom = (s.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
  }
  const double step_size = o.lr / bias_correction1;
  p.addcdiv_(s.exp_avg, denom, -step_size);
}

void StepAdagrad(const OptimizerOptions& o, at::Tensor& p, const at::Tensor& grad, ParamState& s) {
  const int64_t step = ++s.step;
  at::Tensor g = grad;
  if (o.weight_decay != 0) g = g.add(p, o.weight_decay);
  const double clr = o.lr / (1 + static_cast<double>(step - 1) * o.lr_decay);
  s.sum.addcmul_(g, g, 1.0);
  const at::Tensor std = s.sum.sqrt().add_(o.eps);
  p.addcdiv_(g, std, -clr);
}

void StepRMSprop(const OptimizerOptions& o, at::Tensor& p, const at::Tensor& grad, ParamState& s) {
  ++s.step;
  at::Tensor g = grad;
  if (o.weight_decay != 0) g = g.add(p, o.weight_decay);
  s.square_avg.mul_(o.alpha).addcmul_(g, g, 1 - o.alpha);
  at::Tensor avg;
  if (o.centered) {
    s.grad_avg.mul_(o.alpha).add_(g, 1 - o.alpha);
    avg = s.square_avg.addcmul(s.grad_avg, s.grad_avg, -1).sqrt_().add_(o.eps);
  } else {
    avg = s.square_avg.sqrt().add_(o.eps);
  }
  if (o.momentum > 0) {
    s.momentum_buffer.mul_(o.momentum).addcdiv_(g, avg);
    p.add_(s.momentum_buffer, -o.lr);
  } else {
    p.addcdiv_(g, avg, -o.lr);
  }
}

absl::Status CheckGrad(size_t i, const at::Tensor& param, const at::Tensor& grad) {
  if (grad.layout() != at::kStrided || grad.sizes() != param.sizes() ||
      grad.scalar_type() != param.scalar_type() || grad.device() != param.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient ", i, " is ", grad.is_sparse() ? "sparse " : "", Describe(grad),
                     " but parameter ", i, " is ", Describe(param),
                     " (gradients must be dense and match their parameter's shape, dtype "
                     "and device)"));
  }
  return absl::OkStatus();
}

// State wire form, version 1 (integers little-endian):
//   magic "BTNOPTS1" | u8 kind | i64 steps_taken | u64 num_params |
//   per parameter: u8 dtype (c10::ScalarType) | u64 ndim | i64 dims[ndim] |
//     i64 step | u8 buffer mask (bit i: kBuffers[i]) |
//     per buffer in the mask, in kBuffers order: the buffer's elements,
//     contiguous, raw host-order bytes (numel * element size).
constexpr absl::string_view kStateMagic = "BTNOPTS1";

absl::Status StateDataLoss(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("optimizer state: ", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<FunctionalOptimizer>> FunctionalOptimizer::Create(
    const OptimizerOptions& options, std::vector<at::Tensor> params) {
  RETURN_IF_ERROR(ValidateOptions(options));
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", i, " is an undefined tensor"));
    }
    if (!p.is_floating_point() || p.layout() != at::kStrided) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", i, " is ", Describe(p), " (", c10::str(p.layout()),
                       "); parameters must be dense floating-point tensors"));
    }
  }
  std::vector<std::unique_ptr<ParamState>> state;
  try {
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : params) state.push_back(NewState(options, p));
  } catch (const std::exception& e) {
    return FromException(e, "allocating optimizer state");
  }
  return absl::WrapUnique(new FunctionalOptimizer(options, std::move(params), std::move(state)));
}

FunctionalOptimizer::FunctionalOptimizer(const OptimizerOptions& options,
                                         std::vector<at::Tensor> params,
                                         std::vector<std::unique_ptr<ParamState>> state)
    : options_(options), params_(std::move(params)), state_(std::move(state)) {}

FunctionalOptimizer::~FunctionalOptimizer() = default;

absl::Status FunctionalOptimizer::Step(const std::vector<at::Tensor>& grads) {
  if (grads.size() != params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(KindName(options_.kind), " step got ",
                                                   grads.size(), " gradients for ", params_.size(),
                                                   " parameters"));
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    RETURN_IF_ERROR(CheckGrad(i, params_[i], grads[i]));
  }
  try {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!grads[i].defined()) continue;
      at::Tensor p = params_[i];
      ParamState& s = *state_[i];
      switch (options_.kind) {
        case OptimizerKind::kSGD: StepSGD(options_, p, grads[i], s); break;
        case OptimizerKind::kAdam: StepAdam(options_, /*decoupled=*/false, p, grads[i], s); break;
        case OptimizerKind::kAdamW: StepAdam(options_, /*decoupled=*/true, p, grads[i], s); break;
        case OptimizerKind::kAdagrad: StepAdagrad(options_, p, grads[i], s); break;
        case OptimizerKind::kRMSprop: StepRMSprop(options_, p, grads[i], s); break;
      }
    }
  } catch (const std::exception& e) {
    // Not expected after the checks above; the step may be partly applied.
    return FromException(e, absl::StrCat(KindName(options_.kind), " step"));
  }
  ++steps_taken_;
  return absl::OkStatus();
}

absl::StatusOr<std::string> FunctionalOptimizer::SaveState() const {
  ByteWriter w;
  w.Raw(kStateMagic.data(), kStateMagic.size());
  w.U8(static_cast<uint8_t>(options_.kind));
  w.I64(steps_taken_.load());
  w.U64(params_.size());
  try {
    for (size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& p = params_[i];
      const ParamState& s = *state_[i];
      w.U8(static_cast<uint8_t>(p.scalar_type()));
      w.U64(static_cast<uint64_t>(p.dim()));
      for (int64_t d : p.sizes()) w.I64(d);
      w.I64(s.step.load());
      w.U8(BufferMask(s));
      for (const BufferField& field : kBuffers) {
        const at::Tensor& buffer = s.*field.member;
        if (!buffer.defined()) continue;
        const at::Tensor host = buffer.to(at::kCPU).contiguous();
        w.Raw(host.data_ptr(), host.nbytes());
      }
    }
  } catch (const std::exception& e) {
    return FromException(e, "SaveState");
  }
  return w.Release();
}

absl::Status FunctionalOptimizer::LoadState(absl::string_view bytes) {
  ByteReader r(bytes);
  absl::string_view magic;
  if (!r.Raw(kStateMagic.size(), &magic) || magic != kStateMagic) {
    return StateDataLoss("does not start with the state magic (not a saved state)");
  }
  uint8_t kind = 0;
  int64_t steps_taken = 0;
  uint64_t num_params = 0;
  if (!r.U8(&kind) || !r.I64(&steps_taken) || !r.U64(&num_params)) {
    return StateDataLoss("truncated header");
  }
  if (kind > static_cast<uint8_t>(OptimizerKind::kRMSprop) || steps_taken < 0) {
    return StateDataLoss(
        absl::StrCat("bad header (kind ", kind, ", steps_taken ", steps_taken, ")"));
  }
  if (kind != static_cast<uint8_t>(options_.kind) || num_params != params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer state is for ", KindName(static_cast<OptimizerKind>(kind)), " over ", num_params,
        " parameters; this optimizer is ", KindName(options_.kind), " over ", params_.size()));
  }
  std::vector<std::unique_ptr<ParamState>> state;
  try {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& p = params_[i];
      const std::string where = absl::StrCat("parameter ", i);
      uint8_t dtype = 0;
      uint64_t ndim = 0;
      if (!r.U8(&dtype) || !r.U64(&ndim) || ndim > r.remaining() / 8) {
        return StateDataLoss(absl::StrCat("truncated at ", where));
      }
      std::vector<int64_t> dims(ndim);
      for (int64_t& d : dims) r.I64(&d);  // Length checked above.
      if (dtype != static_cast<uint8_t>(p.scalar_type()) || dims != p.sizes().vec()) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state for ", where, " has dtype code ", dtype, " and shape ",
                         c10::str(at::IntArrayRef(dims)), "; the parameter is ", Describe(p)));
      }
      int64_t step = 0;
      uint8_t mask = 0;
      if (!r.I64(&step) || !r.U8(&mask)) {
        return StateDataLoss(absl::StrCat("truncated at ", where));
      }
      if (step < 0 || mask >= (1 << kNumBuffers)) {
        return StateDataLoss(
            absl::StrCat("bad step ", step, " or buffer mask ", mask, " at ", where));
      }
      std::unique_ptr<ParamState> s = NewState(options_, p);
      if (mask != BufferMask(*s)) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer state for ", where, " has buffers ", BufferNames(mask), " but ",
                         options_.DebugString(), " uses ", BufferNames(BufferMask(*s))));
      }
      s->step = step;
      const size_t nbytes = p.numel() * p.element_size();
      for (const BufferField& field : kBuffers) {
        at::Tensor& buffer = (*s).*field.member;
        if (!buffer.defined()) continue;
        absl::string_view data;
        if (!r.Raw(nbytes, &data)) {
          return StateDataLoss(absl::StrCat("truncated in ", field.name, " of ", where));
        }
        at::Tensor host = at::empty(p.sizes(), at::TensorOptions().dtype(p.scalar_type()));
        if (nbytes > 0) std::memcpy(host.data_ptr(), data.data(), nbytes);
        buffer.copy_(host);
      }
      state.push_back(std::move(s));
    }
  } catch (const std::exception& e) {
    return FromException(e, "LoadState");
  }
  if (r.remaining() != 0) {
    return StateDataLoss(absl::StrCat(r.remaining(), " unexpected trailing bytes"));
  }
  state_.swap(state);
  steps_taken_ = steps_taken;
  return absl::OkStatus();
}

}  // namespace baton::dist_optim
