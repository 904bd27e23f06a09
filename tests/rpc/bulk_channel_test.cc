// The network bulk channel (rpc/channel/tcp/bulk_channel.h) on its own: two
// channels in one process (ranks 0 and 1), and raw sockets for a peer that
// breaks the protocol, by guarantee.
#include "rpc/channel/tcp/bulk_channel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "base/tls.h"
#include "testing/eventually.h"

namespace baton::rpc::internal {
namespace {

// Identities "w<rank>" prove ranks 0-7 ("w<rank>#<n>": a later incarnation
// of that rank); anything else is refused.
absl::StatusOr<int> Authenticate(const std::string& identity) {
  int rank = -1;
  const std::string worker = identity.substr(0, identity.find('#'));
  if (worker.size() == 2 && worker[0] == 'w' && absl::SimpleAtoi(worker.substr(1), &rank) &&
      rank < 8) {
    return rank;
  }
  return absl::PermissionDeniedError("unknown identity");
}

std::unique_ptr<BulkChannel> Channel(BulkChannelOptions o = {}) {
  o.job_token = o.job_token.empty() ? "token" : o.job_token;
  o.min_bytes = 1024;
  o.stripe_min_bytes = 1 << 20;
  auto c = BulkChannel::Start(o, Authenticate);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

Blob Pattern(size_t n, int seed, std::shared_ptr<std::string>* keep) {
  *keep = std::make_shared<std::string>(n, '\0');
  for (size_t i = 0; i < n; ++i) (**keep)[i] = static_cast<char>((i * 131 + seed) & 0xff);
  Blob b;
  b.pieces.emplace_back((*keep)->data(), n);
  b.owner = *keep;
  return b;
}

Frame WithBlobs(std::vector<Blob> blobs) {
  Frame f;
  f.payload.blobs = std::move(blobs);
  return f;
}

// One record on the wire (B3): a whole blob, or a slice of stripe
// `stripe` at `offset` of a blob of `total` bytes (B10).
std::string Record(uint64_t id, const std::string& data, uint64_t stripe = 0, uint64_t offset = 0,
                   uint64_t total = 0) {
  const uint64_t h[5] = {id, data.size(), stripe, offset, stripe == 0 ? data.size() : total};
  return std::string(reinterpret_cast<const char*>(h), sizeof h) + data;
}

// A record header that announces `size` bytes and is followed by none.
std::string Header(uint64_t id, uint64_t size) {
  const uint64_t h[5] = {id, size, 0, 0, size};
  return std::string(reinterpret_cast<const char*>(h), sizeof h);
}

// Import until done: waits for each `ready` callback.
absl::StatusOr<bool> ImportWaiting(BulkChannel& c, int peer, Frame& frame, absl::Duration timeout) {
  for (;;) {
    auto done = std::make_shared<absl::Notification>();
    absl::StatusOr<bool> got = c.Import(peer, frame, [done] { done->Notify(); });
    if (!got.ok() || *got) return got;
    if (!done->WaitForNotificationWithTimeout(timeout)) return absl::DeadlineExceededError("wait");
  }
}

// A sender (rank 0) and a receiver (rank 1) whose unclaimed budget holds
// one blob of `size` bytes (500 KiB: whole records on either lane; 2 MiB:
// stripes over both, B10), and `n` frames of such blobs exported between
// them, none claimed yet.
struct HeldBack {
  std::unique_ptr<BulkChannel> a, b;
  std::vector<Frame> frames;
  std::vector<std::shared_ptr<std::string>> kept;
  size_t size;
};

HeldBack ExportPastTheBudget(int n, size_t size = 500 << 10) {
  BulkChannelOptions o;
  o.unclaimed_budget = size + size / 5;
  HeldBack h{Channel(), Channel(o), {}, std::vector<std::shared_ptr<std::string>>(n), size};
  h.a->AddPeer(1, h.b->address(), "w0");
  std::shared_ptr<std::string> keep;
  Frame probe = WithBlobs({Pattern(2048, 0, &keep)});
  h.a->Export(1, probe);
  EXPECT_TRUE(h.a->Connected(1, absl::Seconds(10)));
  for (int i = 0; i < n; ++i) {
    h.frames.push_back(WithBlobs({Pattern(size, i + 1, &h.kept[i])}));
    h.a->Export(1, h.frames.back());
    EXPECT_EQ(h.frames.back().header.tcp_blobs_size(), size >= (size_t{1} << 20) ? 2 : 1);
  }
  return h;
}

// Claims every frame's blob in order; each arrives whole.
void ClaimInOrder(HeldBack& h, absl::Duration timeout) {
  for (size_t i = 0; i < h.frames.size(); ++i) {
    auto got = ImportWaiting(*h.b, 0, h.frames[i], timeout);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    ASSERT_NE(h.frames[i].payload.blobs[0].contiguous(), nullptr) << i;
    EXPECT_EQ(std::string(h.frames[i].payload.blobs[0].contiguous(), h.size), *h.kept[i]) << i;
  }
}

// B1, B3: a blob stays in the frame until the connection is up, then goes
// through the channel (the frame carries it empty, named by id) and arrives
// whole, 64-byte aligned, as the receiver's own memory.
TEST(BulkChannel, B1_B3_BlobsGoThroughOnceTheConnectionIsUpAndArriveWhole) {
  auto a = Channel(), b = Channel();
  a->AddPeer(1, b->address(), "w0");
  std::shared_ptr<std::string> keep, small_keep;
  Frame early = WithBlobs({Pattern(1 << 19, 1, &keep)});
  a->Export(1, early);  // starts the connections; the blob stays
  EXPECT_EQ(early.header.tcp_blobs_size(), 0);
  EXPECT_EQ(early.payload.blobs[0].size(), size_t{1} << 19);
  ASSERT_TRUE(a->Connected(1, absl::Seconds(10)));

  // Under stripe_min_bytes: one record, whole (B10).
  Frame f = WithBlobs({Pattern(100, 2, &small_keep), Pattern(1 << 19, 3, &keep)});
  a->Export(1, f);
  ASSERT_EQ(f.header.tcp_blobs_size(), 1);
  EXPECT_EQ(f.header.tcp_blobs(0).index(), 1u);
  EXPECT_EQ(f.header.tcp_blobs(0).size(), uint64_t{1} << 19);
  EXPECT_EQ(f.header.tcp_blobs(0).offset(), 0u);
  EXPECT_EQ(f.payload.blobs[0].size(), 100u);  // under min_bytes: stays
  EXPECT_EQ(f.payload.blobs[1].size(), 0u);
  auto got = ImportWaiting(*b, 0, f, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_NE(f.payload.blobs[1].contiguous(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.payload.blobs[1].contiguous()) % 64, 0u);
  EXPECT_EQ(std::string(f.payload.blobs[1].contiguous(), 1 << 19), *keep);
  EXPECT_EQ(b->stats().bytes_received, uint64_t{1} << 19);
  // The sender counts the record once its write returned, which may be
  // after the receiver read it.
  EXPECT_TRUE(baton::testing::Eventually([&] { return a->stats().blobs_sent == 1; }));
  // A blob is claimed once: naming it again is DATA_LOSS.
  Frame again = WithBlobs({Blob()});
  *again.header.add_tcp_blobs() = f.header.tcp_blobs(0);
  again.header.mutable_tcp_blobs(0)->set_index(0);
  auto second = b->Import(0, again, [] {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDataLoss) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "claimed by another frame"))
      << second.status();
}

// B2: a connection with the wrong token, or an identity that proves no
// worker, is closed unanswered; blobs stay on the stream.
TEST(BulkChannel, B2_AWrongTokenOrIdentityGetsNoConnection) {
  auto b = Channel();
  BulkChannelOptions wrong;
  wrong.job_token = "another job";
  auto a = Channel(wrong);
  a->AddPeer(1, b->address(), "w0");
  std::shared_ptr<std::string> keep;
  Frame f = WithBlobs({Pattern(4096, 1, &keep)});
  a->Export(1, f);
  EXPECT_FALSE(a->Connected(1, absl::Seconds(10)));
  auto c = Channel();
  c->AddPeer(1, b->address(), "stranger");
  c->Export(1, f);
  EXPECT_FALSE(c->Connected(1, absl::Seconds(10)));
  EXPECT_EQ(f.header.tcp_blobs_size(), 0);
  EXPECT_EQ(f.payload.blobs[0].size(), 4096u);
}

// Entries come from a peer: an index out of range, a blob or an id named
// twice, or a blob that did not travel empty is DATA_LOSS, before anything
// waits.
TEST(BulkChannel, BadEntriesAreDataLoss) {
  auto b = Channel();
  std::shared_ptr<std::string> keep;
  auto check = [&](Frame f, absl::string_view what) {
    auto got = b->Import(0, f, [] {});
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << what;
  };
  Frame out_of_range = WithBlobs({Blob()});
  out_of_range.header.add_tcp_blobs()->set_index(1);
  check(std::move(out_of_range), "index");
  Frame twice = WithBlobs({Blob()});
  twice.header.add_tcp_blobs()->set_id(1);
  twice.header.add_tcp_blobs()->set_id(2);
  check(std::move(twice), "twice");
  Frame same_id = WithBlobs({Blob(), Blob()});
  same_id.header.add_tcp_blobs()->set_id(4);
  auto* second = same_id.header.add_tcp_blobs();
  second->set_index(1);
  second->set_id(4);
  check(std::move(same_id), "one id for two blobs");
  Frame full = WithBlobs({Pattern(10, 1, &keep)});
  full.header.add_tcp_blobs()->set_id(1);
  check(std::move(full), "not empty");
}

// A raw connection to `c` that presents `token`, identity "w0" and the
// first id it carries.
int RawConnect(const BulkChannel& c, const std::string& token, bool expect_ack,
               uint64_t first_id = 0, const std::string& identity = "w0", uint32_t lane = 0) {
  const std::string& address = c.address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const uint32_t hello[4] = {0x424e5442, 3, static_cast<uint32_t>(token.size()),
                             static_cast<uint32_t>(identity.size())};
  const uint32_t lane_field[2] = {lane, 0};
  std::string bytes(reinterpret_cast<const char*>(hello), sizeof hello);
  bytes.append(reinterpret_cast<const char*>(&first_id), sizeof first_id);
  bytes.append(reinterpret_cast<const char*>(lane_field), sizeof lane_field);
  bytes += token + identity;
  EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  char ack = 0;
  const ssize_t r = read(fd, &ack, 1);
  EXPECT_EQ(r == 1 && ack == 1, expect_ack);
  return fd;
}

// B6, B8: records are acknowledged as read; when the sender's connection
// ends, what arrived whole stays claimable and a frame waiting for the rest
// waits on (the sender may resume), failing only once the sender stayed
// away for silence_timeout.
TEST(BulkChannel, B6_B8_AWaitOutlivesTheSendersConnectionUntilTheSilenceTimeout) {
  BulkChannelOptions o;
  o.silence_timeout = absl::Seconds(1);
  auto b = Channel(o);
  const int fd = RawConnect(*b, "token", /*expect_ack=*/true);
  std::string record = Record(7, "12345678") + Header(9, 4096) + std::string(100, 'x');
  Frame waiting = WithBlobs({Blob()});
  auto* e = waiting.header.add_tcp_blobs();
  e->set_id(9);
  e->set_size(4096);
  ASSERT_EQ(write(fd, record.data(), record.size()), static_cast<ssize_t>(record.size()));
  uint64_t acked = 0;
  ASSERT_EQ(read(fd, &acked, sizeof acked), static_cast<ssize_t>(sizeof acked));
  EXPECT_EQ(acked, 7u);  // the whole record, not the half one
  const absl::Time ended = absl::Now();
  close(fd);
  auto got = ImportWaiting(*b, 0, waiting, absl::Seconds(10));
  EXPECT_GE(absl::Now() - ended, absl::Milliseconds(900));  // not at the connection's end
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "did not resume")) << got.status();
  Frame done = WithBlobs({Blob()});
  auto* d = done.header.add_tcp_blobs();
  d->set_id(7);
  d->set_size(8);
  ASSERT_TRUE(*b->Import(0, done, [] {}));
  EXPECT_EQ(std::string(done.payload.blobs[0].contiguous(), 8), "12345678");
}

// B8: a record resent on the sender's next connection (its id already read)
// is read, acknowledged and dropped; the frames get each record once.
TEST(BulkChannel, B8_AResendOfARecordAlreadyReadIsDropped) {
  auto b = Channel();
  auto records = [](std::initializer_list<std::pair<uint64_t, std::string>> list) {
    std::string bytes;
    for (const auto& [id, data] : list) bytes += Record(id, data);
    return bytes;
  };
  auto acks = [](int fd, int n) {
    std::vector<uint64_t> got(static_cast<size_t>(n));
    size_t want = got.size() * sizeof(uint64_t), at = 0;
    while (at < want) {
      const ssize_t r = read(fd, reinterpret_cast<char*>(got.data()) + at, want - at);
      if (r <= 0) break;
      at += static_cast<size_t>(r);
    }
    return got;
  };
  const int first = RawConnect(*b, "token", /*expect_ack=*/true, /*first_id=*/1);
  const std::string one = records({{1, "aaa"}, {2, "bbb"}});
  ASSERT_EQ(write(first, one.data(), one.size()), static_cast<ssize_t>(one.size()));
  EXPECT_EQ(acks(first, 2), (std::vector<uint64_t>{1, 2}));
  const int second = RawConnect(*b, "token", /*expect_ack=*/true, /*first_id=*/2);
  const std::string two = records({{2, "BBB"}, {3, "ccc"}});
  ASSERT_EQ(write(second, two.data(), two.size()), static_cast<ssize_t>(two.size()));
  EXPECT_EQ(acks(second, 2), (std::vector<uint64_t>{2, 3}));
  for (const auto& [id, want] :
       {std::pair<uint64_t, std::string>{1, "aaa"}, {2, "bbb"}, {3, "ccc"}}) {
    Frame f = WithBlobs({Blob()});
    auto* e = f.header.add_tcp_blobs();
    e->set_id(id);
    e->set_size(3);
    auto got = ImportWaiting(*b, 0, f, absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << id << ": " << got.status();
    EXPECT_EQ(std::string(f.payload.blobs[0].contiguous(), 3), want) << id;
  }
  EXPECT_EQ(b->stats().blobs_received, 3u);
  close(first);
  close(second);
}

// B6: a frame that began waiting before its sender restarted fails (its
// sender is gone) and takes nothing of the new incarnation, whose ids start
// again; a frame of the new incarnation gets the new record.
TEST(BulkChannel, B6_AWaitFromBeforeTheSendersRestartTakesNothingOfTheNewIncarnation) {
  auto b = Channel();
  const int old_fd = RawConnect(*b, "token", /*expect_ack=*/true, /*first_id=*/1);
  Frame stale = WithBlobs({Blob()});
  auto* e = stale.header.add_tcp_blobs();
  e->set_id(1);
  e->set_size(3);
  uint64_t stale_epoch = 0;
  auto woke = std::make_shared<absl::Notification>();
  ASSERT_FALSE(*b->Import(
      0, stale, [woke] { woke->Notify(); }, &stale_epoch));
  const int new_fd = RawConnect(*b, "token", /*expect_ack=*/true, /*first_id=*/1, "w0#2");
  ASSERT_TRUE(woke->WaitForNotificationWithTimeout(absl::Seconds(10)));
  const std::string bytes = Record(1, "new");
  ASSERT_EQ(write(new_fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  uint64_t acked = 0;
  ASSERT_EQ(read(new_fd, &acked, sizeof acked), static_cast<ssize_t>(sizeof acked));
  auto got = b->Import(
      0, stale, [] {}, &stale_epoch);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "restarted")) << got.status();
  Frame fresh = WithBlobs({Blob()});
  *fresh.header.add_tcp_blobs() = *e;
  uint64_t fresh_epoch = 0;
  auto arrived = b->Import(
      0, fresh, [] {}, &fresh_epoch);
  ASSERT_TRUE(arrived.ok() && *arrived) << arrived.status();
  EXPECT_EQ(std::string(fresh.payload.blobs[0].contiguous(), 3), "new");
  close(old_fd);
  close(new_fd);
}

// B8: a sender whose connection broke while its records were not
// acknowledged (the receiver's budget held them) connects again and sends
// them again: every frame gets its blob, whole, once.
TEST(BulkChannel, B8_ASenderResumesABrokenConnectionAndNoBlobIsLost) {
  HeldBack h = ExportPastTheBudget(4);
  // Nothing is claimed yet: at most the first record was read and
  // acknowledged (the budget holds one), the others wait in the sender.
  h.a->DropConnectionsForTesting();
  ClaimInOrder(h, absl::Seconds(20));
  EXPECT_EQ(h.b->stats().blobs_received, 4u);
  EXPECT_TRUE(h.a->Connected(1, absl::Seconds(10)));  // the resumed connection
}

// B7: a sender's new connection ends its older ones; a frame waiting for
// an id below the new connection's first id fails at once, while one at or
// above it waits for the new connection.
TEST(BulkChannel, B7_ANewConnectionFromTheSenderFailsWaitsForWhatTheOldOneLost) {
  auto b = Channel();
  const int old_fd = RawConnect(*b, "token", /*expect_ack=*/true, /*first_id=*/1);
  Frame lost = WithBlobs({Blob()});
  lost.header.add_tcp_blobs()->set_id(5);
  auto woke = std::make_shared<absl::Notification>();
  ASSERT_FALSE(*b->Import(0, lost, [woke] { woke->Notify(); }));
  const int new_fd = RawConnect(*b, "token", /*expect_ack=*/true, /*first_id=*/10);
  ASSERT_TRUE(woke->WaitForNotificationWithTimeout(absl::Seconds(10)));
  auto got = b->Import(0, lost, [] {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  char c;
  EXPECT_EQ(read(old_fd, &c, 1), 0);  // ended by the channel
  Frame later = WithBlobs({Blob()});
  auto* e = later.header.add_tcp_blobs();
  e->set_id(10);
  e->set_size(3);
  ASSERT_FALSE(*b->Import(0, later, [] {}));
  const std::string bytes = Record(10, "abc");
  ASSERT_EQ(write(new_fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  auto arrived = ImportWaiting(*b, 0, later, absl::Seconds(10));
  ASSERT_TRUE(arrived.ok()) << arrived.status();
  EXPECT_EQ(std::string(later.payload.blobs[0].contiguous(), 3), "abc");
  close(old_fd);
  close(new_fd);
}

// B2, B5: a wrong token gets no answer; a record larger than
// max_blob_bytes ends the connection (its sender's waits end).
TEST(BulkChannel, B5_AnOversizedRecordEndsTheConnection) {
  BulkChannelOptions o;
  o.max_blob_bytes = 1 << 20;
  o.silence_timeout = absl::Seconds(1);  // the waits end then (B6)
  auto b = Channel(o);
  close(RawConnect(*b, "wrong", /*expect_ack=*/false));
  const int fd = RawConnect(*b, "token", /*expect_ack=*/true);
  Frame waiting = WithBlobs({Blob()});
  waiting.header.add_tcp_blobs()->set_id(1);
  auto woke = std::make_shared<absl::Notification>();
  ASSERT_FALSE(*b->Import(0, waiting, [woke] { woke->Notify(); }));
  const std::string huge = Header(1, uint64_t{1} << 40);
  ASSERT_EQ(write(fd, huge.data(), huge.size()), static_cast<ssize_t>(huge.size()));
  ASSERT_TRUE(woke->WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(b->Import(0, waiting, [] {}).status().code(), absl::StatusCode::kUnavailable);
  char c;
  EXPECT_EQ(read(fd, &c, 1), 0);  // closed by the channel
  close(fd);
}

// B4, B5: with an unclaimed budget of one blob, the reader reads on only as
// frames claim what it read; every blob still arrives, in order.
TEST(BulkChannel, B4_B5_ReadingPausedByTheBudgetGoesOnAsFramesClaim) {
  HeldBack h = ExportPastTheBudget(5);
  ClaimInOrder(h, absl::Seconds(10));
}

// ---- B10: lanes and stripes ----

// B10: a blob of stripe_min_bytes or more is cut into one slice per lane
// (4 KiB-aligned, the last one shorter), each a record of its own lane; the
// receiver reads the slices into one buffer, and the frame gets the blob
// whole with no copy: one piece, 64-byte aligned.
TEST(BulkChannel, B10_AStripedBlobArrivesWholeInOneBuffer) {
  for (int lanes : {2, 3}) {
    BulkChannelOptions o;
    o.lanes = lanes;
    auto a = Channel(o), b = Channel(o);
    a->AddPeer(1, b->address(), "w0");
    std::shared_ptr<std::string> keep;
    Frame probe = WithBlobs({Pattern(2048, 0, &keep)});
    a->Export(1, probe);
    ASSERT_TRUE(a->Connected(1, absl::Seconds(10))) << lanes;
    for (const size_t size : {(size_t{3} << 20) + 5, (size_t{1} << 20) + 1}) {
      const uint64_t received = b->stats().blobs_received;
      Frame f = WithBlobs({Pattern(size, lanes, &keep)});
      a->Export(1, f);
      ASSERT_EQ(f.header.tcp_blobs_size(), lanes);
      uint64_t next = 0;
      for (int k = 0; k < lanes; ++k) {
        const proto::TcpBlob& e = f.header.tcp_blobs(k);
        EXPECT_EQ(e.index(), 0u);
        EXPECT_EQ(e.lane(), static_cast<uint32_t>(k));
        EXPECT_EQ(e.offset(), next);
        EXPECT_EQ(e.offset() % 4096, 0u);
        next += e.size();
      }
      EXPECT_EQ(next, size);
      auto got = ImportWaiting(*b, 0, f, absl::Seconds(10));
      ASSERT_TRUE(got.ok()) << got.status();
      const Blob& blob = f.payload.blobs[0];
      ASSERT_NE(blob.contiguous(), nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(blob.contiguous()) % 64, 0u);
      ASSERT_EQ(blob.size(), size);
      EXPECT_EQ(std::string(blob.contiguous(), size), *keep);
      EXPECT_EQ(b->stats().blobs_received, received + static_cast<uint64_t>(lanes));
    }
  }
}

bool WriteWhole(int fd, const std::string& bytes) {
  return write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
}

uint64_t ReadAck(int fd) {
  uint64_t id = 0;
  return read(fd, &id, sizeof id) == static_cast<ssize_t>(sizeof id) ? id : 0;
}

// Whether the channel ends the connection (within 10 s).
bool EndedByTheChannel(int fd) {
  pollfd p{fd, POLLIN, 0};
  char c;
  return poll(&p, 1, 10000) == 1 && read(fd, &c, 1) <= 0;
}

// A frame of one blob named as stripe `stripe`'s two slices of 4 KiB: id 1
// on lane 0 at 0, and id 1 on lane 1 at 4096 (B10).
Frame TwoSlices(uint64_t stripe) {
  Frame f = WithBlobs({Blob()});
  for (uint32_t lane : {0u, 1u}) {
    auto* e = f.header.add_tcp_blobs();
    e->set_id(1);
    e->set_lane(lane);
    e->set_size(4096);
    e->set_offset(4096 * lane);
    e->set_stripe(stripe);
  }
  return f;
}

// B10: a slice that overlaps another of its stripe, or names another total,
// ends its connection; the stripe's own slices still complete it.
TEST(BulkChannel, B10_ASliceThatBreaksItsStripeEndsItsConnection) {
  auto b = Channel();
  const std::string first(4096, 'a'), second(4096, 'b');
  const int lane0 = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/0);
  ASSERT_TRUE(WriteWhole(lane0, Record(1, first, /*stripe=*/7, 0, 8192)));
  EXPECT_EQ(ReadAck(lane0), 1u);
  const int overlapping = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/1);
  ASSERT_TRUE(WriteWhole(overlapping, Record(1, second, 7, 2048, 8192)));
  EXPECT_TRUE(EndedByTheChannel(overlapping));
  const int other_total = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/1);
  ASSERT_TRUE(WriteWhole(other_total, Record(1, second, 7, 4096, 16384)));
  EXPECT_TRUE(EndedByTheChannel(other_total));
  const int good = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/1);
  ASSERT_TRUE(WriteWhole(good, Record(1, second, 7, 4096, 8192)));
  EXPECT_EQ(ReadAck(good), 1u);
  Frame f = TwoSlices(/*stripe=*/7);
  auto got = ImportWaiting(*b, 0, f, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::string(f.payload.blobs[0].contiguous(), 8192), first + second);
  for (int fd : {lane0, overlapping, other_total, good}) close(fd);
}

// B10, B5: a frame whose entries do not match its stripe is DATA_LOSS, and
// the stripe goes with every slice of it: its charge is back in its lane's
// budget (a record the budget could not hold beside it is read and
// claimed on that lane).
TEST(BulkChannel, B10_AFrameThatNamesAStripeWronglyReleasesIt) {
  BulkChannelOptions o;
  o.unclaimed_budget = 12 << 10;
  auto b = Channel(o);
  const int lane0 = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/0);
  const int lane1 = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/1);
  // Lane 0's slice comes first: lane 0 is charged the stripe.
  ASSERT_TRUE(WriteWhole(lane0, Record(1, std::string(4096, 'a'), /*stripe=*/3, 0, 8192)));
  EXPECT_EQ(ReadAck(lane0), 1u);
  ASSERT_TRUE(WriteWhole(lane1, Record(1, std::string(4096, 'b'), 3, 4096, 8192)));
  EXPECT_EQ(ReadAck(lane1), 1u);
  Frame half = WithBlobs({Blob()});
  auto* e = half.header.add_tcp_blobs();
  e->set_id(1);
  e->set_size(4096);  // one slice named as if it were the whole blob
  auto got = b->Import(0, half, [] {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "its frame says")) << got.status();
  Frame both = TwoSlices(/*stripe=*/3);
  EXPECT_EQ(b->Import(0, both, [] {}).status().code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(WriteWhole(lane0, Record(2, std::string(10 << 10, 'c'))));
  Frame next = WithBlobs({Blob()});
  auto* n = next.header.add_tcp_blobs();
  n->set_id(2);
  n->set_size(10 << 10);
  auto read = ImportWaiting(*b, 0, next, absl::Seconds(10));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::string(next.payload.blobs[0].contiguous(), 10 << 10), std::string(10 << 10, 'c'));
  close(lane0);
  close(lane1);
}

// B6, B10: the first connection of a sender's new incarnation, on any
// lane, ends the old incarnation's connections on every lane: nothing they
// still bring is kept.
TEST(BulkChannel, B6_B10_ANewIncarnationEndsTheOldOnesConnectionsOnEveryLane) {
  auto b = Channel();
  const int old_lane1 = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/1);
  const int new_lane0 = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0#2", /*lane=*/0);
  EXPECT_TRUE(EndedByTheChannel(old_lane1));
  ASSERT_TRUE(WriteWhole(new_lane0, Record(1, "new")));
  EXPECT_EQ(ReadAck(new_lane0), 1u);
  close(old_lane1);
  close(new_lane0);
}

