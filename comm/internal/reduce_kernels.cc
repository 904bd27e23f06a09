#include "comm/internal/reduce_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace baton::comm::internal {
namespace {

struct Sum {
  template <typename T>
  T operator()(T a, T b) const {
    return a + b;
  }
};
struct Product {
  template <typename T>
  T operator()(T a, T b) const {
    return a * b;
  }
};
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};
struct Or {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a | b) != 0; }
};
struct And {
  uint8_t operator()(uint8_t a, uint8_t b) const { return (a != 0) & (b != 0); }
};

// `Lanes` scalars of T per element (2 for complex numbers, which only SUM).
template <typename T, typename Op, size_t Lanes = 1>
void Apply(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  const Op op;
  n *= Lanes;
  for (size_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
}

template <typename T, size_t Lanes = 1>
ReduceFn ForOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return &Apply<T, Sum, Lanes>;
    case ReduceOp::kProduct: return &Apply<T, Product, Lanes>;
    case ReduceOp::kMin: return &Apply<T, Min, Lanes>;
    case ReduceOp::kMax: return &Apply<T, Max, Lanes>;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<ReduceFn> GetReduceFn(c10::ScalarType type, ReduceOp op) {
  switch (type) {
    case c10::kFloat: return ForOp<float>(op);
    case c10::kDouble: return ForOp<double>(op);
    case c10::kHalf: return ForOp<c10::Half>(op);
    case c10::kBFloat16: return ForOp<c10::BFloat16>(op);
    case c10::kChar: return ForOp<int8_t>(op);
    case c10::kByte: return ForOp<uint8_t>(op);
    case c10::kShort: return ForOp<int16_t>(op);
    case c10::kInt: return ForOp<int32_t>(op);
    case c10::kLong: return ForOp<int64_t>(op);
    case c10::kBool:
      if (op == ReduceOp::kSum || op == ReduceOp::kMax) {
        return ReduceFn(&Apply<uint8_t, Or>);
      }
      if (op == ReduceOp::kProduct || op == ReduceOp::kMin) {
        return ReduceFn(&Apply<uint8_t, And>);
      }
      break;
    case c10::kComplexFloat:
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) {
        return ReduceFn(&Apply<float, Sum, 2>);
      }
      break;
    case c10::kComplexDouble:
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) {
        return ReduceFn(&Apply<double, Sum, 2>);
      }
      break;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("reduce op ", ReduceOpName(op),
                                                 " does not support dtype ", c10::toString(type)));
}

}  // namespace baton::comm::internal
