// FunctionalOptimizer: the local update rule of baton's distributed optimizer.
//
// Contract: a FunctionalOptimizer holds a fixed list of parameter tensors and
// their optimizer state (per-parameter step counts and moment buffers), and
// updates the parameters in place from gradients passed explicitly to Step().
// It never reads or writes Tensor::grad(): in baton the gradients come from a
// distributed-autograd context. For dense gradients, Step() computes exactly
// what LibTorch 1.13's torch::optim::{SGD, Adam, AdamW, Adagrad, RMSprop}
// step() computes for the same parameters with .grad set to the same tensors
// (one parameter group, the same options): the same operations in the same
// order, so float results agree to the last bit on the same machine.
//
// Ownership: the optimizer keeps its own at::Tensor handles to the caller's
// parameters, which share storage: an update is visible through every handle.
// It owns its state tensors. Unlike LibTorch, all state buffers are allocated
// at Create() rather than at a parameter's first step, so Step() never
// reallocates state (see Thread-safety); the values are the same.
//
// Thread-safety: not thread-safe by itself. The distributed optimizer
// serializes Step(), SaveState() and LoadState() on one instance with a
// per-owner lock. When the user chooses HogWild, the caller lets Step() calls
// run concurrently without that lock: each updates parameters and buffers
// with in-place tensor operations and an atomic step counter, so concurrent
// steps do not corrupt the object, but their floating-point updates
// interleave (the lost-update races HogWild accepts). SaveState() and
// LoadState() REQUIRE that no Step() runs at the same time, HogWild or not.
#ifndef BATON_DIST_OPTIM_FUNCTIONAL_OPTIMIZER_H_
#define BATON_DIST_OPTIM_FUNCTIONAL_OPTIMIZER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dist_optim/optimizer_options.h"

namespace baton::dist_optim {

namespace internal {
struct ParamState;  // Defined in functional_optimizer.cc.
}  // namespace internal

class FunctionalOptimizer {
 public:
  // params: leaf tensors that Step() updates in place (under NoGradGuard).
  // INVALID_ARGUMENT for options that fail ValidateOptions, an undefined
  // parameter, a parameter that is not a dense floating-point tensor.
  static absl::StatusOr<std::unique_ptr<FunctionalOptimizer>> Create(
      const OptimizerOptions& options, std::vector<at::Tensor> params);

  ~FunctionalOptimizer();
  FunctionalOptimizer(const FunctionalOptimizer&) = delete;
  FunctionalOptimizer& operator=(const FunctionalOptimizer&) = delete;

  // grads[i] is the gradient of params()[i]. An undefined gradient skips that
  // parameter: neither it nor its state (step count included) changes, as in
  // LibTorch when .grad is undefined. INVALID_ARGUMENT, naming the index and
  // both shapes/dtypes/devices, when grads.size() != params().size() or a
  // defined gradient is sparse or differs from its parameter in shape, dtype
  // or device; every gradient is checked before any parameter changes, so no
  // parameter or state changes then.
  absl::Status Step(const std::vector<at::Tensor>& grads);

  const std::vector<at::Tensor>& params() const { return params_; }
  const OptimizerOptions& options() const { return options_; }
  // Number of Step() calls that returned OK (including ones in which every
  // gradient was undefined).
  int64_t steps_taken() const { return steps_taken_.load(); }

  // The optimizer state (steps_taken, each parameter's step count and
  // buffers) as bytes, in the format described in functional_optimizer.cc.
  // Buffers are written as raw host-order bytes, so the bytes are meant for
  // the same kind of machine (all baton targets are little-endian).
  absl::StatusOr<std::string> SaveState() const;
  // Replaces the state with one saved by SaveState(). DATA_LOSS for bytes
  // that are not such a state (garbage, truncated, trailing bytes);
  // INVALID_ARGUMENT for a well-formed state of a different optimizer (another
  // kind, number of parameters, shape or dtype, or buffers that these
  // options do not use, e.g. amsgrad on one side only). On error the state is
  // left unchanged. Options such as lr are not part of the state.
  absl::Status LoadState(absl::string_view bytes);

 private:
  FunctionalOptimizer(const OptimizerOptions& options, std::vector<at::Tensor> params,
                      std::vector<std::unique_ptr<internal::ParamState>> state);

  // Set at construction.
  const OptimizerOptions options_;
  const std::vector<at::Tensor> params_;
  // state_[i] belongs to params_[i]. The vector is replaced only by
  // LoadState (which REQUIRES no concurrent Step); Step mutates the buffers
  // in place.
  std::vector<std::unique_ptr<internal::ParamState>> state_;
  std::atomic<int64_t> steps_taken_{0};
};

}  // namespace baton::dist_optim

#endif  // BATON_DIST_OPTIM_FUNCTIONAL_OPTIMIZER_H_
