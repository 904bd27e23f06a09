// The same-host shared-memory transport (rpc/transport/shm/shm_transport.h) below
// the agent: two transports in one process (and a forked peer for T3),
// frames checked byte for byte, by guarantee.
#include "rpc/transport/shm/shm_transport.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "testing/transport_recorder.h"

namespace baton::rpc::internal {
namespace {

Frame Request(uint64_t id, size_t payload_bytes) {
  Frame f;
  f.header.set_kind(proto::FrameHeader::REQUEST);
  f.header.set_id(id);
  f.header.set_function("f");
  f.payload.bytes.resize(payload_bytes);
  for (size_t i = 0; i < payload_bytes; ++i) {
    f.payload.bytes[i] = static_cast<char>((i * 131 + id) & 0xff);
  }
  return f;
}

// Two transports, ranks 0 and 1, linked in this process.
struct Pair {
  Recorder h0, h1;
  std::unique_ptr<ShmTransport> t0, t1;
  explicit Pair(ShmTransportOptions o = {}, bool activate1 = true) {
    t0 = *ShmTransport::Create(o, 0, 2, &h0);
    t1 = *ShmTransport::Create(o, 1, 2, &h1);
    auto link = t0->CreateLink(1, t1->hub_name(), getpid());
    EXPECT_TRUE(link.ok()) << link.status();
    EXPECT_TRUE(t1->OpenLink(0, *link, t0->hub_name(), getpid()).ok());
    EXPECT_EQ(t0->Activate(), std::vector<int>{1});
    if (activate1) {
      EXPECT_EQ(t1->Activate(), std::vector<int>{0});
    }
  }
};

// The parent's side of a link to a forked peer (rank 1). The child's hub
// name is not known before it exists; the child maps ours, so the link points
// at a hub of the parent's own making for the child side. Link() sends the
// link's name down `to_child` and waits for the child's byte on `from_child`.
struct LinkedChild {
  Recorder dummy;
  std::unique_ptr<ShmTransport> stand_in;
  void Link(ShmTransport& t0, pid_t child, int to_child, int from_child) {
    stand_in = *ShmTransport::Create({}, 1, 2, &dummy);
    auto link = t0.CreateLink(1, stand_in->hub_name(), child);
    ASSERT_TRUE(link.ok()) << link.status();
    ASSERT_EQ(write(to_child, link->c_str(), link->size() + 1),
              static_cast<ssize_t>(link->size() + 1));
    char ok = 0;
    ASSERT_EQ(read(from_child, &ok, 1), 1);
  }
};

TEST(ShmTransport, T1_FramesArriveWholeOnceAndInOrderWithReplies) {
  Pair p;
  const int n = 2000;
  for (int i = 0; i < n; ++i) {
    auto s = p.t0->Send(1, Request(i, static_cast<size_t>(i % 97) * 13));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, ShmTransport::kStreamBase + 1);
  }
  ASSERT_TRUE(p.h1.WaitRequests(n, absl::Seconds(20)));
  ASSERT_TRUE(p.h0.WaitResponses(n, absl::Seconds(20)));
  absl::MutexLock lock(&p.h1.mu_);
  ASSERT_EQ(p.h1.requests_.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Frame& f = p.h1.requests_[i];
    ASSERT_EQ(f.header.id(), static_cast<uint64_t>(i));
    EXPECT_EQ(f.payload.bytes, Request(i, static_cast<size_t>(i % 97) * 13).payload.bytes);
  }
  absl::MutexLock lock0(&p.h0.mu_);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(p.h0.responses_[i].first, 1);
    EXPECT_EQ(p.h0.responses_[i].second.header.id(), static_cast<uint64_t>(i + 1000));
  }
}

