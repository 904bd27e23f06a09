// The one mapping between absl::Status and grpc::Status, for the layers that
// speak gRPC (the store, the gRPC transport). Kept out of base/status.h so
// that public headers never pull in gRPC.
//
// Contract: every code maps to the code of the same meaning, written out
// case by case (not a cast), and back; a gRPC code absl does not know
// becomes UNKNOWN with the number in the message. Messages are kept.
// tests/base/status_test.cc checks every code both ways.
//
// Thread-safety: stateless.
#ifndef BATON_BASE_GRPC_STATUS_H_
#define BATON_BASE_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace baton {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace baton

#endif  // BATON_BASE_GRPC_STATUS_H_