// B10: once a frame naming a stripe failed, the stripe's slices that come
// later are read, acknowledged and dropped (they would hold its charge
// forever).
TEST(BulkChannel, B10_ALateSliceOfAFailedStripeIsDropped) {
  auto b = Channel();
  const int lane0 = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/0);
  ASSERT_TRUE(WriteWhole(lane0, Record(1, std::string(4096, 'a'), /*stripe=*/9, 0, 8192)));
  EXPECT_EQ(ReadAck(lane0), 1u);
  Frame f = TwoSlices(/*stripe=*/9);
  // Lane 1 has no connection yet: the sender never named it (UNAVAILABLE).
  auto got = b->Import(0, f, [] {});
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "on lane 1")) << got.status();
  const int lane1 = RawConnect(*b, "token", /*expect_ack=*/true, 1, "w0", /*lane=*/1);
  ASSERT_TRUE(WriteWhole(lane1, Record(1, std::string(4096, 'b'), 9, 4096, 8192)));
  EXPECT_EQ(ReadAck(lane1), 1u);
  EXPECT_EQ(b->stats().blobs_received, 1u);  // the late slice was not kept
  close(lane0);
  close(lane1);
}

// B10, B5: under a budget of one stripe, the first slice of the next stripe
// waits until a frame claims the last one, the other slices of a stripe
// never wait; every blob arrives whole, in order.
TEST(BulkChannel, B10_B5_StripesUnderABudgetOfOneArriveInOrder) {
  HeldBack h = ExportPastTheBudget(5, size_t{2} << 20);
  ClaimInOrder(h, absl::Seconds(10));
}

