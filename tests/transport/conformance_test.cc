// Transport conformance: the contract of rpc/transport.h, checked once and
// run against every implementation, as TensorPipe runs one transport test
// per backend.
//
// - TransportConformance (every backend: gRPC, shared memory, loopback):
//   requests arrive whole and in order per sender thread; replies go back on
//   their reply channel to the call they answer; frames larger than a
//   shared-memory ring arrive whole; many frames in flight from several
//   threads both ways; a send to a peer that closed fails with UNAVAILABLE
//   or its stream ends with UNAVAILABLE; a reply channel whose stream is
//   gone says so; closing is bounded, ends sends and is followed by no
//   handler callback.
// - NetworkTransportConformance (gRPC, loopback): a stream with another job
//   token is refused (UNAUTHENTICATED) before any frame is read; AddPeer with
//   a new address or identity sends on a new stream; live_streams() counts
//   outgoing streams; CloseStreams() keeps its bound when the peer never
//   finishes the stream.
// Everywhere: every stream ends at most once (OnStreamClosed/Refused), and
// no callback reaches a handler after its endpoint was closed.
//
// Every case runs on two endpoints, A (worker id 0) and B (worker id 1),
// made by a Backend. To add an implementation: write a Backend that starts
// A and B able to send to each other, closes one as its owner does at
// shutdown and tears both down (for a NetworkTransport, a NetworkBackend
// with its factory is enough); give it a BackendCase; add that to the
// INSTANTIATE_TEST_SUITE_P of TransportConformance (and of
// NetworkTransportConformance). A case a backend fails goes in its
// known_gaps with the reason: it then skips with the reason printed, never
// silently (CONFORMANCE_RUN_KNOWN_GAPS=1 in the environment runs it anyway).
//
// Waits are on events (mutex conditions) with deadlines, never sleeps; the
// gRPC transport listens on 127.0.0.1:0.
#include "tests/transport/conformance_harness.h"

#include <gtest/gtest.h>

