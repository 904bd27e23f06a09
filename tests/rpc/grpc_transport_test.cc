// GrpcTransport (rpc/transport/grpc/grpc_transport.h) between two transports in one
// process, on loopback: how a stream comes up over a slow link, and how an
// incoming stream is bound to a caller (docs/flow_control.md, W2).
#include <cstdlib>
#include <memory>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/tls.h"
#include "rpc/transport/grpc/grpc_transport.h"
#include "testing/slow_link.h"
#include "testing/transport_recorder.h"

namespace baton::rpc::internal {
namespace {

Frame Request(uint64_t id) {
  Frame f;
  f.header.set_kind(proto::FrameHeader::REQUEST);
  f.header.set_id(id);
  f.header.set_function("echo");
  return f;
}

// Two transports with one job token: a caller and a callee.
void StartPair(TransportHandler* caller_side, TransportHandler* callee_side,
               std::unique_ptr<GrpcTransport>* caller, std::unique_ptr<GrpcTransport>* callee) {
  auto e = GrpcTransport::Start({"127.0.0.1:0", "token", 1 << 20}, callee_side);
  ASSERT_TRUE(e.ok()) << e.status();
  auto r = GrpcTransport::Start({"127.0.0.1:0", "token", 1 << 20}, caller_side);
  ASSERT_TRUE(r.ok()) << r.status();
  *callee = *std::move(e);
  *caller = *std::move(r);
}

// The first call to a peer whose link delays the handshake well past the
// reconnect backoff (500 ms at most) waits for the connection instead of
// failing with UNAVAILABLE ("tcp handshaker shutdown"): gRPC gives each
// connection attempt GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, once set to 50 ms.
TEST(GrpcTransport, FirstCallOverALinkSlowerThanTheReconnectBackoffArrives) {
  Recorder caller_side, callee_side;
  std::unique_ptr<GrpcTransport> caller, callee;
  ASSERT_NO_FATAL_FAILURE(StartPair(&caller_side, &callee_side, &caller, &callee));
  auto link = testing::SlowLink::Start(callee->address(), absl::Milliseconds(1500));
  ASSERT_TRUE(link.ok()) << link.status();
  caller->AddPeer(1, (*link)->address(), "");
  const absl::Time t0 = absl::Now();
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(caller->Send(1, Request(id)).ok());
  EXPECT_TRUE(caller_side.WaitResponses(3, absl::Seconds(15)));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(1500));
  {
    absl::MutexLock lock(&caller_side.mu_);
    EXPECT_TRUE(caller_side.closed_.empty());
  }
  EXPECT_EQ((*link)->accepted(), 1);
  EXPECT_TRUE(caller->CloseStreams(/*cancel=*/false, absl::Seconds(5)).ok());
  caller->StopServer(absl::ZeroDuration());
  callee->StopServer(absl::ZeroDuration());
}

// A stream is bound to the caller id of its first request: a later request
// on it that claims another caller closes the stream with PERMISSION_DENIED
// naming both ids, before the handler sees it (flow control counts requests
// per caller; no stream may use another caller's room).
TEST(GrpcTransport, AStreamIsBoundToTheCallerIdOfItsFirstRequest) {
  Recorder caller_side, callee_side;
  std::unique_ptr<GrpcTransport> caller, callee;
  ASSERT_NO_FATAL_FAILURE(StartPair(&caller_side, &callee_side, &caller, &callee));
  caller->AddPeer(1, callee->address(), "");
  Frame first = Request(1);
  first.header.set_caller_id(3);
  ASSERT_TRUE(caller->Send(1, std::move(first)).ok());
  ASSERT_TRUE(caller_side.WaitResponses(1, absl::Seconds(10)));
  Frame again = Request(2);
  again.header.set_caller_id(3);
  ASSERT_TRUE(caller->Send(1, std::move(again)).ok());
  ASSERT_TRUE(caller_side.WaitResponses(2, absl::Seconds(10)));
  Frame other = Request(3);
  other.header.set_caller_id(4);  // another caller's id, same stream
  ASSERT_TRUE(caller->Send(1, std::move(other)).ok());
  ASSERT_TRUE(caller_side.WaitClosed(absl::Seconds(10)));
  {
    absl::MutexLock lock(&caller_side.mu_);
    ASSERT_EQ(caller_side.closed_.size(), 1u);
    const absl::Status& cause = caller_side.closed_[0].second;
    EXPECT_EQ(cause.code(), absl::StatusCode::kPermissionDenied) << cause;
    EXPECT_TRUE(
        absl::StrContains(cause.message(), "claims caller id 4 on a stream bound to caller id 3"))
        << cause;
  }
  {
    absl::MutexLock lock(&callee_side.mu_);
    EXPECT_EQ(callee_side.requests_.size(), 2u);  // the third never reached it
  }
  caller->StopServer(absl::ZeroDuration());
  callee->StopServer(absl::ZeroDuration());
}

// A Recorder whose streams prove ranks by identity "w<rank>".
class RankedRecorder : public Recorder {
 public:
  void AuthenticateStream(absl::string_view identity,
                          std::function<void(absl::StatusOr<int>)> done) override {
    if (identity.size() == 2 && identity[0] == 'w') {
      done(identity[1] - '0');
    } else {
      done(absl::PermissionDeniedError("unknown identity"));
    }
  }
};

Frame WithBlob(uint64_t id, size_t bytes, std::shared_ptr<std::string>* keep) {
  Frame f = Request(id);
  f.header.set_caller_id(0);
  *keep = std::make_shared<std::string>(bytes, static_cast<char>('a' + id));
  f.payload.bytes = "a tensor";  // what names the blob (the wire checks that it can)
  if (bytes > 0) {
    Blob b;
    b.pieces.emplace_back((*keep)->data(), bytes);
    b.owner = *keep;
    f.payload.blobs.push_back(std::move(b));
  }
  return f;
}

// B3, B4 through the transport: large blobs of requests go through the
// bulk channel (the frames arrive naming them), small frames do not; the
// callee sees every frame once and whole, the small ones in order.
void LargeBlobsGoThroughTheBulkChannel(TlsConfig tls) {
  RankedRecorder caller_side, callee_side;
  NetworkTransportOptions o{"127.0.0.1:0", "token", 64 << 20};
  o.tls = std::move(tls);
  o.bulk_channel = true;
  o.bulk_min_bytes = 64 << 10;
  auto callee = GrpcTransport::Start(o, &callee_side);
  ASSERT_TRUE(callee.ok()) << callee.status();
  auto caller = GrpcTransport::Start(o, &caller_side);
  ASSERT_TRUE(caller.ok()) << caller.status();
  ASSERT_FALSE((*callee)->bulk_address().empty());
  (*caller)->AddPeer(1, (*callee)->address(), "w0");
  (*caller)->AddBulkPeer(1, (*callee)->bulk_address());
  std::vector<std::shared_ptr<std::string>> kept(40);
  // The first large blob starts the connection and travels on the stream.
  ASSERT_TRUE((*caller)->Send(1, WithBlob(0, 1 << 20, &kept[0])).ok());
  ASSERT_TRUE(callee_side.WaitRequests(1, absl::Seconds(10)));
  int via_bulk = 0;
  for (uint64_t id = 1; id < 40; ++id) {
    const size_t bytes = id % 3 == 0 ? 100 : (id % 3 == 1 ? (1 << 20) + id : 3 << 20);
    ASSERT_TRUE((*caller)->Send(1, WithBlob(id, bytes, &kept[id])).ok());
  }
  ASSERT_TRUE(callee_side.WaitRequests(40, absl::Seconds(30)));
  {
    absl::MutexLock lock(&callee_side.mu_);
    std::vector<const Frame*> by_id(40, nullptr);
    uint64_t last_small = 0;
    for (const Frame& f : callee_side.requests_) {
      ASSERT_LT(f.header.id(), 40u);
      ASSERT_EQ(by_id[f.header.id()], nullptr) << f.header.id();
      by_id[f.header.id()] = &f;
      if (f.header.tcp_blobs_size() == 0 && f.header.id() > 0) {
        EXPECT_GT(f.header.id(), last_small);  // frames without bulk blobs keep their order
        last_small = f.header.id();
      }
    }
    for (uint64_t id = 0; id < 40; ++id) {
      const Frame& f = *by_id[id];
      ASSERT_EQ(f.payload.blobs.size(), 1u);
      std::string got(f.payload.blobs[0].size(), '\0');
      f.payload.blobs[0].CopyTo(got.data());
      EXPECT_EQ(got, *kept[id]) << id;
      via_bulk += f.header.tcp_blobs_size();
      if (f.payload.blobs[0].size() < (64 << 10)) {
        EXPECT_EQ(f.header.tcp_blobs_size(), 0) << id;
      }
    }
  }
  EXPECT_GE(via_bulk, 20);  // all the large ones once the connection was up
  ASSERT_TRUE(caller_side.WaitResponses(40, absl::Seconds(10)));
  EXPECT_TRUE((*caller)->CloseStreams(/*cancel=*/false, absl::Seconds(5)).ok());
  (*caller)->StopServer(absl::ZeroDuration());
  (*callee)->StopServer(absl::ZeroDuration());
}

TEST(GrpcTransport, LargeBlobsGoThroughTheBulkChannelAndArriveWhole) {
  LargeBlobsGoThroughTheBulkChannel(TlsConfig{});
}

// B9 through the transport: under the job's TLS the streams and the bulk
// channel are both mutual TLS, and large blobs still take the channel.
TEST(GrpcTransport, UnderTlsLargeBlobsGoThroughTheBulkChannelToo) {
  const std::string dir = ::testing::TempDir() + "/transport_certs";
  const std::string cmd = "bash tools/make_certs.sh " + dir + " node";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto tls = LoadTls({dir + "/ca.pem", dir + "/node.pem", dir + "/node.key", ""});
  ASSERT_TRUE(tls.ok()) << tls.status();
  LargeBlobsGoThroughTheBulkChannel(*tls);
}

// B6 through the transport: a request naming a bulk blob that cannot
// arrive (no connection from its caller) is answered UNAVAILABLE before it
// ran (not_run), and the handler never sees it; a worker without a bulk
// channel answers such a request with DATA_LOSS.
TEST(GrpcTransport, ARequestWhoseBulkBlobsCannotArriveIsAnsweredNotRun) {
  RankedRecorder caller_side, with_bulk_side, without_bulk_side;
  NetworkTransportOptions o{"127.0.0.1:0", "token", 64 << 20};
  auto caller = GrpcTransport::Start(o, &caller_side);
  ASSERT_TRUE(caller.ok()) << caller.status();
  o.bulk_channel = true;
  auto with_bulk = GrpcTransport::Start(o, &with_bulk_side);
  ASSERT_TRUE(with_bulk.ok()) << with_bulk.status();
  o.bulk_channel = false;
  auto without_bulk = GrpcTransport::Start(o, &without_bulk_side);
  ASSERT_TRUE(without_bulk.ok()) << without_bulk.status();
  (*caller)->AddPeer(1, (*with_bulk)->address(), "w0");
  (*caller)->AddPeer(2, (*without_bulk)->address(), "w0");
  for (int peer : {1, 2}) {
    std::shared_ptr<std::string> keep;
    Frame f = WithBlob(static_cast<uint64_t>(peer), 0, &keep);
    f.payload.blobs.emplace_back();  // travels empty, named below
    proto::TcpBlob* e = f.header.add_tcp_blobs();
    e->set_id(99);
    e->set_size(1 << 20);
    ASSERT_TRUE((*caller)->Send(peer, std::move(f)).ok());
  }
  ASSERT_TRUE(caller_side.WaitResponses(2, absl::Seconds(10)));
  {
    absl::MutexLock lock(&caller_side.mu_);
    for (const auto& [peer, r] : caller_side.responses_) {
      EXPECT_EQ(r.header.id(), static_cast<uint64_t>(peer));
      EXPECT_TRUE(r.header.not_run()) << peer;
      EXPECT_EQ(r.header.status_code(), static_cast<int>(peer == 1 ? absl::StatusCode::kUnavailable
                                                                   : absl::StatusCode::kDataLoss))
          << r.header.error_message();
      EXPECT_TRUE(absl::StrContains(r.header.error_message(),
                                    "the request's tensors did not arrive on the bulk channel"))
          << r.header.error_message();
    }
  }
  for (Recorder* r : {&with_bulk_side, &without_bulk_side}) {
    absl::MutexLock lock(&r->mu_);
    EXPECT_TRUE(r->requests_.empty());
  }
  (*caller)->StopServer(absl::ZeroDuration());
  (*with_bulk)->StopServer(absl::ZeroDuration());
  (*without_bulk)->StopServer(absl::ZeroDuration());
}

// A handler that answers AuthenticateStream when the test says so.
class Gatekeeper : public Recorder {
 public:
  void AuthenticateStream(absl::string_view identity,
                          std::function<void(absl::StatusOr<int>)> done) override {
    absl::MutexLock lock(&mu_);
    identity_ = std::string(identity);
    done_ = std::move(done);
  }
  bool WaitAsked(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto asked = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ != nullptr; };
    return mu_.AwaitWithTimeout(absl::Condition(&asked), timeout);
  }
  // Answers from the test's thread, as an agent answers from its executor.
  void Answer(absl::StatusOr<int> bound) {
    std::function<void(absl::StatusOr<int>)> done;
    {
      absl::MutexLock lock(&mu_);
      done = std::move(done_);
    }
    done(std::move(bound));
  }
  std::string identity_ ABSL_GUARDED_BY(mu_);

