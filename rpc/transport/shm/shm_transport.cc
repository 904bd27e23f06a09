#include "rpc/transport/shm/shm_transport.h"

#include <algorithm>
#include <deque>
#include <utility>

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/host.h"
#include "base/shm_segment.h"
#include "base/status_macros.h"
#include "rpc/channel/shm/shm_channel.h"

namespace baton::rpc::internal {
namespace {

constexpr uint64_t kMagic = 0x31766e6b6e6f7462ULL;  // "btonknv1"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kRecordHeader = 8;
constexpr uint32_t kMoreFragments = 1;
constexpr absl::Duration kSleepBound = absl::Milliseconds(100);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const int64_t ns = absl::ToInt64Nanoseconds(timeout);
  struct timespec ts {
    static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)  // NOLINT
  };
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }

std::string RandomSuffix() { return RandomHex(8); }

}  // namespace

// ---- shared layouts --------------------------------------------------------

struct ShmTransport::Hub {
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint32_t> sleeping;
};

namespace {

struct RingHeader {
  alignas(64) std::atomic<uint64_t> head;   // bytes written (producer)
  alignas(64) std::atomic<uint64_t> tail;   // bytes read (consumer)
  alignas(64) std::atomic<uint32_t> space;  // bumped when the consumer frees space
  std::atomic<uint32_t> writer_waiting;
};

struct LinkHeader {
  uint64_t magic;
  uint64_t ring_bytes;
  alignas(64) std::atomic<uint32_t> opened;
  // Set by a side whose transport closed (its agent shut down) while its
  // process lives on: [0] the creator, [1] the opener (T3).
  std::atomic<uint32_t> closed_by[2];
  RingHeader rings[2];  // 0: creator -> opener, 1: opener -> creator
};
static_assert(sizeof(LinkHeader) <= kHeaderBytes);

}  // namespace

struct ShmTransport::Link {
  int peer = -1;
  bool creator = false;
  std::string name;  // unlinked once both sides mapped it
  ShmSegment segment;
  size_t cap = 0;
  ShmSegment peer_hub_segment;
  Hub* peer_hub = nullptr;  // in peer_hub_segment
  pid_t peer_pid = 0;
  int pidfd = -1;
  std::atomic<bool> closed{false};

  // Outgoing ring (any thread, under send_mu).
  absl::Mutex send_mu;
  // Requests written and perhaps not yet read: (ring position just past
  // the request's last byte, its id), oldest first. Entries the peer's read
  // position passed are dropped as the next request is written; the rest
  // name, when the peer dies, the requests it never read (T5).
  std::deque<std::pair<uint64_t, uint64_t>> requests_in_ring ABSL_GUARDED_BY(send_mu);
  // Incoming ring (the receiver thread only).
  std::string partial;

  char* base() const { return static_cast<char*>(segment.data()); }
  LinkHeader* header() const { return reinterpret_cast<LinkHeader*>(base()); }
  RingHeader& out() const { return header()->rings[creator ? 0 : 1]; }
  RingHeader& in() const { return header()->rings[creator ? 1 : 0]; }
  char* out_data() const { return base() + kHeaderBytes + (creator ? 0 : cap); }
  char* in_data() const { return base() + kHeaderBytes + (creator ? cap : 0); }
  void Ring() const {
    peer_hub->doorbell.fetch_add(1, std::memory_order_seq_cst);
    if (peer_hub->sleeping.load(std::memory_order_seq_cst) != 0) FutexWake(&peer_hub->doorbell);
  }

  ~Link() {
    if (pidfd >= 0) close(pidfd);
  }
};

// Replies to requests that came in on a link go back on it.
class ShmTransport::Reply : public ReplyChannel {
 public:
  Reply(ShmTransport* transport, std::shared_ptr<Link> link)
      : transport_(transport), link_(std::move(link)) {}
  bool Send(Frame frame) override { return transport_->Write(*link_, std::move(frame)).ok(); }

 private:
  ShmTransport* const transport_;
  const std::shared_ptr<Link> link_;
};

// ---- setup -----------------------------------------------------------------

ShmTransport::ShmTransport(ShmTransportOptions options, int rank, int world_size,
                           TransportHandler* handler)
    : options_(options), rank_(rank), handler_(handler), links_(world_size) {}

