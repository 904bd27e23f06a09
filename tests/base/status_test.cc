// base/status.h and base/grpc_status.h: the code mapping between absl and
// gRPC, every code both ways, and the wire decoding of codes.
#include <gtest/gtest.h>

#include "base/grpc_status.h"
#include "base/status.h"

namespace baton {
namespace {

TEST(Status, EveryCodeMapsToTheSameMeaningAndBack) {
  const std::pair<absl::StatusCode, grpc::StatusCode> pairs[] = {
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [a, g] : pairs) {
    const grpc::Status out = ToGrpcStatus(absl::Status(a, "why"));
    EXPECT_EQ(out.error_code(), g) << absl::StatusCodeToString(a);
    EXPECT_EQ(out.error_message(), "why");
    const absl::Status back = FromGrpcStatus(grpc::Status(g, "because"));
    EXPECT_EQ(back.code(), a);
    EXPECT_EQ(back.message(), "because");
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(Status, UnknownCodesBecomeUnknownWithTheNumber) {
  // 20: no gRPC code has it, but grpc::StatusCode can hold it (a value
  // outside the enum's range, such as 42, is undefined behaviour to even
  // load, as UBSan reports; gRPC itself never produces one).
  const absl::Status s = FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(20), "odd"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_NE(s.message().find("20"), absl::string_view::npos);
  EXPECT_NE(s.message().find("odd"), absl::string_view::npos);
  const absl::Status w = StatusFromWire(99, "far");
  EXPECT_EQ(w.code(), absl::StatusCode::kUnknown);
  EXPECT_NE(w.message().find("99"), absl::string_view::npos);
  EXPECT_EQ(StatusFromWire(14, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(StatusFromWire(0, "").ok());
}

TEST(Status, AnnotateKeepsTheCode) {
  const absl::Status s = Annotate(absl::NotFoundError("no key"), "reading k");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "reading k: no key");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace baton