 private:
  std::function<void(absl::StatusOr<int>)> done_ ABSL_GUARDED_BY(mu_);
};

// W2: an incoming stream presents the identity its opener's peer was added
// with, and no frame of it is read before the handler answers; the stream
// is then bound to the id the handler proved, so even its first request
// cannot claim another.
TEST(GrpcTransport, W2_NoFrameIsReadBeforeTheStreamsIdentityIsAnswered) {
  Recorder caller_side;
  Gatekeeper callee_side;
  std::unique_ptr<GrpcTransport> caller, callee;
  ASSERT_NO_FATAL_FAILURE(StartPair(&caller_side, &callee_side, &caller, &callee));
  caller->AddPeer(1, callee->address(), "7/1/proof");
  Frame first = Request(1);
  first.header.set_caller_id(7);
  ASSERT_TRUE(caller->Send(1, std::move(first)).ok());
  ASSERT_TRUE(callee_side.WaitAsked(absl::Seconds(10)));
  {
    absl::MutexLock lock(&callee_side.mu_);
    EXPECT_EQ(callee_side.identity_, "7/1/proof");
    EXPECT_TRUE(callee_side.requests_.empty());
  }
  callee_side.Answer(7);
  ASSERT_TRUE(caller_side.WaitResponses(1, absl::Seconds(10)));
  Frame other = Request(2);
  other.header.set_caller_id(8);
  ASSERT_TRUE(caller->Send(1, std::move(other)).ok());
  ASSERT_TRUE(caller_side.WaitClosed(absl::Seconds(10)));
  {
    absl::MutexLock lock(&caller_side.mu_);
    const absl::Status& cause = caller_side.closed_[0].second;
    EXPECT_EQ(cause.code(), absl::StatusCode::kPermissionDenied) << cause;
    EXPECT_TRUE(
        absl::StrContains(cause.message(), "claims caller id 8 on a stream bound to caller id 7"))
        << cause;
  }
  {
    absl::MutexLock lock(&callee_side.mu_);
    EXPECT_EQ(callee_side.requests_.size(), 1u);
  }
  caller->StopServer(absl::ZeroDuration());
  callee->StopServer(absl::ZeroDuration());
}

