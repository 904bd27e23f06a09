#include "dist_optim/optimizer_options.h"

#include <array>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/byte_io.h"

namespace baton::dist_optim {
namespace {

constexpr uint8_t kOptionsWireVersion = 1;
constexpr uint8_t kFlagNesterov = 1 << 0;
constexpr uint8_t kFlagAmsgrad = 1 << 1;
constexpr uint8_t kFlagCentered = 1 << 2;
constexpr uint8_t kKnownFlags = kFlagNesterov | kFlagAmsgrad | kFlagCentered;
constexpr int kNumDoubles = 10;

bool KnownKind(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSGD:
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kRMSprop: return true;
  }
  return false;
}

// The double fields in wire order.
std::array<double*, kNumDoubles> DoubleFields(OptimizerOptions& o) {
  return {&o.lr,           &o.momentum, &o.dampening,
          &o.weight_decay, &o.beta1,    &o.beta2,
          &o.eps,          &o.lr_decay, &o.initial_accumulator_value,
          &o.alpha};
}

const char* Bool(bool b) { return b ? "true" : "false"; }

// A check of one field: OK, or INVALID_ARGUMENT naming it.
absl::Status Check(bool ok, const OptimizerOptions& o, const char* field, double value,
                   const char* requirement) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(KindName(o.kind), " option ", field, " = ", value,
                                                 " is invalid: must be ", requirement));
}

}  // namespace

const char* KindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSGD: return "SGD";
    case OptimizerKind::kAdam: return "Adam";
    case OptimizerKind::kAdamW: return "AdamW";
    case OptimizerKind::kAdagrad: return "Adagrad";
    case OptimizerKind::kRMSprop: return "RMSprop";
  }
  return "Unknown";
}

OptimizerOptions OptimizerOptions::SGD(double lr) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kSGD;
  o.lr = lr;
  return o;
}

OptimizerOptions OptimizerOptions::Adam(double lr) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdam;
  o.lr = lr;
  return o;
}

OptimizerOptions OptimizerOptions::AdamW(double lr) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.lr = lr;
  o.weight_decay = 1e-2;
  return o;
}

OptimizerOptions OptimizerOptions::Adagrad(double lr) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdagrad;
  o.lr = lr;
  o.eps = 1e-10;
  return o;
}

OptimizerOptions OptimizerOptions::RMSprop(double lr) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kRMSprop;
  o.lr = lr;
  return o;
}

std::string OptimizerOptions::DebugString() const {
  std::string s = absl::StrCat(KindName(kind), "{lr=", lr);
  switch (kind) {
    case OptimizerKind::kSGD:
      absl::StrAppend(&s, ", momentum=", momentum, ", dampening=", dampening,
                      ", nesterov=", Bool(nesterov));
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      absl::StrAppend(&s, ", beta1=", beta1, ", beta2=", beta2, ", eps=", eps,
                      ", amsgrad=", Bool(amsgrad));
      break;
    case OptimizerKind::kAdagrad:
      absl::StrAppend(&s, ", lr_decay=", lr_decay,
                      ", initial_accumulator_value=", initial_accumulator_value, ", eps=", eps);
      break;
    case OptimizerKind::kRMSprop:
      absl::StrAppend(&s, ", alpha=", alpha, ", eps=", eps, ", momentum=", momentum,
                      ", centered=", Bool(centered));
      break;
  }
  absl::StrAppend(&s, ", weight_decay=", weight_decay, "}");
  return s;
}

bool operator==(const OptimizerOptions& a, const OptimizerOptions& b) {
  return a.kind == b.kind && a.lr == b.lr && a.momentum == b.momentum &&
         a.dampening == b.dampening && a.nesterov == b.nesterov &&
         a.weight_decay == b.weight_decay && a.beta1 == b.beta1 && a.beta2 == b.beta2 &&
         a.eps == b.eps && a.amsgrad == b.amsgrad && a.lr_decay == b.lr_decay &&
         a.initial_accumulator_value == b.initial_accumulator_value && a.alpha == b.alpha &&
         a.centered == b.centered;
}

