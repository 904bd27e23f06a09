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
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/internal/wire.h"
#include "rpc/testing/loopback_transport.h"
#include "rpc/transport.h"
#include "rpc/transport/grpc/grpc_transport.h"
#include "rpc/transport/shm/shm_transport.h"

namespace baton::rpc {
namespace {

constexpr int kA = 0;
constexpr int kB = 1;
constexpr char kToken[] = "conformance-token";
// A request whose callee keeps its reply channel instead of answering.
constexpr char kHold[] = "hold";

// Every wait's deadline: far above what a healthy run needs, on a loaded
// two-core machine included.
constexpr absl::Duration kWait = absl::Seconds(30);
// What closing may take: CloseStreams() is given kCloseTimeout; the rest is
// scheduling slack.
constexpr absl::Duration kCloseTimeout = absl::Seconds(2);
constexpr absl::Duration kSlack = absl::Seconds(1);
// The shared-memory backend's rings: the large frames are 16 times this.
constexpr size_t kShmRingBytes = size_t{64} << 10;

// ---- frames ----------------------------------------------------------------

// Bytes that depend on the frame and the position, so a misplaced or
// truncated piece shows.
std::string Pattern(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return s;
}

Frame Request(int caller, uint64_t id, size_t payload_bytes, const char* function = "f") {
  Frame f;
  f.header.set_kind(proto::FrameHeader::REQUEST);
  f.header.set_id(id);
  f.header.set_caller_id(caller);
  f.header.set_function(function);
  f.payload.bytes = Pattern(id, payload_bytes);
  f.payload.extensions["seq"] = absl::StrCat(caller, ":", id);
  return f;
}

// A blob of `bytes` that owns its memory.
Blob MakeBlob(std::string bytes) {
  auto owner = std::make_shared<const std::string>(std::move(bytes));
  Blob b;
  b.pieces.push_back(absl::MakeConstSpan(owner->data(), owner->size()));
  b.owner = owner;
  return b;
}

std::string Contents(const Blob& b) {
  std::string out(b.size(), '\0');
  b.CopyTo(out.data());
  return out;
}

// The answer to `request`: same id, its payload echoed back.
Frame Echo(const Frame& request) {
  Frame r;
  r.header.set_kind(proto::FrameHeader::RESPONSE);
  r.header.set_id(request.header.id());
  r.payload.bytes = request.payload.bytes;
  r.payload.blobs = request.payload.blobs;
  r.payload.extensions = request.payload.extensions;
  r.payload.extensions["reply"] = "1";
  return r;
}

// ---- the handler -------------------------------------------------------------

// How a stream or link ended.
struct Ending {
  int peer = -1;
  uint64_t stream = 0;
  absl::Status cause;
  bool refused = false;  // OnStreamRefused, else OnStreamClosed
};

// One endpoint's handler: records what arrives and answers every request
// (but kHold ones) with Echo() on its reply channel, from a thread of its
// own (a callback must not block, and a reply may wait for room), or inside
// OnRequest after AnswerInline(). Once MarkClosed() is called, any callback
// counts as a violation.
class Endpoint : public TransportHandler {
 public:
  Endpoint() : replier_([this] { Answer(); }) {}
  ~Endpoint() override { StopAnswering(); }

  void OnRequest(std::shared_ptr<ReplyChannel> channel, Frame frame) override {
    Called("OnRequest");
    Frame reply = Echo(frame);
    bool inline_reply;
    {
      absl::MutexLock lock(&mu_);
      const bool hold = frame.header.function() == kHold;
      requests_.push_back(std::move(frame));
      if (hold) {
        held_.push_back(std::move(channel));
        return;
      }
      inline_reply = answer_inline_;
      if (!inline_reply) to_answer_.emplace_back(std::move(channel), std::move(reply));
    }
    if (inline_reply && !channel->Send(std::move(reply))) {
      absl::MutexLock lock(&mu_);
      ++unsent_replies_;
    }
  }
  void OnResponse(int peer, Frame frame) override {
    Called("OnResponse");
    absl::MutexLock lock(&mu_);
    responses_.emplace_back(peer, std::move(frame));
  }
  void OnStreamClosed(int peer, uint64_t stream_id, const absl::Status& cause) override {
    Called("OnStreamClosed");
    absl::MutexLock lock(&mu_);
    endings_.push_back({peer, stream_id, cause, false});
  }
  void OnStreamRefused(int peer, uint64_t stream_id, const absl::Status& cause) override {
    Called("OnStreamRefused");
    absl::MutexLock lock(&mu_);
    endings_.push_back({peer, stream_id, cause, true});
  }
  void OnPeerLost(int peer, const absl::Status& /*cause*/) override {
    Called("OnPeerLost");
    absl::MutexLock lock(&mu_);
    lost_.push_back(peer);
  }
  void AuthenticateStream(absl::string_view identity,
                          std::function<void(absl::StatusOr<int>)> done) override {
    Called("AuthenticateStream");
    {
      absl::MutexLock lock(&mu_);
      identities_.emplace_back(identity);
      if (hold_authentication_) {
        held_auth_.push_back(std::move(done));
        return;
      }
    }
    done(-1);
  }