// W2: a stream whose identity the handler refuses ends with the refusal,
// and none of its frames reaches the handler.
TEST(GrpcTransport, W2_AStreamWhoseIdentityIsRefusedEndsWithTheRefusal) {
  Recorder caller_side;
  Gatekeeper callee_side;
  std::unique_ptr<GrpcTransport> caller, callee;
  ASSERT_NO_FATAL_FAILURE(StartPair(&caller_side, &callee_side, &caller, &callee));
  caller->AddPeer(1, callee->address(), "");  // presents none
  for (uint64_t id = 1; id <= 3; ++id) (void)caller->Send(1, Request(id));
  ASSERT_TRUE(callee_side.WaitAsked(absl::Seconds(10)));
  {
    absl::MutexLock lock(&callee_side.mu_);
    EXPECT_EQ(callee_side.identity_, "");
  }
  callee_side.Answer(absl::PermissionDeniedError("no identity, no entry"));
  ASSERT_TRUE(caller_side.WaitClosed(absl::Seconds(10)));
  {
    absl::MutexLock lock(&caller_side.mu_);
    const absl::Status& cause = caller_side.closed_[0].second;
    EXPECT_EQ(cause.code(), absl::StatusCode::kPermissionDenied) << cause;
    EXPECT_TRUE(absl::StrContains(cause.message(), "no identity, no entry")) << cause;
    EXPECT_TRUE(caller_side.responses_.empty());
  }
  {
    absl::MutexLock lock(&callee_side.mu_);
    EXPECT_TRUE(callee_side.requests_.empty());
  }
  caller->StopServer(absl::ZeroDuration());
  callee->StopServer(absl::ZeroDuration());
}

