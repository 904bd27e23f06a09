// Options of baton's functional optimizers: which update rule, and its
// hyper-parameters.
//
// Contract: OptimizerOptions is a plain value type. Its fields and defaults
// mirror LibTorch 1.13's torch::optim::{SGD,Adam,AdamW,Adagrad,RMSprop}Options;
// the static factories fill in the LibTorch defaults for one kind (the struct's
// own defaults are those of SGD and Adam, which differ from AdamW's
// weight_decay and Adagrad's eps). Fields that the chosen kind does not use are
// ignored (but still travel on the wire).
//
// This header does not include LibTorch, so wire code can use it cheaply; it
// is also reachable through "dist_optim/functional_optimizer.h".
//
// Wire form (EncodeOptions/DecodeOptions), version 1, little-endian:
//   u8 version = 1 | u8 kind | 10 x f64 (lr, momentum, dampening,
//   weight_decay, beta1, beta2, eps, lr_decay, initial_accumulator_value,
//   alpha) | u8 flags (bit0 nesterov, bit1 amsgrad, bit2 centered).
// Decoding checks the framing only; call ValidateOptions for the values.
//
// Thread-safety: everything here is stateless or a value type; distinct
// objects may be used from different threads freely.
#ifndef BATON_DIST_OPTIM_OPTIMIZER_OPTIONS_H_
#define BATON_DIST_OPTIM_OPTIMIZER_OPTIONS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::dist_optim {

enum class OptimizerKind { kSGD, kAdam, kAdamW, kAdagrad, kRMSprop };

// "SGD", "Adam", "AdamW", "Adagrad", "RMSprop"; "Unknown" for other values.
const char* KindName(OptimizerKind kind);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSGD;
  double lr = 0.01;
  // SGD (momentum is shared with RMSprop).
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  // All kinds. AdamW's LibTorch default is 1e-2: use AdamW(lr).
  double weight_decay = 0;
  // Adam / AdamW (eps is shared with Adagrad and RMSprop).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;
  // Adagrad (LibTorch's eps default for Adagrad is 1e-10: use Adagrad(lr)).
  double lr_decay = 0;
  double initial_accumulator_value = 0;
  // RMSprop.
  double alpha = 0.99;
  bool centered = false;

  // One kind with LibTorch 1.13's defaults for every other field.
  static OptimizerOptions SGD(double lr);
  static OptimizerOptions Adam(double lr);
  static OptimizerOptions AdamW(double lr);
  static OptimizerOptions Adagrad(double lr);
  static OptimizerOptions RMSprop(double lr);

  // The kind and the fields it uses, e.g.
  // "Adam{lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0, amsgrad=false}".
  std::string DebugString() const;
};

bool operator==(const OptimizerOptions& a, const OptimizerOptions& b);
inline bool operator!=(const OptimizerOptions& a, const OptimizerOptions& b) { return !(a == b); }

// OK, or INVALID_ARGUMENT naming the first bad field and its value. Checks
// what LibTorch's constructors check (lr, eps, weight_decay, momentum, alpha,
// lr_decay, initial_accumulator_value >= 0; betas in [0, 1); nesterov needs
// momentum > 0 and dampening == 0), plus: every field the kind uses is finite
// and the kind is a known one.
absl::Status ValidateOptions(const OptimizerOptions& options);

// The wire form described at the top of this file.
std::string EncodeOptions(const OptimizerOptions& options);
// DATA_LOSS for bytes that are not a version-1 encoding (wrong length or
// version, unknown kind or flag bits). Never crashes on any input.
absl::StatusOr<OptimizerOptions> DecodeOptions(absl::string_view bytes);

}  // namespace baton::dist_optim

#endif  // BATON_DIST_OPTIM_OPTIMIZER_OPTIONS_H_