absl::StatusOr<std::unique_ptr<ShmTransport>> ShmTransport::Create(ShmTransportOptions options,
                                                                   int rank, int world_size,
                                                                   TransportHandler* handler) {
  if (options.ring_bytes < 4096 || options.ring_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory transport: ring_bytes must be a multiple of 64, at least 4096; got ",
        options.ring_bytes));
  }
  std::unique_ptr<ShmTransport> t(new ShmTransport(options, rank, world_size, handler));
  // Marked alive before any object exists (ShmChannel's S5).
  auto marker = LivenessMarker::Create(ShmChannel::ObjectPrefix(getpid()));
  if (marker.ok()) t->alive_ = *std::move(marker);
  t->hub_name_ = absl::StrCat("/", ShmChannel::ObjectPrefix(getpid()), "hub.", RandomSuffix());
  auto hub = ShmSegment::Create(t->hub_name_, kHeaderBytes);
  if (!hub.ok()) return absl::UnavailableError(hub.status().message());
  t->hub_segment_ = *std::move(hub);
  t->hub_ = new (t->hub_segment_.data()) Hub();
  t->hub_->doorbell.store(0);
  t->hub_->sleeping.store(0);
  return t;
}

ShmTransport::~ShmTransport() {
  Close();
  hub_segment_.Unlink();
}

absl::StatusOr<std::string> ShmTransport::CreateLink(int peer, const std::string& peer_hub,
                                                     pid_t peer_pid) {
  auto link = std::make_shared<Link>();
  link->peer = peer;
  link->creator = true;
  link->cap = options_.ring_bytes;
  link->name =
      absl::StrCat("/", ShmChannel::ObjectPrefix(getpid()), "l", peer, ".", RandomSuffix());
  auto segment = ShmSegment::Create(link->name, kHeaderBytes + 2 * link->cap);
  if (!segment.ok()) return absl::UnavailableError(segment.status().message());
  link->segment = *std::move(segment);
  LinkHeader* h = new (link->segment.data()) LinkHeader();
  h->magic = kMagic;
  h->ring_bytes = link->cap;
  h->opened.store(0);
  h->closed_by[0].store(0);
  h->closed_by[1].store(0);
  for (RingHeader& r : h->rings) {
    r.head.store(0);
    r.tail.store(0);
    r.space.store(0);
    r.writer_waiting.store(0);
  }
  auto hub = ShmSegment::Open(peer_hub, kHeaderBytes);
  if (!hub.ok()) {
    link->segment.Unlink();
    return absl::UnavailableError(hub.status().message());
  }
  link->peer_hub_segment = *std::move(hub);
  link->peer_hub = static_cast<Hub*>(link->peer_hub_segment.data());
  link->peer_pid = peer_pid;
  link->pidfd = static_cast<int>(syscall(SYS_pidfd_open, peer_pid, 0));
  const std::string name = link->name;
  links_[peer] = std::move(link);
  return name;
}

absl::Status ShmTransport::OpenLink(int peer, const std::string& name, const std::string& peer_hub,
                                    pid_t peer_pid) {
  auto link = std::make_shared<Link>();
  link->peer = peer;
  link->creator = false;
  link->cap = options_.ring_bytes;
  link->name = name;
  auto segment = ShmSegment::Open(name, kHeaderBytes + 2 * link->cap);
  if (!segment.ok()) return absl::UnavailableError(segment.status().message());
  link->segment = *std::move(segment);
  if (link->header()->magic != kMagic || link->header()->ring_bytes != link->cap) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared-memory link ", name, " has another layout or ring size (ring_bytes ",
                     link->header()->ring_bytes, ", ours ", link->cap, ")"));
  }
  auto hub = ShmSegment::Open(peer_hub, kHeaderBytes);
  if (!hub.ok()) return absl::UnavailableError(hub.status().message());
  link->peer_hub_segment = *std::move(hub);
  link->peer_hub = static_cast<Hub*>(link->peer_hub_segment.data());
  link->peer_pid = peer_pid;
  link->pidfd = static_cast<int>(syscall(SYS_pidfd_open, peer_pid, 0));
  link->segment.Unlink();  // both sides hold it now
  link->header()->opened.store(1, std::memory_order_seq_cst);
  links_[peer] = std::move(link);
  return absl::OkStatus();
}