// gRPC 1.51 runs every reaction on the threads of one process-wide
// completion queue, and whoever drops the process's last channel or server
// shuts that queue down and joins those threads. A transport therefore
// releases its channels only after its streams are gone: were the last one
// released by a stream's OnDone, on a reaction thread, the queue would be
// deleted under that thread and the process would abort ("prior > 0").
// Transports made and destroyed many times, each time while the stream of
// the last call is ending, leave the process alive with every wait met.
TEST(GrpcTransport, ChannelsAreReleasedOnlyAfterTheirStreamsAreGone) {
  for (int round = 0; round < 200; ++round) {
    SCOPED_TRACE(round);
    Recorder caller_side, callee_side;
    std::unique_ptr<GrpcTransport> caller, callee;
    ASSERT_NO_FATAL_FAILURE(StartPair(&caller_side, &callee_side, &caller, &callee));
    caller->AddPeer(1, callee->address(), "");
    ASSERT_TRUE(caller->Send(1, Request(1)).ok());
    ASSERT_TRUE(caller_side.WaitResponses(1, absl::Seconds(10)));
    // The callee goes first: its server cancels the stream, whose OnDone
    // then races the caller's destruction.
    callee.reset();
    caller.reset();
  }
}

}  // namespace
}  // namespace baton::rpc::internal
