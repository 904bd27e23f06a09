// Transport conformance, the part only a NetworkTransport has (gRPC and the
// loopback fake; conformance_test.cc holds the rest and says how to add an
// implementation): a stream with another job token is refused
// (UNAUTHENTICATED) before any frame is read; AddPeer with a new address or
// identity sends on a new stream; live_streams() counts outgoing streams;
// CloseStreams() keeps its bound when the peer never finishes the stream.
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tests/transport/conformance_harness.h"

namespace baton::rpc::conformance {
namespace {

// ---- NetworkTransport only -------------------------------------------------

class NetworkTransportConformance : public TransportConformance {
 protected:
  NetworkTransport& NA() { return *backend_->network(kA); }
  NetworkTransport& NB() { return *backend_->network(kB); }

  // Another endpoint with `token`, its handler `h` (which outlives it).
  std::unique_ptr<NetworkTransport> StartAnother(const std::string& token, Endpoint* h) {
    auto t = backend_->StartAnother(token, h);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }
  // Closes and destroys `t`, then checks its handler's contract.
  void Finish(std::unique_ptr<NetworkTransport> t, Endpoint* h, const std::string& who) {
    EXPECT_TRUE(NetworkBackend::CloseNetwork(*t).ok());
    h->MarkClosed();
    h->StopAnswering();
    t.reset();
    h->ExpectContractKept(who);
  }
};

// A stream whose job token differs is refused before any frame is read: its
// opener hears it end with UNAUTHENTICATED naming the token (OnStreamClosed
// or OnStreamRefused), the server's handler sees nothing of it, and the
// server goes on serving its other callers.
TEST_P(NetworkTransportConformance, AStreamWithAnotherJobTokenIsRefused) {
  Endpoint c_handler;
  std::unique_ptr<NetworkTransport> c = StartAnother("another token", &c_handler);
  ASSERT_NE(c, nullptr);
  c->AddPeer(kB, NB().address(), "");
  auto s = c->Send(kB, Request(2, 1, 16));
  if (!s.ok()) {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kUnauthenticated) << s.status();
  } else {
    ASSERT_TRUE(c_handler.WaitEndingOf(kB, {*s})) << "the refused stream never ended";
    const std::vector<Ending> endings = c_handler.EndingsOf(kB, {*s});
    ASSERT_EQ(endings.size(), 1u);
    EXPECT_EQ(endings[0].cause.code(), absl::StatusCode::kUnauthenticated) << endings[0].cause;
    EXPECT_TRUE(absl::StrContains(endings[0].cause.message(), "token")) << endings[0].cause;
  }
  ASSERT_TRUE(A().Send(kB, Request(kA, 1, 16)).ok());
  ASSERT_TRUE(a_.WaitResponses(1));
  {
    absl::MutexLock lock(&b_.mu_);
    ASSERT_EQ(b_.requests_.size(), 1u);
    EXPECT_EQ(b_.requests_[0].header.caller_id(), kA);
  }
  {
    absl::MutexLock lock(&c_handler.mu_);
    EXPECT_TRUE(c_handler.responses_.empty());
  }
  Finish(std::move(c), &c_handler, "C");
}

// AddPeer() with another address (a restarted worker) and then with another
// identity sends the next frames on a new stream, to the new address only;
// CloseStreams() ends the retired streams too.
TEST_P(NetworkTransportConformance, AddingAPeerAgainWithAnotherAddressOrIdentityUsesANewStream) {
  auto s1 = A().Send(kB, Request(kA, 1, 16));
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_TRUE(a_.WaitResponses(1));
  Endpoint b2_handler;
  std::unique_ptr<NetworkTransport> b2 = StartAnother(kToken, &b2_handler);
  ASSERT_NE(b2, nullptr);
  NA().AddPeer(kB, b2->address(), "");
  auto s2 = A().Send(kB, Request(kA, 2, 16));
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_NE(*s2, *s1);
  ASSERT_TRUE(b2_handler.WaitRequests(1));
  ASSERT_TRUE(a_.WaitResponses(2));
  NA().AddPeer(kB, b2->address(), "incarnation 2");
  auto s3 = A().Send(kB, Request(kA, 3, 16));
  ASSERT_TRUE(s3.ok()) << s3.status();
  EXPECT_NE(*s3, *s1);
  EXPECT_NE(*s3, *s2);
  ASSERT_TRUE(b2_handler.WaitRequests(2));
  ASSERT_TRUE(a_.WaitResponses(3));
  {
    absl::MutexLock lock(&b_.mu_);
    ASSERT_EQ(b_.requests_.size(), 1u);
    EXPECT_EQ(b_.requests_[0].header.id(), 1u);
  }
  {
    absl::MutexLock lock(&b2_handler.mu_);
    ASSERT_EQ(b2_handler.requests_.size(), 2u);
    EXPECT_EQ(b2_handler.requests_[0].header.id(), 2u);
    EXPECT_EQ(b2_handler.requests_[1].header.id(), 3u);
  }
  {
    absl::MutexLock lock(&a_.mu_);
    std::set<uint64_t> answered;
    for (const auto& [from, f] : a_.responses_) {
      EXPECT_EQ(from, kB);
      answered.insert(f.header.id());
    }
    EXPECT_EQ(answered, (std::set<uint64_t>{1, 2, 3}));
  }
  const absl::Status closed = NA().CloseStreams(/*cancel=*/false, kCloseTimeout);
  EXPECT_TRUE(closed.ok()) << closed;
  EXPECT_EQ(NA().live_streams(), 0);
  Finish(std::move(b2), &b2_handler, "B2");
}

// live_streams() counts the outgoing streams open: none before a send, one
// per peer however many frames went, none once CloseStreams() returned; an
// incoming stream does not count.
TEST_P(NetworkTransportConformance, LiveStreamsCountsOpenOutgoingStreams) {
  EXPECT_EQ(NA().live_streams(), 0);
  EXPECT_EQ(NB().live_streams(), 0);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(A().Send(kB, Request(kA, id, 16)).ok());
  ASSERT_TRUE(a_.WaitResponses(3));
  EXPECT_EQ(NA().live_streams(), 1);
  EXPECT_EQ(NB().live_streams(), 0);
  Endpoint c_handler;
  std::unique_ptr<NetworkTransport> c = StartAnother(kToken, &c_handler);
  ASSERT_NE(c, nullptr);
  NA().AddPeer(2, c->address(), "");
  ASSERT_TRUE(A().Send(2, Request(kA, 4, 16)).ok());
  ASSERT_TRUE(a_.WaitResponses(4));
  EXPECT_EQ(NA().live_streams(), 2);
  const absl::Time start = absl::Now();
  const absl::Status closed = NA().CloseStreams(/*cancel=*/false, kCloseTimeout);
  EXPECT_LE(absl::Now() - start, kCloseTimeout + kSlack);
  EXPECT_TRUE(closed.ok()) << closed;
  EXPECT_EQ(NA().live_streams(), 0);
  EXPECT_FALSE(A().connected(kB));
  const absl::Status late = A().Send(kB, Request(kA, 5, 16)).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  Finish(std::move(c), &c_handler, "C");
}

// CloseStreams() returns within its timeout (and scheduling slack) even when
// the peer never ends the stream: here B never answers the stream's
// authentication (gRPC) or its request (loopback, which does not ask).
TEST_P(NetworkTransportConformance, CloseStreamsKeepsItsBoundWhenThePeerNeverEndsTheStream) {
  {
    absl::MutexLock lock(&b_.mu_);
    b_.hold_authentication_ = true;
  }
  ASSERT_TRUE(A().Send(kB, Request(kA, 1, 16, kHold)).ok());
  ASSERT_TRUE(b_.WaitStreamSeen());
  const absl::Duration timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  const absl::Status closed = NA().CloseStreams(/*cancel=*/false, timeout);
  const absl::Duration took = absl::Now() - start;
  EXPECT_LE(took, timeout + kSlack) << closed;
  EXPECT_TRUE(closed.ok() || absl::IsDeadlineExceeded(closed)) << closed;
  b_.AnswerHeldAuthentication(absl::PermissionDeniedError("the case is over"));
}

INSTANTIATE_TEST_SUITE_P(Transport, NetworkTransportConformance,
                         ::testing::Values(kGrpc, kLoopback), BackendName);

}  // namespace
}  // namespace baton::rpc::conformance