// A link's requests come from its peer: one that claims another caller id
// closes the link (PERMISSION_DENIED naming both), and never reaches the
// handler, so it cannot use another caller's flow-control room.
TEST(ShmTransport, ARequestClaimingAnotherCallerClosesTheLink) {
  Pair p;
  ASSERT_TRUE(p.t0->Send(1, Request(1, 8)).ok());  // caller id 0: its own
  ASSERT_TRUE(p.h1.WaitRequests(1, absl::Seconds(10)));
  Frame forged = Request(2, 8);
  forged.header.set_caller_id(1);
  ASSERT_TRUE(p.t0->Send(1, std::move(forged)).ok());
  ASSERT_TRUE(p.h1.WaitClosed(absl::Seconds(10)));
  absl::MutexLock lock(&p.h1.mu_);
  EXPECT_EQ(p.h1.requests_.size(), 1u);
  ASSERT_EQ(p.h1.closed_.size(), 1u);
  EXPECT_EQ(p.h1.closed_[0].first, 0);
  EXPECT_EQ(p.h1.closed_[0].second.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(
      absl::StrContains(p.h1.closed_[0].second.message(), "link from worker 0 claims caller id 1"))
      << p.h1.closed_[0].second;
}

TEST(ShmTransport, T1_FramesLargerThanTheRingAreCutAndPutBackTogether) {
  ShmTransportOptions o;
  o.ring_bytes = 16 << 10;  // 16 KiB rings, 1 MB frames
  Pair p(o);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(p.t0->Send(1, Request(i, (1 << 20) + i * 7)).ok());
  ASSERT_TRUE(p.h1.WaitRequests(5, absl::Seconds(30)));
  absl::MutexLock lock(&p.h1.mu_);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(p.h1.requests_[i].payload.bytes, Request(i, (1 << 20) + i * 7).payload.bytes);
  }
}

TEST(ShmTransport, T1_ConcurrentSendersEachKeepTheirOrder) {
  Pair p;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) ASSERT_TRUE(p.t0->Send(1, Request(t * 10000 + i, 40)).ok());
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(p.h1.WaitRequests(2000, absl::Seconds(20)));
  absl::MutexLock lock(&p.h1.mu_);
  std::vector<int> last(4, -1);
  for (const Frame& f : p.h1.requests_) {
    const int t = static_cast<int>(f.header.id() / 10000),
              i = static_cast<int>(f.header.id() % 10000);
    EXPECT_EQ(i, last[t] + 1) << "sender " << t;
    last[t] = i;
  }
}

