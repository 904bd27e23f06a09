// The Transport conformance harness (tests/transport/conformance_test.cc
// and network_conformance_test.cc say what is checked): frames with
// checkable contents, an Endpoint handler that records what reaches it and
// checks the handler contract of rpc/transport.h, a Backend per
// implementation (gRPC, shared memory, loopback) and the fixture that
// starts endpoints A and B on one.
//
// Waits are on events (mutex conditions) with deadlines, never sleeps.
//
// Thread-safety: an Endpoint is called by its transport's threads and
// read by the test's; its state is under its mutex.
#ifndef BATON_TESTS_TRANSPORT_CONFORMANCE_HARNESS_H_
#define BATON_TESTS_TRANSPORT_CONFORMANCE_HARNESS_H_

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
#include "rpc/transport.h"
#include "rpc/transport/grpc/grpc_transport.h"
#include "rpc/transport/shm/shm_transport.h"
#include "testing/rpc/loopback_transport.h"

namespace baton::rpc::conformance {

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
inline std::string Pattern(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
  return s;
}

inline Frame Request(int caller, uint64_t id, size_t payload_bytes, const char* function = "f") {
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
inline Blob MakeBlob(std::string bytes) {
  auto owner = std::make_shared<const std::string>(std::move(bytes));
  Blob b;
  b.pieces.push_back(absl::MakeConstSpan(owner->data(), owner->size()));
  b.owner = owner;
  return b;
}

inline std::string Contents(const Blob& b) {
  std::string out(b.size(), '\0');
  b.CopyTo(out.data());
  return out;
}

// The answer to `request`: same id, its payload echoed back.
inline Frame Echo(const Frame& request) {
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

inline std::unique_ptr<Backend> MakeGrpc() { return std::make_unique<GrpcBackend>(); }
inline std::unique_ptr<Backend> MakeShm() { return std::make_unique<ShmBackend>(); }
inline std::unique_ptr<Backend> MakeLoopback() { return std::make_unique<LoopbackBackend>(); }

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

inline std::string BackendName(const ::testing::TestParamInfo<BackendCase>& info) {
  return info.param.name;
}

inline void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

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

}  // namespace baton::rpc::conformance

#endif  // BATON_TESTS_TRANSPORT_CONFORMANCE_HARNESS_H_
