// Element-wise reduction kernels for CPU tensors, in the shape gloo expects
// (out, a, b, n): out[i] = op(a[i], b[i]); out may alias a or b.
//
// Thread-safety: stateless.
#ifndef BATON_COMM_INTERNAL_REDUCE_KERNELS_H_
#define BATON_COMM_INTERNAL_REDUCE_KERNELS_H_

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <functional>

#include "absl/status/statusor.h"
#include "comm/types.h"

namespace baton::comm::internal {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

// The kernel for `op` on `type`, where AVG maps to SUM (the caller divides).
// INVALID_ARGUMENT for a dtype the op does not support.
absl::StatusOr<ReduceFn> GetReduceFn(c10::ScalarType type, ReduceOp op);

}  // namespace baton::comm::internal

#endif  // BATON_COMM_INTERNAL_REDUCE_KERNELS_H_