  void AnswerInline() {
    absl::MutexLock lock(&mu_);
    answer_inline_ = true;
  }
  // Ends the answering thread (before the transports go: a reply channel
  // may point at its transport).
  void StopAnswering() {
    {
      absl::MutexLock lock(&mu_);
      stop_answering_ = true;
    }
    if (replier_.joinable()) replier_.join();
  }

  // Answers the streams whose authentication was held.
  void AnswerHeldAuthentication(const absl::StatusOr<int>& answer) {
    std::vector<std::function<void(absl::StatusOr<int>)>> held;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_auth_);
      hold_authentication_ = false;
    }
    for (auto& done : held) done(answer);
  }

  // From now on, a callback is a violation of the close contract.
  void MarkClosed() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Ends WaitRoom()s (the test's senders stop).
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  bool released() {
    absl::MutexLock lock(&mu_);
    return released_;
  }

  // Waits until `cond` (called under mu_) holds; false at the deadline.
  template <typename F>
  bool Await(F cond, absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cond(); };
    return mu_.AwaitWithTimeout(absl::Condition(&holds), timeout);
  }
  bool WaitRequests(size_t n) {
    return Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return requests_.size() >= n; });
  }
  bool WaitResponses(size_t n) {
    return Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return responses_.size() >= n; });
  }
  // Waits until a stream was presented for authentication or a request came.
  bool WaitStreamSeen() {
    return Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !identities_.empty() || !requests_.empty();
    });
  }
  // Waits until at most `window` of `sent` requests are unanswered, or
  // Release(). False at the deadline.
  bool WaitRoom(size_t sent, size_t window) {
    return Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return released_ || responses_.size() + window >= sent;
    });
  }
  // The endings for `peer` of streams in `streams`.
  std::vector<Ending> EndingsOf(int peer, const std::set<uint64_t>& streams) {
    absl::MutexLock lock(&mu_);
    return EndingsOfLocked(peer, streams);
  }
  bool WaitEndingOf(int peer, const std::set<uint64_t>& streams) {
    return Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !EndingsOfLocked(peer, streams).empty();
    });
  }

  // Checked after the endpoint is gone: each stream ended at most once and
  // nothing was called after close.
  void ExpectContractKept(const std::string& who) {
    absl::MutexLock lock(&mu_);
    std::map<std::pair<int, uint64_t>, int> ends;
    for (const Ending& e : endings_) {
      const int times = ++ends[std::make_pair(e.peer, e.stream)];
      EXPECT_EQ(times, 1) << who << ": stream " << e.stream << " to worker " << e.peer
                          << " reported ended more than once (last: " << e.cause << ")";
    }
    EXPECT_EQ(after_close_, 0) << who << ": " << after_close_
                               << " handler callback(s) after close returned, the first "
                               << first_after_close_;
  }

  absl::Mutex mu_;
  std::vector<Frame> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, Frame>> responses_ ABSL_GUARDED_BY(mu_);
  std::vector<Ending> endings_ ABSL_GUARDED_BY(mu_);
  std::vector<int> lost_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> identities_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<ReplyChannel>> held_ ABSL_GUARDED_BY(mu_);
  int unsent_replies_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_authentication_ ABSL_GUARDED_BY(mu_) = false;

 private:
  void Called(const char* what) {
    absl::MutexLock lock(&mu_);
    if (!closed_) return;
    if (after_close_++ == 0) first_after_close_ = what;
  }
  std::vector<Ending> EndingsOfLocked(int peer, const std::set<uint64_t>& streams)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Ending> out;
    for (const Ending& e : endings_) {
      if (e.peer == peer && streams.count(e.stream) > 0) out.push_back(e);
    }
    return out;
  }

  // The answering thread: replies in the order their requests came.
  void Answer() {
    for (;;) {
      std::pair<std::shared_ptr<ReplyChannel>, Frame> next;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_answering_ || !to_answer_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (stop_answering_) return;  // what is left stays unanswered
        next = std::move(to_answer_.front());
        to_answer_.pop_front();
      }
      if (!next.first->Send(std::move(next.second))) {
        absl::MutexLock lock(&mu_);
        ++unsent_replies_;
      }
    }
  }

  std::deque<std::pair<std::shared_ptr<ReplyChannel>, Frame>> to_answer_ ABSL_GUARDED_BY(mu_);
  bool answer_inline_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_answering_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void(absl::StatusOr<int>)>> held_auth_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int after_close_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_after_close_ ABSL_GUARDED_BY(mu_);
  std::thread replier_;  // last: it starts once the rest is built
};

