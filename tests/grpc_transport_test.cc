// GrpcTransport (rpc/internal/transport.h) between two transports in one
// process, on loopback: how a stream comes up over a slow link.
#include <memory>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/internal/transport.h"
#include "tests/slow_link.h"
#include "tests/transport_recorder.h"

namespace baton::rpc::internal {
namespace {

Frame Request(uint64_t id) {
  Frame f;
  f.header.set_kind(proto::FrameHeader::REQUEST);
  f.header.set_id(id);
  f.header.set_function("echo");
  return f;
}

// The first call to a peer whose link delays the handshake well past the
// reconnect backoff (500 ms at most) waits for the connection instead of
// failing with UNAVAILABLE ("tcp handshaker shutdown"): gRPC gives each
// connection attempt GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, once set to 50 ms.
TEST(GrpcTransport, FirstCallOverALinkSlowerThanTheReconnectBackoffArrives) {
  Recorder caller_side, callee_side;
  auto callee = GrpcTransport::Start({"127.0.0.1:0", "token", 1 << 20}, &callee_side);
  ASSERT_TRUE(callee.ok()) << callee.status();
  auto caller = GrpcTransport::Start({"127.0.0.1:0", "token", 1 << 20}, &caller_side);
  ASSERT_TRUE(caller.ok()) << caller.status();
  auto link = testing::SlowLink::Start((*callee)->address(), absl::Milliseconds(1500));
  ASSERT_TRUE(link.ok()) << link.status();
  (*caller)->AddPeer(1, (*link)->address());
  const absl::Time t0 = absl::Now();
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE((*caller)->Send(1, Request(id)).ok());
  EXPECT_TRUE(caller_side.WaitResponses(3, absl::Seconds(15)));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(1500));
  {
    absl::MutexLock lock(&caller_side.mu_);
    EXPECT_TRUE(caller_side.closed_.empty());
  }
  EXPECT_EQ((*link)->accepted(), 1);
  EXPECT_TRUE((*caller)->CloseStreams(/*cancel=*/false, absl::Seconds(5)).ok());
  (*caller)->StopServer(absl::ZeroDuration());
  (*callee)->StopServer(absl::ZeroDuration());
}

}  // namespace
}  // namespace baton::rpc::internal
