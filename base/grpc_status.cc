#include "base/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace baton {
namespace {

grpc::StatusCode ToGrpc(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return grpc::StatusCode::OK;
    case absl::StatusCode::kCancelled: return grpc::StatusCode::CANCELLED;
    case absl::StatusCode::kUnknown: return grpc::StatusCode::UNKNOWN;
    case absl::StatusCode::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kDeadlineExceeded: return grpc::StatusCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kNotFound: return grpc::StatusCode::NOT_FOUND;
    case absl::StatusCode::kAlreadyExists: return grpc::StatusCode::ALREADY_EXISTS;
    case absl::StatusCode::kPermissionDenied: return grpc::StatusCode::PERMISSION_DENIED;
    case absl::StatusCode::kResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kFailedPrecondition: return grpc::StatusCode::FAILED_PRECONDITION;
    case absl::StatusCode::kAborted: return grpc::StatusCode::ABORTED;
    case absl::StatusCode::kOutOfRange: return grpc::StatusCode::OUT_OF_RANGE;
    case absl::StatusCode::kUnimplemented: return grpc::StatusCode::UNIMPLEMENTED;
    case absl::StatusCode::kInternal: return grpc::StatusCode::INTERNAL;
    case absl::StatusCode::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDataLoss: return grpc::StatusCode::DATA_LOSS;
    case absl::StatusCode::kUnauthenticated: return grpc::StatusCode::UNAUTHENTICATED;
    default: return grpc::StatusCode::UNKNOWN;
  }
}

// False for a number absl does not define.
bool FromGrpc(grpc::StatusCode code, absl::StatusCode* out) {
  switch (code) {
    case grpc::StatusCode::OK: *out = absl::StatusCode::kOk; return true;
    case grpc::StatusCode::CANCELLED: *out = absl::StatusCode::kCancelled; return true;
    case grpc::StatusCode::UNKNOWN: *out = absl::StatusCode::kUnknown; return true;
    case grpc::StatusCode::INVALID_ARGUMENT: *out = absl::StatusCode::kInvalidArgument; return true;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      *out = absl::StatusCode::kDeadlineExceeded;
      return true;
    case grpc::StatusCode::NOT_FOUND: *out = absl::StatusCode::kNotFound; return true;
    case grpc::StatusCode::ALREADY_EXISTS: *out = absl::StatusCode::kAlreadyExists; return true;
    case grpc::StatusCode::PERMISSION_DENIED:
      *out = absl::StatusCode::kPermissionDenied;
      return true;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      *out = absl::StatusCode::kResourceExhausted;
      return true;
    case grpc::StatusCode::FAILED_PRECONDITION:
      *out = absl::StatusCode::kFailedPrecondition;
      return true;
    case grpc::StatusCode::ABORTED: *out = absl::StatusCode::kAborted; return true;
    case grpc::StatusCode::OUT_OF_RANGE: *out = absl::StatusCode::kOutOfRange; return true;
    case grpc::StatusCode::UNIMPLEMENTED: *out = absl::StatusCode::kUnimplemented; return true;
    case grpc::StatusCode::INTERNAL: *out = absl::StatusCode::kInternal; return true;
    case grpc::StatusCode::UNAVAILABLE: *out = absl::StatusCode::kUnavailable; return true;
    case grpc::StatusCode::DATA_LOSS: *out = absl::StatusCode::kDataLoss; return true;
    case grpc::StatusCode::UNAUTHENTICATED: *out = absl::StatusCode::kUnauthenticated; return true;
    default: return false;
  }
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(ToGrpc(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::StatusCode code;
  if (!FromGrpc(status.error_code(), &code)) {
    return absl::UnknownError(absl::StrCat("gRPC status code ", status.error_code(),
                                           " (not an absl code): ", status.error_message()));
  }
  return absl::Status(code, status.error_message());
}

}  // namespace baton