// ---- backends ----------------------------------------------------------------

// Makes the two endpoints of a case. Handlers outlive the backend.
class Backend {
 public:
  virtual ~Backend() = default;
  // Starts A (id kA) and B (id kB), each able to send to the other.
  virtual void Start(TransportHandler* a, TransportHandler* b) = 0;
  virtual Transport& endpoint(int id) = 0;
  // Closes endpoint `id` as its owner does at shutdown; afterwards its
  // handler hears nothing. Returns what the closing reported.
  virtual absl::Status Close(int id) = 0;
  // Destroys both endpoints (and whatever delivers to their handlers).
  virtual void Stop() = 0;
  // Network backends: endpoint `id` as a NetworkTransport, and another
  // endpoint of the same network (its owner destroys it before Stop()).
  virtual NetworkTransport* network(int /*id*/) { return nullptr; }
  virtual absl::StatusOr<std::unique_ptr<NetworkTransport>> StartAnother(
      const std::string& /*token*/, TransportHandler* /*handler*/) {
    return absl::UnimplementedError("not a network transport");
  }
};

// A NetworkTransport made by a factory, as the agent makes one.
class NetworkBackend : public Backend {
 public:
  void Start(TransportHandler* a, TransportHandler* b) override {
    auto ta = StartAnother(kToken, a);
    ASSERT_TRUE(ta.ok()) << ta.status();
    auto tb = StartAnother(kToken, b);
    ASSERT_TRUE(tb.ok()) << tb.status();
    t_[kA] = *std::move(ta);
    t_[kB] = *std::move(tb);
    // Each knows both workers, itself included, as after a rendezvous.
    for (auto& t : t_) {
      t->AddPeer(kA, t_[kA]->address(), "");
      t->AddPeer(kB, t_[kB]->address(), "");
    }
  }
  Transport& endpoint(int id) override { return *t_[id]; }
  NetworkTransport* network(int id) override { return t_[id].get(); }
  absl::Status Close(int id) override { return CloseNetwork(*t_[id]); }
  void Stop() override {
    for (auto& t : t_) t.reset();
  }
  absl::StatusOr<std::unique_ptr<NetworkTransport>> StartAnother(
      const std::string& token, TransportHandler* handler) override {
    NetworkTransportOptions o;
    o.listen_address = "127.0.0.1:0";
    o.job_token = token;
    o.max_message_bytes = int64_t{64} << 20;
    return factory_(o, handler);
  }

  // How an agent closes its network transport (rpc/agent.cc, Teardown).
  static absl::Status CloseNetwork(NetworkTransport& t) {
    absl::Status s = t.CloseStreams(/*cancel=*/false, kCloseTimeout);
    t.StopServer(absl::ZeroDuration());
    return s;
  }

 protected:
  NetworkTransportFactory factory_;
  std::unique_ptr<NetworkTransport> t_[2];
};

class GrpcBackend : public NetworkBackend {
 public:
  GrpcBackend() {
    factory_ = [](const NetworkTransportOptions& o,
                  TransportHandler* h) -> absl::StatusOr<std::unique_ptr<NetworkTransport>> {
      auto t = internal::GrpcTransport::Start(o, h);
      if (!t.ok()) return t.status();
      return std::unique_ptr<NetworkTransport>(std::move(*t));
    };
  }
};

class LoopbackBackend : public NetworkBackend {
 public:
  LoopbackBackend() : net_(std::make_unique<rpc::testing::LoopbackNetwork>()) {
    factory_ = net_->Factory();
  }
  ~LoopbackBackend() override { Stop(); }
  void Stop() override {
    NetworkBackend::Stop();
    net_.reset();  // joins the delivery thread: nothing is delivered after
  }