TEST(ShmTransport, T2_FullRingThatNobodyReadsTimesOutWithUnavailable) {
  ShmTransportOptions o;
  o.ring_bytes = 8 << 10;
  o.send_timeout = absl::Milliseconds(300);
  Pair p(o, /*activate1=*/false);  // rank 1's receiver never runs
  absl::Status last;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 100 && last.ok(); ++i) last = p.t0->Send(1, Request(i, 1000)).status();
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(last.message(), "stayed full")) << last;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ShmTransport, T3_PeerDeathIsNoticedAndSendsFailAfterwards) {
  Recorder h0;
  auto t0 = *ShmTransport::Create({}, 0, 2, &h0);
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  if (child == 0) {
    // The peer: opens the link, says so, and dies without cleaning up when
    // the parent says (at most 30 s later).
    Recorder h1;
    auto t1 = *ShmTransport::Create({}, 1, 2, &h1);
    char name[256] = {};
    if (read(to_child[0], name, sizeof(name)) <= 0) _exit(2);
    if (!t1->OpenLink(0, name, t0->hub_name(), getppid()).ok()) _exit(3);
    (void)!write(to_parent[1], "k", 1);
    pollfd die{to_child[0], POLLIN, 0};
    (void)poll(&die, 1, 30'000);
    _exit(0);
  }
  LinkedChild linked;
  ASSERT_NO_FATAL_FAILURE(linked.Link(*t0, child, to_child[1], to_parent[0]));
  EXPECT_EQ(t0->Activate(), std::vector<int>{1});
  ASSERT_TRUE(t0->connected(1));
  // Linked and connected: now the peer dies.
  const absl::Time start = absl::Now();
  ASSERT_EQ(write(to_child[1], "d", 1), 1);
  ASSERT_TRUE(h0.WaitClosed(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  {
    absl::MutexLock lock(&h0.mu_);
    ASSERT_EQ(h0.closed_.size(), 1u);
    EXPECT_EQ(h0.closed_[0].first, 1);
    EXPECT_EQ(h0.closed_[0].second.code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(
        absl::StrContains(h0.closed_[0].second.message(), absl::StrCat("pid ", child, ") exited")))
        << h0.closed_[0].second;
  }
  EXPECT_FALSE(t0->connected(1));
  EXPECT_EQ(t0->Send(1, Request(1, 10)).status().code(), absl::StatusCode::kUnavailable);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// T3: a peer whose transport closed (its agent shut down) while its process
// lives on is noticed as a dead one is: pending calls must not wait out their
// deadline for replies that cannot come.
TEST(ShmTransport, T3_APeerThatClosedItsTransportIsNoticedLikeADeadOne) {
  Pair p;
  ASSERT_TRUE(p.t0->connected(1));
  const absl::Time start = absl::Now();
  p.t1->Close();
  ASSERT_TRUE(p.h0.WaitClosed(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  {
    absl::MutexLock lock(&p.h0.mu_);
    ASSERT_EQ(p.h0.closed_.size(), 1u);
    EXPECT_EQ(p.h0.closed_[0].first, 1);
    EXPECT_EQ(p.h0.closed_[0].second.code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(absl::StrContains(p.h0.closed_[0].second.message(),
                                  "worker 1 closed its shared-memory link"))
        << p.h0.closed_[0].second;
  }
  EXPECT_FALSE(p.t0->connected(1));
  EXPECT_EQ(p.t0->Send(1, Request(1, 10)).status().code(), absl::StatusCode::kUnavailable);
}

// A Recorder whose receiver, once stall_ is set, stays in the handler of the
// next request until the process exits (a peer that stopped reading).
// It writes one byte to stalled_fd_ when it stalls.
class StallingRecorder : public Recorder {
 public:
  void OnRequest(std::shared_ptr<ReplyChannel> channel, Frame frame) override {
    if (stall_.load()) {
      (void)!write(stalled_fd_, "t", 1);
      never_.WaitForNotification();
    }
    Recorder::OnRequest(std::move(channel), std::move(frame));
  }
  std::atomic<bool> stall_{false};
  int stalled_fd_ = -1;
  absl::Notification never_;
};

// T5: a peer that read requests 1-4 and then stopped reading dies; the
// requests 5-6 it never read are named unread, before the link's close, and
// the ones it read are not (they may have run).
TEST(ShmTransport, T5_RequestsADeadPeerNeverReadAreNamedUnread) {
  Recorder h0;
  auto t0 = *ShmTransport::Create({}, 0, 2, &h0);
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  if (child == 0) {
    // The peer: reads (and answers) until told to stop, then stops reading
    // (its receiver stays in the handler of the next request, which it has
    // read) and exits when the parent closes its pipe. (Closing its
    // transport instead would tell the parent, T3.)
    close(to_child[1]);
    close(to_parent[0]);
    StallingRecorder h1;
    h1.stalled_fd_ = to_parent[1];
    auto t1 = *ShmTransport::Create({}, 1, 2, &h1);
    char name[256] = {};
    if (read(to_child[0], name, sizeof(name)) <= 0) _exit(2);
    if (!t1->OpenLink(0, name, t0->hub_name(), getppid()).ok()) _exit(3);
    if (t1->Activate() != std::vector<int>{0}) _exit(4);
    (void)!write(to_parent[1], "k", 1);
    char c;
    if (read(to_child[0], &c, 1) != 1) _exit(5);
    h1.stall_.store(true);  // reads nothing after the next request
    (void)!write(to_parent[1], "s", 1);
    while (read(to_child[0], &c, 1) > 0) {
    }
    _exit(0);
  }
  LinkedChild linked;
  ASSERT_NO_FATAL_FAILURE(linked.Link(*t0, child, to_child[1], to_parent[0]));
  EXPECT_EQ(t0->Activate(), std::vector<int>{1});
  char ack = 0;
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(t0->Send(1, Request(id, 100)).ok());
  ASSERT_TRUE(h0.WaitResponses(3, absl::Seconds(10)));  // read and answered
  ASSERT_EQ(write(to_child[1], "s", 1), 1);
  ASSERT_EQ(read(to_parent[0], &ack, 1), 1);  // its receiver stopped
  // A reply is not a request: it is never named.
  Frame reply;
  reply.header.set_kind(proto::FrameHeader::RESPONSE);
  reply.header.set_id(77);
  ASSERT_TRUE(t0->Send(1, Request(4, 100)).ok());
  ASSERT_EQ(read(to_parent[0], &ack, 1), 1);  // 4 was read; its handler stalls
  ASSERT_TRUE(t0->Send(1, std::move(reply)).ok());
  ASSERT_TRUE(t0->Send(1, Request(5, 150 << 10)).ok());  // in fragments: over half the ring
  ASSERT_TRUE(t0->Send(1, Request(6, 10)).ok());
  close(to_child[1]);  // the child exits
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(h0.WaitClosed(absl::Seconds(5)));
  absl::MutexLock lock(&h0.mu_);
  ASSERT_EQ(h0.unread_.size(), 1u);
  EXPECT_EQ(h0.unread_[0].first, 1);
  EXPECT_EQ(h0.unread_[0].second, (std::vector<uint64_t>{5, 6}));  // 4 was read
  EXPECT_TRUE(h0.unread_before_close_);
  ASSERT_EQ(h0.closed_.size(), 1u);
  EXPECT_EQ(h0.closed_[0].second.code(), absl::StatusCode::kUnavailable);
}

// T5: a frame left half written (the ring filled up mid-frame and stayed
// full) closes the link, so that no later frame runs into its fragments.
TEST(ShmTransport, T5_AFrameLeftHalfWrittenClosesTheLink) {
  ShmTransportOptions o;
  o.ring_bytes = 8 << 10;
  o.send_timeout = absl::Milliseconds(200);
  Pair p(o, /*activate1=*/false);  // rank 1's receiver never runs
  const absl::Status s = p.t0->Send(1, Request(1, 64 << 10)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "stayed full")) << s;
  EXPECT_FALSE(p.t0->connected(1));
  EXPECT_EQ(p.t0->Send(1, Request(2, 8)).status().code(), absl::StatusCode::kUnavailable);
  absl::MutexLock lock(&p.h0.mu_);
  ASSERT_EQ(p.h0.closed_.size(), 1u);
  EXPECT_EQ(p.h0.closed_[0].first, 1);
  EXPECT_TRUE(p.h0.unread_.empty());  // the peer lives: nothing is claimed
}

TEST(ShmTransport, AnUnopenedLinkIsDroppedAndBadRingSizesAreRefused) {
  Recorder h0;
  auto t0 = *ShmTransport::Create({}, 0, 3, &h0);
  Recorder h1;
  auto t1 = *ShmTransport::Create({}, 1, 3, &h1);
  ASSERT_TRUE(t0->CreateLink(1, t1->hub_name(), getpid()).ok());  // never opened
  EXPECT_TRUE(t0->Activate().empty());
  EXPECT_FALSE(t0->connected(1));
  ShmTransportOptions bad;
  bad.ring_bytes = 1000;
  EXPECT_EQ(ShmTransport::Create(bad, 0, 2, &h0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::rpc::internal