std::vector<int> ShmTransport::Activate(const std::vector<int>& superseded) {
  for (size_t p = 0; p < links_.size(); ++p) {
    auto& link = links_[p];
    if (link == nullptr) continue;
    if (std::find(superseded.begin(), superseded.end(), static_cast<int>(p)) != superseded.end()) {
      if (link->creator) link->segment.Unlink();
      link.reset();
      continue;
    }
    if (link->creator) {
      link->segment.Unlink();  // the opener did, unless it never opened
      if (link->header()->opened.load(std::memory_order_seq_cst) == 0) {
        link.reset();
        continue;
      }
    }
    active_.push_back(static_cast<int>(p));
  }
  // Every peer mapped our hub before the barrier that precedes this call.
  hub_segment_.Unlink();
  receiver_ = std::thread([this] { ReceiveLoop(); });
  return active_;
}

bool ShmTransport::connected(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(links_.size())) return false;
  const auto& link = links_[peer];
  return link != nullptr && !link->closed.load(std::memory_order_acquire);
}

// ---- sending ---------------------------------------------------------------

absl::StatusOr<uint64_t> ShmTransport::Send(int peer, Frame frame) {
  if (!connected(peer)) {
    return absl::UnavailableError(absl::StrCat("no shared-memory link to worker ", peer));
  }
  RETURN_IF_ERROR(Write(*links_[peer], std::move(frame)));
  return kStreamBase + static_cast<uint64_t>(peer);
}