namespace baton::rpc::conformance {
namespace {

// Requests from one thread arrive whole (header, payload, extensions), once,
// and in the order sent.
TEST_P(TransportConformance, RequestsArriveWholeAndInOrder) {
  ASSERT_TRUE(A().connected(kB));
  ASSERT_TRUE(B().connected(kA));
  const int n = 500;
  for (int i = 1; i <= n; ++i) {
    auto s = A().Send(kB, Request(kA, i, static_cast<size_t>(i % 61) * 53));
    ASSERT_TRUE(s.ok()) << "send " << i << ": " << s.status();
  }
  ASSERT_TRUE(b_.WaitRequests(n));
  ASSERT_TRUE(a_.WaitResponses(n));
  absl::MutexLock lock(&b_.mu_);
  ASSERT_EQ(b_.requests_.size(), static_cast<size_t>(n));
  for (int i = 1; i <= n; ++i) {
    const Frame& got = b_.requests_[i - 1];
    const Frame want = Request(kA, i, static_cast<size_t>(i % 61) * 53);
    ASSERT_EQ(got.header.id(), want.header.id()) << "request " << i << " out of order";
    EXPECT_EQ(got.header.kind(), proto::FrameHeader::REQUEST);
    EXPECT_EQ(got.header.caller_id(), kA);
    EXPECT_EQ(got.header.function(), "f");
    EXPECT_EQ(got.payload.bytes, want.payload.bytes) << "request " << i;
    EXPECT_EQ(got.payload.extensions, want.payload.extensions) << "request " << i;
  }
}

// Requests both ways at once: each reply reaches the endpoint that called,
// from the peer it called, and answers the call with its id.
TEST_P(TransportConformance, RepliesGoBackOnTheReplyChannelToTheirCall) {
  const int n = 200;
  std::thread b_calls([&] {
    for (int i = 1; i <= n; ++i) {
      auto s = B().Send(kA, Request(kB, i, 100 + i));
      EXPECT_TRUE(s.ok()) << s.status();
    }
  });
  for (int i = 1; i <= n; ++i) {
    auto s = A().Send(kB, Request(kA, i, 300 + i));
    EXPECT_TRUE(s.ok()) << s.status();
  }
  b_calls.join();
  ASSERT_TRUE(a_.WaitResponses(n));
  ASSERT_TRUE(b_.WaitResponses(n));
  for (auto [who, caller, peer, base] :
       {std::make_tuple(&a_, kA, kB, 300), std::make_tuple(&b_, kB, kA, 100)}) {
    absl::MutexLock lock(&who->mu_);
    ASSERT_EQ(who->responses_.size(), static_cast<size_t>(n));
    std::set<uint64_t> answered;
    for (const auto& [from, frame] : who->responses_) {
      const uint64_t id = frame.header.id();
      EXPECT_EQ(from, peer);
      EXPECT_EQ(frame.header.kind(), proto::FrameHeader::RESPONSE);
      ASSERT_TRUE(id >= 1 && id <= static_cast<uint64_t>(n)) << id;
      EXPECT_TRUE(answered.insert(id).second) << "call " << id << " answered twice";
      EXPECT_EQ(frame.payload.bytes, Pattern(id, base + id)) << "reply to call " << id;
      EXPECT_EQ(frame.payload.extensions.at("seq"), absl::StrCat(caller, ":", id));
    }
  }
}

// Frames of about 1 MiB (16 times a shared-memory ring, so cut in fragments),
// with a blob beside the bytes, arrive whole both ways, in order with the
// small frames between them.
TEST_P(TransportConformance, FramesLargerThanARingArriveWhole) {
  const std::vector<size_t> sizes = {1 << 20, (1 << 20) + 1, 7, (1 << 20) + 4093, 0};
  for (size_t i = 0; i < sizes.size(); ++i) {
    Frame f = Request(kA, i + 1, sizes[i]);
    // A blob is named by a tensor in the payload (at least 5 bytes; wire.cc
    // refuses a frame listing more blobs than its payload can name).
    if (sizes[i] >= 5) f.payload.blobs.push_back(MakeBlob(Pattern(100 + i, sizes[i] / 4 + 3)));
    if (sizes[i] >= (1 << 20)) {
      ASSERT_GT(internal::FrameSize(f), 16 * kShmRingBytes);
    }
    auto s = A().Send(kB, std::move(f));
    ASSERT_TRUE(s.ok()) << s.status();
  }
  ASSERT_TRUE(b_.WaitRequests(sizes.size()));
  ASSERT_TRUE(a_.WaitResponses(sizes.size()));
  {
    absl::MutexLock lock(&b_.mu_);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Frame& got = b_.requests_[i];
      ASSERT_EQ(got.header.id(), i + 1);
      EXPECT_EQ(got.payload.bytes.size(), sizes[i]);
      EXPECT_TRUE(got.payload.bytes == Pattern(i + 1, sizes[i])) << "request " << i + 1;
      ASSERT_EQ(got.payload.blobs.size(), sizes[i] >= 5 ? 1u : 0u);
      if (sizes[i] < 5) continue;
      EXPECT_TRUE(Contents(got.payload.blobs[0]) == Pattern(100 + i, sizes[i] / 4 + 3))
          << "blob of request " << i + 1;
    }
  }
  absl::MutexLock lock(&a_.mu_);
  std::set<uint64_t> answered;
  for (const auto& [from, got] : a_.responses_) {
    const uint64_t id = got.header.id();
    ASSERT_TRUE(id >= 1 && id <= sizes.size()) << id;
    EXPECT_TRUE(answered.insert(id).second);
    EXPECT_TRUE(got.payload.bytes == Pattern(id, sizes[id - 1])) << "reply " << id;
    ASSERT_EQ(got.payload.blobs.size(), sizes[id - 1] >= 5 ? 1u : 0u);
    if (sizes[id - 1] < 5) continue;
    EXPECT_TRUE(Contents(got.payload.blobs[0]) == Pattern(100 + id - 1, sizes[id - 1] / 4 + 3))
        << "blob of reply " << id;
  }
}

// Four threads of A and two of B send without waiting for replies: each
// request arrives once, in its thread's order, and each is answered once.
TEST_P(TransportConformance, ManyFramesInFlightFromSeveralThreadsKeepEachThreadsOrder) {
  constexpr uint64_t kStride = 100000;
  const int per_thread = 400;
  const int a_threads = 4, b_threads = 2;
  std::vector<std::thread> threads;
  for (int t = 0; t < a_threads + b_threads; ++t) {
    threads.emplace_back([&, t] {
      const bool from_a = t < a_threads;
      Transport& self = from_a ? A() : B();
      for (int i = 0; i < per_thread; ++i) {
        auto s = self.Send(from_a ? kB : kA,
                           Request(from_a ? kA : kB, t * kStride + i, 16 + (i % 7) * 100));
        EXPECT_TRUE(s.ok()) << s.status();
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(b_.WaitRequests(a_threads * per_thread));
  ASSERT_TRUE(a_.WaitRequests(b_threads * per_thread));
  ASSERT_TRUE(a_.WaitResponses(a_threads * per_thread));
  ASSERT_TRUE(b_.WaitResponses(b_threads * per_thread));
  for (Endpoint* who : {&a_, &b_}) {
    absl::MutexLock lock(&who->mu_);
    std::map<uint64_t, int64_t> last;  // thread -> last sequence number seen
    for (const Frame& f : who->requests_) {
      const uint64_t t = f.header.id() / kStride;
      const int64_t i = static_cast<int64_t>(f.header.id() % kStride);
      auto [it, first] = last.try_emplace(t, -1);
      EXPECT_EQ(i, it->second + 1) << "thread " << t << (first ? " (first frame)" : "");
      it->second = i;
      EXPECT_EQ(f.payload.bytes, Pattern(f.header.id(), 16 + (i % 7) * 100));
    }
    for (const auto& [t, i] : last) EXPECT_EQ(i, per_thread - 1) << "thread " << t;
    std::set<uint64_t> answered;
    for (const auto& [from, f] : who->responses_) {
      EXPECT_TRUE(answered.insert(f.header.id()).second) << f.header.id() << " answered twice";
    }
  }
}

// A handler may answer inside OnRequest (the agent does for inline-safe
// functions and refusals, rpc/agent.cc): with both sides sending far more
// than a shared-memory ring holds, every request still arrives once and is
// answered once.
TEST_P(TransportConformance, RepliesSentInsideOnRequestFlowWhileBothSidesFlood) {
  a_.AnswerInline();
  b_.AnswerInline();
  constexpr uint64_t kStride = 100000;
  const int per_thread = 300;  // of 2 KiB: 1.2 MiB each way, 20 rings
  std::vector<std::thread> threads;
  std::vector<absl::Status> failed(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const bool from_a = t % 2 == 0;
      Transport& self = from_a ? A() : B();
      for (int i = 0; i < per_thread && failed[t].ok(); ++i) {
        failed[t] =
            self.Send(from_a ? kB : kA, Request(from_a ? kA : kB, t * kStride + i, 2048)).status();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) ASSERT_TRUE(failed[t].ok()) << "thread " << t << ": " << failed[t];
  ASSERT_TRUE(b_.WaitRequests(2 * per_thread));
  ASSERT_TRUE(a_.WaitRequests(2 * per_thread));
  ASSERT_TRUE(a_.WaitResponses(2 * per_thread));
  ASSERT_TRUE(b_.WaitResponses(2 * per_thread));
  for (Endpoint* who : {&a_, &b_}) {
    absl::MutexLock lock(&who->mu_);
    EXPECT_EQ(who->unsent_replies_, 0);
    std::set<uint64_t> answered;
    for (const auto& [from, f] : who->responses_) {
      EXPECT_TRUE(answered.insert(f.header.id()).second) << f.header.id() << " answered twice";
    }
  }
}

// After B closed, A's sends to it fail with UNAVAILABLE, or the stream they
// went on ends (OnStreamClosed or OnStreamRefused) with UNAVAILABLE; B's
// handler hears none of them.
TEST_P(TransportConformance, ASendToAPeerThatClosedFailsWithUnavailable) {
  ASSERT_TRUE(A().Send(kB, Request(kA, 1, 16)).ok());
  ASSERT_TRUE(a_.WaitResponses(1));  // the stream (or link) is up
  ASSERT_NO_FATAL_FAILURE(Close(kB));
  std::set<uint64_t> streams;  // those the sends after the close went on
  absl::Status failed;
  bool ended = false;
  for (uint64_t id = 2; id < 10000 && failed.ok() && !ended; ++id) {
    auto s = A().Send(kB, Request(kA, id, 1024));
    if (!s.ok()) {
      failed = s.status();
    } else {
      streams.insert(*s);
      ended = !a_.EndingsOf(kB, streams).empty();
    }
  }
  if (!failed.ok()) {
    EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
    return;
  }
  ASSERT_TRUE(ended || a_.WaitEndingOf(kB, streams))
      << "no send to the closed peer failed, and none of their streams ended";
  for (const Ending& e : a_.EndingsOf(kB, streams)) {
    EXPECT_EQ(e.cause.code(), absl::StatusCode::kUnavailable)
        << "stream " << e.stream << (e.refused ? " refused: " : " closed: ") << e.cause;
  }
}

// A reply channel whose stream is gone (its callee closed) says so: Send()
// returns false.
TEST_P(TransportConformance, AReplyChannelWhoseStreamIsGoneReturnsFalse) {
  ASSERT_TRUE(A().Send(kB, Request(kA, 1, 16, kHold)).ok());
  ASSERT_TRUE(b_.WaitRequests(1));
  std::shared_ptr<ReplyChannel> channel;
  {
    absl::MutexLock lock(&b_.mu_);
    ASSERT_EQ(b_.held_.size(), 1u);
    channel = b_.held_[0];
  }
  ASSERT_NO_FATAL_FAILURE(Close(kB));
  Frame reply;
  reply.header.set_kind(proto::FrameHeader::RESPONSE);
  reply.header.set_id(1);
  EXPECT_FALSE(channel->Send(std::move(reply)));
}

// Closing A while three of its threads and one of B's send returns within
// its bound; afterwards A is not connected, its sends fail with UNAVAILABLE
// (those of the threads caught in the middle included), and its handler
// hears nothing more, whatever B still sends or answers.
TEST_P(TransportConformance, ClosingIsBoundedEndsSendsAndSilencesTheHandler) {
  constexpr uint64_t kStride = 1000000;
  constexpr size_t kWindow = 64;  // unanswered requests per endpoint
  std::atomic<size_t> a_sent{0}, b_sent{0};
  std::vector<absl::Status> a_ends(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < kStride; ++i) {
        if (!a_.WaitRoom(a_sent.load(), kWindow)) {
          a_ends[t] = absl::DeadlineExceededError("no reply came back");
          return;
        }
        auto s = A().Send(kB, Request(kA, t * kStride + i, 64));
        if (!s.ok()) {
          a_ends[t] = s.status();
          return;
        }
        ++a_sent;
      }
    });
  }
  threads.emplace_back([&] {
    for (uint64_t i = 0;; ++i) {
      if (!b_.WaitRoom(b_sent.load(), kWindow) || b_.released()) return;
      if (!B().Send(kA, Request(kB, i, 64)).ok()) return;
      ++b_sent;
    }
  });
  // Traffic flows both ways.
  EXPECT_TRUE(b_.WaitRequests(200));
  EXPECT_TRUE(a_.WaitRequests(50));
  Close(kA);
  EXPECT_FALSE(A().connected(kB));
  const absl::Status late = A().Send(kB, Request(kA, 42, 8)).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  a_.Release();
  b_.Release();
  for (auto& th : threads) th.join();
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(a_ends[t].code(), absl::StatusCode::kUnavailable)
        << "A's sender thread " << t << " ended with " << a_ends[t];
  }
}

INSTANTIATE_TEST_SUITE_P(Transport, TransportConformance, ::testing::Values(kGrpc, kShm, kLoopback),
                         BackendName);

}  // namespace
}  // namespace baton::rpc::conformance
