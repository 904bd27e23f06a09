// GrpcTransport (rpc/internal/transport.h) between two transports in one
// process, on loopback: how a stream comes up over a slow link.
#include <memory>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/internal/transport.h"
#include "tests/slow_link.h"

namespace baton::rpc::internal {
namespace {

// Answers every request with a response carrying its id, and records what
// comes back and which streams ended.
class Echo : public TransportHandler {
 public:
  void OnRequest(std::shared_ptr<ReplyChannel> channel, Frame frame) override {
    Frame reply;
    reply.header.set_kind(proto::FrameHeader::RESPONSE);
    reply.header.set_id(frame.header.id());
    (void)channel->Send(std::move(reply));
  }
  void OnResponse(int peer, Frame frame) override {
    absl::MutexLock lock(&mu_);
    responses_.push_back(frame.header.id());
  }
  void OnStreamClosed(int peer, uint64_t stream_id, const absl::Status& cause) override {
    absl::MutexLock lock(&mu_);
    closed_.push_back(cause);
  }
  // Waits up to `timeout` for `n` responses; returns how many came.
  size_t AwaitResponses(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return responses_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return responses_.size();
  }
  std::vector<absl::Status> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<uint64_t> responses_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
};

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
  Echo caller_side, callee_side;
  auto callee = GrpcTransport::Start({"127.0.0.1:0", "token", 1 << 20}, &callee_side);
  ASSERT_TRUE(callee.ok()) << callee.status();
  auto caller = GrpcTransport::Start({"127.0.0.1:0", "token", 1 << 20}, &caller_side);
  ASSERT_TRUE(caller.ok()) << caller.status();
  auto link = testing::SlowLink::Start((*callee)->address(), absl::Milliseconds(1500));
  ASSERT_TRUE(link.ok()) << link.status();
  (*caller)->AddPeer(1, (*link)->address());
  const absl::Time t0 = absl::Now();
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE((*caller)->Send(1, Request(id)).ok());
  EXPECT_EQ(caller_side.AwaitResponses(3, absl::Seconds(15)), 3u);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(1500));
  EXPECT_TRUE(caller_side.closed().empty());
  EXPECT_EQ((*link)->accepted(), 1);
  EXPECT_TRUE((*caller)->CloseStreams(/*cancel=*/false, absl::Seconds(5)).ok());
  (*caller)->StopServer(absl::ZeroDuration());
  (*callee)->StopServer(absl::ZeroDuration());
}

}  // namespace
}  // namespace baton::rpc::internal