absl::Status ShmTransport::Write(Link& link, Frame frame) {
  // A closed link (Close(), Disconnect(), a dead peer) takes nothing more,
  // even while its ring has room: its reply channels then say so.
  auto closed_error = [&link] {
    return absl::UnavailableError(
        absl::StrCat("shared-memory link to worker ", link.peer, " is closed"));
  };
  if (link.closed.load(std::memory_order_acquire)) return closed_error();
  const bool request = frame.header.kind() == proto::FrameHeader::REQUEST;
  const uint64_t id = frame.header.id();
  std::vector<grpc::Slice> slices;
  const size_t total = AppendFrame(std::move(frame), &slices);
  RingHeader& ring = link.out();
  char* data = link.out_data();
  const size_t cap = link.cap;
  const size_t max_fragment = cap / 2 - kRecordHeader;
  const absl::Time deadline = absl::Now() + options_.send_timeout;
  absl::Status broken;  // a frame left half written: the link must close
  {
    absl::MutexLock lock(&link.send_mu);
    // Checked again under the lock: CloseLink takes it after marking the
    // link closed, so no frame lands in a ring it already looked at (T5).
    if (link.closed.load(std::memory_order_acquire)) return closed_error();
    uint64_t head = ring.head.load(std::memory_order_relaxed);
    if (request) {
      const uint64_t read = ring.tail.load(std::memory_order_acquire);
      auto& in_ring = link.requests_in_ring;
      while (!in_ring.empty() && in_ring.front().first <= read) in_ring.pop_front();
    }
    size_t slice = 0, offset = 0, left = total;
    do {
      const size_t len = std::min(left, max_fragment);
      const size_t need = kRecordHeader + Align8(len);
      // Wait for room: spin a little, then sleep on the ring's space word.
      int spins = 0;
      absl::Status stuck;
      while (cap - (head - ring.tail.load(std::memory_order_acquire)) < need) {
        if (link.closed.load(std::memory_order_acquire)) {
          stuck = absl::UnavailableError("shared-memory link closed (the worker died)");
          break;
        }
        if (++spins < 200) {
          CpuRelax();
          continue;
        }
        if (absl::Now() > deadline) {
          stuck = absl::UnavailableError(absl::StrCat(
              "shared-memory ring to worker ", link.peer, " stayed full for ",
              absl::FormatDuration(options_.send_timeout), " (the worker does not read)"));
          break;
        }
        const uint32_t seen = ring.space.load(std::memory_order_seq_cst);
        ring.writer_waiting.store(1, std::memory_order_seq_cst);
        if (cap - (head - ring.tail.load(std::memory_order_seq_cst)) < need) {
          FutexWait(&ring.space, seen, absl::Milliseconds(10));
        }
        ring.writer_waiting.store(0, std::memory_order_relaxed);
      }
      if (!stuck.ok()) {
        // Fragments already in the ring would run into the next frame:
        // nothing more may follow them on this link.
        if (left < total && !link.closed.exchange(true)) broken = stuck;
        if (broken.ok()) return stuck;
        break;
      }
      // Record header (8-aligned positions never straddle the end), then data.
      const uint32_t flags = left > len ? kMoreFragments : 0;
      uint32_t rec[2] = {static_cast<uint32_t>(len), flags};
      std::memcpy(data + head % cap, rec, kRecordHeader);
      size_t pos = (head + kRecordHeader) % cap;
      size_t copied = 0;
      while (copied < len) {
        const grpc::Slice& s = slices[slice];
        const size_t take = std::min({len - copied, s.size() - offset, cap - pos});
        std::memcpy(data + pos, s.begin() + offset, take);
        copied += take;
        offset += take;
        pos = (pos + take) % cap;
        if (offset == s.size()) {
          ++slice;
          offset = 0;
        }
      }
      head += need;
      ring.head.store(head, std::memory_order_release);
      link.Ring();
      left -= len;
    } while (left > 0);
    if (broken.ok() && request) link.requests_in_ring.emplace_back(head, id);
  }
  if (!broken.ok()) {
    // Marked closed above; the handler hears of it outside the lock.
    NotifyClosed(link, broken);
    return broken;
  }
  frames_sent_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

// ---- receiving -------------------------------------------------------------

bool ShmTransport::Poll() {
  bool any = false;
  for (int p : active_) {
    const std::shared_ptr<Link>& link = links_[p];
    if (link == nullptr || link->closed.load(std::memory_order_relaxed)) continue;
    RingHeader& ring = link->in();
    const char* data = link->in_data();
    const size_t cap = link->cap;
    uint64_t tail = ring.tail.load(std::memory_order_relaxed);
    const uint64_t head = ring.head.load(std::memory_order_acquire);
    while (tail < head) {
      uint32_t rec[2];
      std::memcpy(rec, data + tail % cap, kRecordHeader);
      const size_t len = rec[0];
      const bool more = (rec[1] & kMoreFragments) != 0;
      if (len > cap / 2 || tail + kRecordHeader + Align8(len) > head) {
        CloseLink(p, absl::DataLossError(absl::StrCat("corrupt record of ", len,
                                                      " bytes on the shared-memory link")));
        break;
      }
      const size_t start = (tail + kRecordHeader) % cap;
      const size_t first = std::min(len, cap - start);
      grpc::Slice slice;
      if (!more && link->partial.empty()) {
        slice = grpc::Slice(len);
        std::memcpy(const_cast<uint8_t*>(slice.begin()), data + start, first);
        std::memcpy(const_cast<uint8_t*>(slice.begin()) + first, data, len - first);
      } else {
        link->partial.append(data + start, first);
        link->partial.append(data, len - first);
      }
      tail += kRecordHeader + Align8(len);
      ring.tail.store(tail, std::memory_order_seq_cst);
      if (ring.writer_waiting.load(std::memory_order_seq_cst) != 0) {
        ring.space.fetch_add(1, std::memory_order_seq_cst);
        FutexWake(&ring.space);
      }
      if (more) continue;
      if (!link->partial.empty()) {
        slice = grpc::Slice(link->partial);
        link->partial.clear();
      }
      grpc::ByteBuffer packet(&slice, 1);
      std::vector<Frame> frames;
      if (absl::Status s = ParsePacket(&packet, PacketSource::kBaton, &frames); !s.ok()) {
        CloseLink(p, s);
        break;
      }
      any = true;
      for (Frame& f : frames) {
        frames_received_.fetch_add(1, std::memory_order_relaxed);
        // A link joins two ranks: its requests come from its peer, and a
        // frame that claims another caller breaks the link (flow control
        // counts requests per caller, so none may borrow another's room).
        if (f.header.kind() == proto::FrameHeader::REQUEST && f.header.caller_id() != p) {
          CloseLink(p, absl::PermissionDeniedError(absl::StrCat(
                           "a request on the shared-memory link from worker ", p,
                           " claims caller id ", f.header.caller_id(), "; link closed")));
          break;
        }
        if (f.header.kind() == proto::FrameHeader::REQUEST) {
          handler_->OnRequest(std::make_shared<Reply>(this, link), std::move(f));
        } else {
          handler_->OnResponse(p, std::move(f));
        }
      }
    }
  }
  return any;
}

void ShmTransport::CheckPeers() {
  for (int p : active_) {
    const std::shared_ptr<Link>& link = links_[p];
    if (link == nullptr || link->closed.load(std::memory_order_relaxed)) continue;
    if (PeerExited(*link)) {
      CloseLink(p, absl::UnavailableError(absl::StrCat("the process of worker ", p, " (pid ",
                                                       link->peer_pid, ") exited")));
    } else if (link->header()->closed_by[link->creator ? 1 : 0].load(std::memory_order_acquire)) {
      CloseLink(
          p, absl::UnavailableError(absl::StrCat("worker ", p,
                                                 " closed its shared-memory link (its agent shut "
                                                 "down)")));
    }
  }
}

void ShmTransport::Disconnect(int peer, const absl::Status& cause) {
  if (!connected(peer)) return;
  CloseLink(peer, cause);
}

bool ShmTransport::PeerExited(const Link& link) {
  if (link.pidfd >= 0) {
    struct pollfd pfd {
      link.pidfd, POLLIN, 0
    };
    return poll(&pfd, 1, 0) > 0;
  }
  return kill(link.peer_pid, 0) != 0 && errno == ESRCH;
}

void ShmTransport::CloseLink(int peer, const absl::Status& cause) {
  Link& link = *links_[peer];
  if (link.closed.exchange(true)) return;
  NotifyClosed(link, cause);
}

void ShmTransport::NotifyClosed(Link& link, const absl::Status& cause) {
  const uint64_t stream = kStreamBase + static_cast<uint64_t>(link.peer);
  // T5: with the peer's process gone its read position is final; requests
  // past it never reached its handler (Poll hands a frame on only after
  // moving the position past its last byte). A live peer may still read
  // what is in the ring, so nothing is claimed for it.
  if (PeerExited(link)) {
    std::vector<uint64_t> unread;
    {
      // Waits out a writer that passed the closed check before the link
      // was marked; later writers see the mark.
      absl::MutexLock lock(&link.send_mu);
      const uint64_t read = link.out().tail.load(std::memory_order_acquire);
      for (const auto& [end, id] : link.requests_in_ring) {
        if (end > read) unread.push_back(id);
      }
      link.requests_in_ring.clear();
    }
    if (!unread.empty()) handler_->OnRequestsUnread(link.peer, stream, unread, cause);
  }
  handler_->OnStreamClosed(link.peer, stream, cause);
}

void ShmTransport::ReceiveLoop() {
  absl::Time last_check = absl::Now();
  const absl::Duration min_spin = absl::Microseconds(2);
  absl::Duration spin = options_.spin;
  while (!stop_.load(std::memory_order_acquire)) {
    bool got = Poll();
    if (!got && spin > absl::ZeroDuration()) {
      // Adaptive spin: worth it while replies come back quickly (a caller
      // waits for them); yields so that the thread producing them can run
      // on a busy machine.
      const absl::Time spin_end = absl::Now() + spin;
      int rounds = 0;
      while (!got && absl::Now() < spin_end && !stop_.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 32; ++i) CpuRelax();
        if (++rounds % 8 == 0) sched_yield();
        got = Poll();
      }
      spin = got ? std::min(options_.spin, spin * 2) : std::max(min_spin, spin / 2);
    }
    if (!got) {
      hub_->sleeping.store(1, std::memory_order_seq_cst);
      const uint32_t seq = hub_->doorbell.load(std::memory_order_seq_cst);
      got = Poll();
      if (!got && !stop_.load(std::memory_order_acquire)) {
        sleeps_.fetch_add(1, std::memory_order_relaxed);
        FutexWait(&hub_->doorbell, seq, kSleepBound);
      }
      hub_->sleeping.store(0, std::memory_order_relaxed);
    }
    const absl::Time now = absl::Now();
    if (now - last_check >= kSleepBound) {
      CheckPeers();
      last_check = now;
    }
  }
}

void ShmTransport::Close() {
  {
    absl::MutexLock lock(&close_mu_);
    if (closed_) return;
    closed_ = true;
  }
  stop_.store(true, std::memory_order_release);
  if (hub_ != nullptr) {
    hub_->doorbell.fetch_add(1);
    FutexWake(&hub_->doorbell);
  }
  if (receiver_.joinable()) receiver_.join();
  for (auto& link : links_) {
    if (link == nullptr) continue;
    link->closed.store(true, std::memory_order_release);
    // T3: the peer learns it at its next check, as if this process exited.
    link->header()->closed_by[link->creator ? 0 : 1].store(1, std::memory_order_release);
    link->Ring();
  }
}

ShmTransport::Stats ShmTransport::stats() const {
  Stats s;
  s.frames_sent = frames_sent_.load();
  s.frames_received = frames_received_.load();
  s.sleeps = sleeps_.load();
  return s;
}

}  // namespace baton::rpc::internal