// B10, B8: every lane resumes its own records after the sender's
// connections broke; the stripes arrive whole, once.
TEST(BulkChannel, B10_B8_StripesSurviveBrokenConnections) {
  HeldBack h = ExportPastTheBudget(4, size_t{2} << 20);
  h.a->DropConnectionsForTesting();
  ClaimInOrder(h, absl::Seconds(20));
  EXPECT_EQ(h.b->stats().blobs_received, 8u);
}

// ---- B9: mutual TLS ----

// A CA with certificates "node" (IP:127.0.0.1) and "elsewhere" (only
// IP:10.9.9.9) in dir/; another CA with "rogue" (IP:127.0.0.1) in dir/other/
// (tools/make_certs.sh).
const std::string& Certificates() {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "/bulk_certs";
    const std::string cmd = "bash tools/make_certs.sh " + d +
                            " node elsewhere:IP:10.9.9.9 && bash tools/make_certs.sh " + d +
                            "/other rogue";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}

TlsConfig TlsOf(const std::string& dir, const std::string& name) {
  auto config =
      LoadTls({dir + "/ca.pem", dir + "/" + name + ".pem", dir + "/" + name + ".key", ""});
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::unique_ptr<BulkChannel> TlsChannel(TlsConfig tls) {
  BulkChannelOptions o;
  o.tls = std::move(tls);
  o.handshake_timeout = absl::Seconds(3);
  return Channel(o);
}

// B9, B3, B10: between two workers of the job's CA, blobs travel inside
// mutual TLS (those of 1 MiB or more as stripes over both lanes) and arrive
// whole, in order, each record acknowledged (the sender keeps none).
TEST(BulkChannel, B9_UnderTlsBlobsTravelInsideMutualTlsAndArriveWhole) {
  auto a = TlsChannel(TlsOf(Certificates(), "node"));
  auto b = TlsChannel(TlsOf(Certificates(), "node"));
  a->AddPeer(1, b->address(), "w0");
  std::shared_ptr<std::string> keep;
  Frame probe = WithBlobs({Pattern(2048, 0, &keep)});
  a->Export(1, probe);
  ASSERT_TRUE(a->Connected(1, absl::Seconds(10)));
  std::vector<std::shared_ptr<std::string>> kept(3);
  std::vector<Frame> frames;
  const size_t sizes[] = {size_t{1} << 20, (size_t{3} << 20) + 17, 4096};
  for (int i = 0; i < 3; ++i) {
    frames.push_back(WithBlobs({Pattern(sizes[i], i + 1, &kept[i])}));
    a->Export(1, frames.back());
    ASSERT_EQ(frames.back().header.tcp_blobs_size(), sizes[i] >= (size_t{1} << 20) ? 2 : 1) << i;
  }
  for (int i = 0; i < 3; ++i) {
    auto got = ImportWaiting(*b, 0, frames[i], absl::Seconds(10));
    ASSERT_TRUE(got.ok() && *got) << i << ": " << got.status();
    EXPECT_EQ(std::string(frames[i].payload.blobs[0].contiguous(), sizes[i]), *kept[i]) << i;
  }
  EXPECT_EQ(b->stats().blobs_received, 5u);
  EXPECT_EQ(b->stats().bytes_received, sizes[0] + sizes[1] + sizes[2]);
  EXPECT_TRUE(testing::Eventually([&] { return a->stats().blobs_sent == 5; }));
}

// B9: a sender whose certificate another CA signed, or that has none (plain
// TCP), gets no connection: its blobs stay on the stream. A TLS sender gets
// none from a plain receiver either.
TEST(BulkChannel, B9_APeerWithoutACertificateOfTheJobsCaGetsNoConnection) {
  auto receiver = TlsChannel(TlsOf(Certificates(), "node"));
  auto plain_receiver = Channel();
  auto rogue = TlsChannel(TlsOf(Certificates() + "/other", "rogue"));
  auto plain = Channel();
  auto node = TlsChannel(TlsOf(Certificates(), "node"));
  rogue->AddPeer(1, receiver->address(), "w0");
  plain->AddPeer(1, receiver->address(), "w2");
  node->AddPeer(1, plain_receiver->address(), "w3");
  std::shared_ptr<std::string> keep;
  for (BulkChannel* sender : {rogue.get(), plain.get(), node.get()}) {
    Frame f = WithBlobs({Pattern(4096, 1, &keep)});
    sender->Export(1, f);  // starts the connection
  }
  // The attempts were made, and refused.
  EXPECT_TRUE(testing::Eventually([&] { return receiver->stats().connections_refused >= 2; }));
  EXPECT_TRUE(
      testing::Eventually([&] { return plain_receiver->stats().connections_refused >= 1; }));
  for (BulkChannel* sender : {rogue.get(), plain.get(), node.get()}) {
    EXPECT_FALSE(sender->Connected(1, absl::Seconds(3)));
    Frame f = WithBlobs({Pattern(4096, 2, &keep)});
    sender->Export(1, f);
    EXPECT_EQ(f.header.tcp_blobs_size(), 0);  // it stays on the stream
  }
  EXPECT_EQ(receiver->stats().blobs_received, 0u);
  // The receiver itself takes a sender of the job's CA.
  auto good = TlsChannel(TlsOf(Certificates(), "node"));
  good->AddPeer(1, receiver->address(), "w4");
  Frame f = WithBlobs({Pattern(4096, 3, &keep)});
  good->Export(1, f);
  EXPECT_TRUE(good->Connected(1, absl::Seconds(10)));
}

// B9, each side's check on its own: a receiver refuses a sender that trusts
// the job's CA but presents a certificate another CA signed (the receiver's
// check), and a sender refuses a receiver whose certificate of the job's CA
// names another address than the one dialled (the sender's check).
TEST(BulkChannel, B9_EachSideChecksThePeersCertificate) {
  const std::string& d = Certificates();
  auto receiver = TlsChannel(TlsOf(d, "node"));
  TlsConfig impostor = TlsOf(d + "/other", "rogue");
  impostor.ca_pem = TlsOf(d, "node").ca_pem;  // it trusts the job's CA
  auto sender = TlsChannel(impostor);
  sender->AddPeer(1, receiver->address(), "w0");
  std::shared_ptr<std::string> keep;
  Frame f = WithBlobs({Pattern(4096, 1, &keep)});
  sender->Export(1, f);
  EXPECT_TRUE(testing::Eventually([&] { return receiver->stats().connections_refused >= 1; }));
  EXPECT_FALSE(sender->Connected(1, absl::Seconds(3)));

  auto misnamed = TlsChannel(TlsOf(d, "elsewhere"));  // listens on 127.0.0.1
  auto node = TlsChannel(TlsOf(d, "node"));
  node->AddPeer(1, misnamed->address(), "w2");
  Frame g = WithBlobs({Pattern(4096, 2, &keep)});
  node->Export(1, g);
  // The sender ends the handshake: the receiver sees a refused connection.
  EXPECT_TRUE(testing::Eventually([&] { return misnamed->stats().connections_refused >= 1; }));
  EXPECT_FALSE(node->Connected(1, absl::Seconds(3)));
  EXPECT_EQ(misnamed->stats().blobs_received, 0u);
}

// B9: a certificate or key that cannot be read fails Start, saying which.
TEST(BulkChannel, B9_ATlsConfigWithoutAUsableKeyFailsStart) {
  TlsConfig tls = TlsOf(Certificates(), "node");
  tls.key_pem = "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n";
  BulkChannelOptions o;
  o.job_token = "token";
  o.tls = tls;
  auto c = BulkChannel::Start(o, Authenticate);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "private key")) << c.status();
}

}  // namespace
}  // namespace baton::rpc::internal