absl::Status ValidateOptions(const OptimizerOptions& o) {
  if (!KnownKind(o.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer option kind = ", static_cast<int>(o.kind), " is unknown"));
  }
  // The comparisons are written so that NaN fails them.
  auto non_negative = [&](const char* field, double v) {
    return Check(v >= 0 && std::isfinite(v), o, field, v, "finite and >= 0");
  };
  auto beta = [&](const char* field, double v) {
    return Check(v >= 0 && v < 1, o, field, v, "in [0, 1)");
  };
  if (auto s = non_negative("lr", o.lr); !s.ok()) return s;
  if (auto s = non_negative("weight_decay", o.weight_decay); !s.ok()) return s;
  switch (o.kind) {
    case OptimizerKind::kSGD:
      if (auto s = non_negative("momentum", o.momentum); !s.ok()) return s;
      if (auto s = Check(std::isfinite(o.dampening), o, "dampening", o.dampening, "finite");
          !s.ok()) {
        return s;
      }
      if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("SGD option nesterov = true is invalid: it requires momentum > 0 "
                         "and dampening = 0 (got momentum = ",
                         o.momentum, ", dampening = ", o.dampening, ")"));
      }
      return absl::OkStatus();
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      if (auto s = beta("beta1", o.beta1); !s.ok()) return s;
      if (auto s = beta("beta2", o.beta2); !s.ok()) return s;
      return non_negative("eps", o.eps);
    case OptimizerKind::kAdagrad:
      if (auto s = non_negative("lr_decay", o.lr_decay); !s.ok()) return s;
      if (auto s = non_negative("initial_accumulator_value", o.initial_accumulator_value);
          !s.ok()) {
        return s;
      }
      return non_negative("eps", o.eps);
    case OptimizerKind::kRMSprop:
      if (auto s = non_negative("alpha", o.alpha); !s.ok()) return s;
      if (auto s = non_negative("momentum", o.momentum); !s.ok()) return s;
      return non_negative("eps", o.eps);
  }
  return absl::OkStatus();
}

std::string EncodeOptions(const OptimizerOptions& options) {
  OptimizerOptions o = options;
  ByteWriter w;
  w.U8(kOptionsWireVersion);
  w.U8(static_cast<uint8_t>(o.kind));
  for (double* f : DoubleFields(o)) w.F64(*f);
  w.U8((o.nesterov ? kFlagNesterov : 0) | (o.amsgrad ? kFlagAmsgrad : 0) |
       (o.centered ? kFlagCentered : 0));
  return w.Release();
}

absl::StatusOr<OptimizerOptions> DecodeOptions(absl::string_view bytes) {
  constexpr size_t kSize = 1 + 1 + 8 * kNumDoubles + 1;
  if (bytes.size() != kSize) {
    return absl::DataLossError(
        absl::StrCat("optimizer options: expected ", kSize, " bytes, got ", bytes.size()));
  }
  ByteReader r(bytes);
  uint8_t version = 0, kind = 0, flags = 0;
  r.U8(&version);
  r.U8(&kind);
  if (version != kOptionsWireVersion) {
    return absl::DataLossError(absl::StrCat("optimizer options: unknown wire version ", version));
  }
  OptimizerOptions o;
  o.kind = static_cast<OptimizerKind>(kind);
  if (!KnownKind(o.kind)) {
    return absl::DataLossError(absl::StrCat("optimizer options: unknown kind ", kind));
  }
  for (double* f : DoubleFields(o)) r.F64(f);  // The length was checked above.
  r.U8(&flags);
  if ((flags & ~kKnownFlags) != 0) {
    return absl::DataLossError(absl::StrCat("optimizer options: unknown flag bits ", flags));
  }
  o.nesterov = (flags & kFlagNesterov) != 0;
  o.amsgrad = (flags & kFlagAmsgrad) != 0;
  o.centered = (flags & kFlagCentered) != 0;
  return o;
}

}  // namespace baton::dist_optim