 private:
  std::unique_ptr<rpc::testing::LoopbackNetwork> net_;
};

// Two shared-memory transports of this process, linked as at a rendezvous.
class ShmBackend : public Backend {
 public:
  void Start(TransportHandler* a, TransportHandler* b) override {
    internal::ShmTransportOptions o;
    o.ring_bytes = kShmRingBytes;
    // A send to a ring nobody reads any more gives up after this.
    o.send_timeout = absl::Seconds(2);
    auto ta = internal::ShmTransport::Create(o, kA, 2, a);
    ASSERT_TRUE(ta.ok()) << ta.status();
    auto tb = internal::ShmTransport::Create(o, kB, 2, b);
    ASSERT_TRUE(tb.ok()) << tb.status();
    t_[kA] = *std::move(ta);
    t_[kB] = *std::move(tb);
    auto link = t_[kA]->CreateLink(kB, t_[kB]->hub_name(), getpid());
    ASSERT_TRUE(link.ok()) << link.status();
    ASSERT_TRUE(t_[kB]->OpenLink(kA, *link, t_[kA]->hub_name(), getpid()).ok());
    ASSERT_EQ(t_[kA]->Activate(), std::vector<int>{kB});
    ASSERT_EQ(t_[kB]->Activate(), std::vector<int>{kA});
  }
  Transport& endpoint(int id) override { return *t_[id]; }
  absl::Status Close(int id) override {
    t_[id]->Close();
    return absl::OkStatus();
  }
  void Stop() override {
    for (auto& t : t_) t.reset();
  }

 private:
  std::unique_ptr<internal::ShmTransport> t_[2];
};

struct BackendCase {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
  // Cases (test names without the backend) this backend is known to fail,
  // with the reason: they skip and print it.
  std::map<std::string, std::string> known_gaps;
};

std::unique_ptr<Backend> MakeGrpc() { return std::make_unique<GrpcBackend>(); }
std::unique_ptr<Backend> MakeShm() { return std::make_unique<ShmBackend>(); }
std::unique_ptr<Backend> MakeLoopback() { return std::make_unique<LoopbackBackend>(); }

const BackendCase kGrpc{"Grpc", MakeGrpc, {}};
const BackendCase kShm{
    "Shm",
    MakeShm,
    {
        {"RepliesSentInsideOnRequestFlowWhileBothSidesFlood",
         "ReplyChannel::Send waits for ring space (T2) on the receiver thread, so with both "
         "sides sending more than a ring holds, each receiver waits for the other's full ring "
         "and replies fail with UNAVAILABLE (\"stayed full\") after send_timeout"},
    }};
const BackendCase kLoopback{"Loopback", MakeLoopback, {}};

std::string BackendName(const ::testing::TestParamInfo<BackendCase>& info) {
  return info.param.name;
}

void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

// ---- the fixture -------------------------------------------------------------

class TransportConformance : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const std::string name = test.substr(0, test.find('/'));
    auto gap = GetParam().known_gaps.find(name);
    if (gap != GetParam().known_gaps.end() &&
        std::getenv("CONFORMANCE_RUN_KNOWN_GAPS") == nullptr) {
      GTEST_SKIP() << GetParam().name << " is known not to meet this clause: " << gap->second;
    }
    backend_ = GetParam().make();
    ASSERT_NO_FATAL_FAILURE(backend_->Start(&a_, &b_));
  }
  void TearDown() override {
    if (backend_ == nullptr) return;
    for (Endpoint* e : {&a_, &b_}) {
      e->AnswerHeldAuthentication(absl::CancelledError("the case is over"));
      e->StopAnswering();
    }
    backend_->Stop();
    backend_.reset();
    a_.ExpectContractKept("A");
    b_.ExpectContractKept("B");
  }

  Transport& A() { return backend_->endpoint(kA); }
  Transport& B() { return backend_->endpoint(kB); }

  // Closes `id`, checks the bound, and marks its handler closed.
  void Close(int id) {
    const absl::Time start = absl::Now();
    const absl::Status s = backend_->Close(id);
    const absl::Duration took = absl::Now() - start;
    (id == kA ? a_ : b_).MarkClosed();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_LE(took, kCloseTimeout + kSlack) << "closing endpoint " << id;
  }

  // Declared before backend_: the handlers outlive the transports.
  Endpoint a_, b_;
  std::unique_ptr<Backend> backend_;
};

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
}  // namespace baton::rpc
