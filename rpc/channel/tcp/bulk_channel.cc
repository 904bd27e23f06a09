#include "rpc/channel/tcp/bulk_channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "rpc/channel/tcp/connection.h"
#include "rpc/channel/tcp/socket_io.h"

namespace baton::rpc::internal {
namespace {

using tcp::Connect;
using tcp::Discard;
using tcp::NoDelay;
using tcp::ReadAll;
using tcp::SameBytes;
using tcp::SetTimeout;
using tcp::Tolerate;
using tcp::WriteAll;

constexpr uint32_t kMagic = 0x424e5442;  // "BTNB"
constexpr uint32_t kVersion = 3;         // 2: acknowledgements (B8); 3: lanes, stripes (B10)
constexpr uint32_t kMaxHelloField = 4096;
constexpr int kMaxHandshakes = 64;  // unauthenticated connections at once
constexpr size_t kAlign = 64;

constexpr uint64_t kStripeAlign = 4096;

struct Hello {
  uint32_t magic, version, token_len, identity_len;
  uint64_t first_id;        // the connection's first record id; none below it follows (B7, B8)
  uint32_t lane, reserved;  // B10
};
struct RecordHeader {
  uint64_t id, size;
  uint64_t stripe, offset, total;  // B10: 0, 0, size for a whole blob
};

// The part [offset, offset + size) of `blob`, sharing its memory.
Blob SliceOf(const Blob& blob, size_t offset, size_t size) {
  Blob slice;
  slice.owner = blob.owner;
  for (const auto& piece : blob.pieces) {
    if (size == 0) break;
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    const size_t n = std::min(size, piece.size() - offset);
    slice.pieces.emplace_back(piece.data() + offset, n);
    offset = 0;
    size -= n;
  }
  return slice;
}

// The id after `id`, saturating: ids come from a peer.
uint64_t After(uint64_t id) { return id == UINT64_MAX ? id : id + 1; }

}  // namespace

// Buffers of received blobs, reused once the tensors decoded from them die:
// fresh pages for every large blob cost the kernel a fault and a zeroing
// each (64 MiB: a third of the transfer). Keeps at most kKeep buffers and
// kKeepBytes; a kept buffer serves a blob of at least half its size.
class BulkChannel::BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr size_t kKeep = 8;
  static constexpr size_t kKeepBytes = size_t{256} << 20;

  std::shared_ptr<char> Allocate(uint64_t size) {
    const size_t rounded = (std::max<uint64_t>(size, 1) + kAlign - 1) / kAlign * kAlign;
    char* p = nullptr;
    size_t capacity = rounded;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second >= rounded && it->second / 2 <= rounded) {
          p = it->first;
          capacity = it->second;
          kept_bytes_ -= capacity;
          free_.erase(it);
          break;
        }
      }
    }
    if (p == nullptr) p = static_cast<char*>(std::aligned_alloc(kAlign, rounded));
    if (p == nullptr) return nullptr;
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<char>(p, [pool, capacity](char* q) {
      if (auto alive = pool.lock(); alive != nullptr && alive->Keep(q, capacity)) return;
      std::free(q);
    });
  }

  ~BufferPool() {
    for (auto& [p, capacity] : free_) std::free(p);
  }

 private:
  bool Keep(char* p, size_t capacity) {
    if (capacity < (size_t{1} << 20)) return false;
    absl::MutexLock lock(&mu_);
    if (free_.size() >= kKeep || kept_bytes_ + capacity > kKeepBytes) return false;
    free_.emplace_back(p, capacity);
    kept_bytes_ += capacity;
    return true;
  }

  absl::Mutex mu_;
  std::vector<std::pair<char*, size_t>> free_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

struct BulkChannel::Outgoing {
  enum class State { kIdle, kConnecting, kReady, kBroken };
  struct Item {
    uint64_t id;
    Blob blob;
    uint64_t stripe = 0, offset = 0, total = 0;  // B10
  };
  int lane = 0;
  std::string address;
  std::string identity;
  State state = State::kIdle;
  absl::Time retry_at;
  bool stop = false;
  int fd = -1;                     // set by the writer once connected; shutdown(2) by Close
  bool ended = false;              // the connection's acknowledgements ended (B8)
  bool progressed = false;         // the connection had a record acknowledged (B8)
  bool handshake_failing = false;  // said once until a connection succeeds (B9)
  uint64_t next_id = 1;
  uint64_t next_stripe = 1;  // lane 0's: the peer's stripes (B10)
  std::deque<Item> queue;
  std::deque<Item> sent;  // written, not acknowledged yet (B8)
  std::thread thread;
};

struct BulkChannel::Incoming {
  int fd = -1;
  int peer = -1;
  int lane = 0;
  bool done = false;
  bool superseded = false;  // a newer connection from its sender came (B7)
  std::thread thread;
};

struct BulkChannel::Arrivals {
  struct Arrived {
    std::shared_ptr<char> data;  // a stripe's: its whole buffer (B10)
    uint64_t size = 0;
    uint64_t stripe = 0, offset = 0, total = 0;
  };
  // A part of a stripe read (owner null) or being read by `owner`.
  struct Taken {
    uint64_t begin, end;
    const Incoming* owner;
  };
  // A striped blob's buffer, filled by its slices on every lane (B10).
  struct Stripe {
    std::shared_ptr<char> data;
    uint64_t total = 0;
    int lane = 0;       // the lane of its first slice, charged its total (B5)
    uint64_t done = 0;  // bytes of the slices read in full
    std::vector<Taken> taken;
    std::vector<std::pair<int, uint64_t>> slices;  // (lane, id) of those read
  };
  struct Lane {
    absl::flat_hash_map<uint64_t, Arrived> blobs;
    bool seen = false;       // a connection of the sender's incarnation came on it
    int live = 0;            // connections from the sender on this lane now
    absl::Time lost_since;   // when `live` last fell to 0 (B6)
    uint64_t floor = 0;      // below it, nothing more arrives (B6, B7)
    uint64_t next_id = 0;    // below it, a record is a resend (B8)
    uint64_t unclaimed = 0;  // charged for what it read and no frame claimed (B5)
  };
  Lane lanes[kMaxLanes];
  absl::flat_hash_map<uint64_t, std::shared_ptr<Stripe>> stripes;
  // Stripes whose frame failed (the latest kMaxFailed): their later slices
  // are dropped as read.
  std::deque<uint64_t> failed;
  uint64_t epoch = 1;    // counts the sender's incarnations (Import's wait_epoch)
  std::string identity;  // of the sender's incarnation that sent `blobs`
  std::vector<std::function<void()>> waiters;

  static constexpr size_t kMaxFailed = 256;

  // What a record or stripe of `bytes` costs the budget: at least a page,
  // so that tiny records cannot hold memory the budget does not see.
  static uint64_t ChargeOf(uint64_t bytes) { return std::max<uint64_t>(bytes, 4096); }

  // Forgets a stripe and every slice of it read so far; its charge (B5)
  // goes back to its lane's budget.
  void DropStripe(uint64_t id) {
    auto it = stripes.find(id);
    if (it == stripes.end()) return;
    for (const auto& [lane, slice] : it->second->slices) lanes[lane].blobs.erase(slice);
    lanes[it->second->lane].unclaimed -= ChargeOf(it->second->total);
    stripes.erase(it);
  }
  void Failed(uint64_t stripe) {
    DropStripe(stripe);
    if (std::find(failed.begin(), failed.end(), stripe) != failed.end()) return;
    failed.push_back(stripe);
    if (failed.size() > kMaxFailed) failed.pop_front();
  }
};

BulkChannel::BulkChannel(BulkChannelOptions options, Authenticator authenticate)
    : options_(std::move(options)),
      authenticate_(std::move(authenticate)),
      buffers_(std::make_shared<BufferPool>()) {}

absl::StatusOr<std::unique_ptr<BulkChannel>> BulkChannel::Start(BulkChannelOptions options,
                                                                Authenticator authenticate) {
  std::unique_ptr<BulkChannel> c(new BulkChannel(std::move(options), std::move(authenticate)));
  if (c->options_.tls.enabled()) {
    auto tls = tcp::TlsContext::Create(c->options_.tls);
    if (!tls.ok()) return tls.status();
    c->tls_ = *std::move(tls);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string host = c->options_.host;
  if (getaddrinfo(host.c_str(), "0", &hints, &res) != 0 || res == nullptr) {
    return absl::UnavailableError(absl::StrCat("bulk channel: cannot resolve '", host, "'"));
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok = fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 64) == 0;
  const int family = res->ai_family;
  freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("bulk channel: cannot listen on ", host, ": ", std::strerror(errno)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int port = family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  c->listen_fd_ = fd;
  c->address_ =
      family == AF_INET6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
  c->acceptor_ = std::thread([p = c.get()] { p->AcceptLoop(); });
  return c;
}

BulkChannel::~BulkChannel() { Close(); }

void BulkChannel::Close() {
  std::vector<std::thread> threads;
  std::vector<std::function<void()>> waiters;
  std::vector<std::deque<Outgoing::Item>> records;  // their memory goes after the lock
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [peer, lanes] : out_) {
      for (auto& out : lanes) {
        out->stop = true;
        if (out->fd >= 0) shutdown(out->fd, SHUT_RDWR);
        if (out->thread.joinable()) threads.push_back(std::move(out->thread));
        records.push_back(std::exchange(out->queue, {}));
        records.push_back(std::exchange(out->sent, {}));
      }
    }
    for (auto& in : in_) {
      if (in->fd >= 0) shutdown(in->fd, SHUT_RDWR);
      if (in->thread.joinable()) threads.push_back(std::move(in->thread));
    }
    for (auto& [peer, arr] : arrivals_) {
      for (auto& w : arr->waiters) waiters.push_back(std::move(w));
      arr->waiters.clear();
    }
  }
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  for (auto& t : threads) t.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
  for (auto& w : waiters) w();
}

void BulkChannel::AddPeer(int peer, const std::string& address, const std::string& identity) {
  std::vector<std::thread> old;
  std::vector<std::deque<Outgoing::Item>> records;  // their memory goes after the lock
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    auto& lanes = out_[peer];
    if (!lanes.empty() && lanes[0]->address == address && lanes[0]->identity == identity) return;
    for (auto& out : lanes) {
      out->stop = true;
      if (out->fd >= 0) shutdown(out->fd, SHUT_RDWR);
      records.push_back(std::exchange(out->queue, {}));
      records.push_back(std::exchange(out->sent, {}));
      if (out->thread.joinable()) old.push_back(std::move(out->thread));
    }
    lanes.clear();
    const int n = std::clamp(options_.lanes, 1, kMaxLanes);
    for (int lane = 0; lane < n; ++lane) {
      lanes.push_back(std::make_shared<Outgoing>());
      lanes.back()->lane = lane;
      lanes.back()->address = address;
      lanes.back()->identity = identity;
    }
  }
  for (auto& t : old) t.join();
}

bool BulkChannel::Wants(const Frame& frame) const {
  for (const Blob& b : frame.payload.blobs) {
    if (b.size() >= options_.min_bytes) return true;
  }
  return false;
}

void BulkChannel::Export(int peer, Frame& frame) {
  if (!Wants(frame)) return;
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  auto it = out_.find(peer);
  if (it == out_.end()) return;
  std::vector<Outgoing*> ready;
  for (const std::shared_ptr<Outgoing>& out : it->second) {
    if (out->state == Outgoing::State::kReady) {
      ready.push_back(out.get());
      continue;
    }
    const bool start = out->state == Outgoing::State::kIdle ||
                       (out->state == Outgoing::State::kBroken && absl::Now() >= out->retry_at);
    if (start) {
      // The last writer has set kBroken and takes no lock again: the join
      // is short.
      if (out->thread.joinable()) out->thread.join();
      out->state = Outgoing::State::kConnecting;
      out->thread = std::thread([this, out] { WriteLoop(out); });
    }
  }
  if (ready.empty()) return;
  Outgoing& first = *it->second[0];
  auto add = [&](Outgoing& out, size_t index, Blob blob, uint64_t stripe, uint64_t offset,
                 uint64_t total) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    proto::TcpBlob* entry = frame.header.add_tcp_blobs();
    entry->set_index(static_cast<uint32_t>(index));
    entry->set_id(out.next_id);
    entry->set_size(blob.size());
    entry->set_lane(static_cast<uint32_t>(out.lane));
    entry->set_offset(offset);
    entry->set_stripe(stripe);
    out.queue.push_back({out.next_id++, std::move(blob), stripe, offset, total});
  };
  for (size_t i = 0; i < frame.payload.blobs.size(); ++i) {
    Blob& blob = frame.payload.blobs[i];
    const size_t size = blob.size();
    // Over max_blob_bytes: the receiver would refuse the record (B5).
    if (size < options_.min_bytes || size > options_.max_blob_bytes) continue;
    if (ready.size() > 1 && size >= options_.stripe_min_bytes) {  // B10
      const uint64_t stripe = first.next_stripe++;
      const size_t per_lane = (size + ready.size() - 1) / ready.size();
      const size_t slice =
          std::max<size_t>(1, (per_lane + kStripeAlign - 1) / kStripeAlign) * kStripeAlign;
      for (size_t k = 0, offset = 0; offset < size; ++k, offset += slice) {
        add(*ready[k], i, SliceOf(blob, offset, std::min(slice, size - offset)), stripe, offset,
            size);
      }
    } else {
      Outgoing* least = *std::min_element(ready.begin(), ready.end(), [](auto* a, auto* b) {
        return a->queue.size() + a->sent.size() < b->queue.size() + b->sent.size();
      });
      add(*least, i, std::move(blob), 0, 0, size);
    }
    blob.pieces.clear();  // the frame carries it empty (B3)
    blob.owner.reset();
  }
}

void BulkChannel::WriteLoop(std::shared_ptr<Outgoing> out) {
  tcp::BlockSigpipeOnThisThread();  // TLS writes (connection.h)
  // B8: after a connection that was up broke, connections follow every
  // retry_after while records wait, until this time.
  absl::Time resume_until = absl::InfinitePast();
  for (;;) {
    const ConnectionEnd end = RunConnection(out);
    std::deque<Outgoing::Item> given_up;  // its memory goes after the lock
    absl::MutexLock lock(&mu_);
    if (end == ConnectionEnd::kStopped || out->stop || closed_) return;
    // What was not acknowledged goes first on the next connection.
    while (!out->sent.empty()) {
      out->queue.push_front(std::move(out->sent.back()));
      out->sent.pop_back();
    }
    const absl::Time now = absl::Now();
    // The window starts at the first break and again after each connection
    // that got a record through: one the receiver always refuses does not
    // keep the sender trying.
    if (end == ConnectionEnd::kBroke && (out->progressed || resume_until == absl::InfinitePast())) {
      resume_until = now + options_.silence_timeout / 2;
    }
    if (out->queue.empty() || now >= resume_until) {
      // Nothing to resume, or given up: the next connection (on the next
      // export) names the next new id, and the peer's waits below it end.
      given_up.swap(out->queue);
      out->state = Outgoing::State::kBroken;
      out->retry_at = now + options_.retry_after;
      return;
    }
    auto stopping = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return out->stop || closed_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.retry_after);
    if (out->stop || closed_) return;
  }
}

BulkChannel::ConnectionEnd BulkChannel::RunConnection(const std::shared_ptr<Outgoing>& out) {
  std::string address, identity;
  {
    absl::MutexLock lock(&mu_);
    out->state = Outgoing::State::kConnecting;
    address = out->address;
    identity = out->identity;
  }
  // The connect, and the TLS handshake after it, each within this.
  const absl::Duration handshake = std::min(options_.handshake_timeout, absl::Seconds(2));
  const int fd = Connect(address, handshake);
  if (fd < 0) return ConnectionEnd::kNotReady;
  NoDelay(fd);
  Tolerate(fd, options_.silence_timeout);
  uint64_t first_id;
  {
    absl::MutexLock lock(&mu_);  // from here Close() can interrupt the hello
    if (out->stop || closed_) {
      close(fd);
      return ConnectionEnd::kStopped;
    }
    out->fd = fd;
    out->ended = false;
    out->progressed = false;
    first_id = out->queue.empty() ? out->next_id : out->queue.front().id;
  }
  std::unique_ptr<tcp::Connection> conn;
  auto end = [&](ConnectionEnd how) {
    {
      absl::MutexLock lock(&mu_);
      out->fd = -1;
    }
    conn.reset();
    close(fd);
    return how;
  };
  if (tls_ == nullptr) {
    conn = tcp::PlainConnection(fd);
  } else {  // B9
    auto secured = tcp::TlsClientConnection(fd, tls_, address, handshake);
    if (!secured.ok()) {
      bool say;
      {
        absl::MutexLock lock(&mu_);
        say = !out->handshake_failing;
        out->handshake_failing = true;
      }
      if (say) {
        options_.log.Warning(absl::StrCat("TLS to ", address, ": ", secured.status().message(),
                                          "; large tensors to it stay on the stream"));
      }
      return end(ConnectionEnd::kNotReady);
    }
    conn = *std::move(secured);
    conn->SetTimeout(handshake);
  }
  Hello hello{kMagic,
              kVersion,
              static_cast<uint32_t>(options_.job_token.size()),
              static_cast<uint32_t>(identity.size()),
              first_id,
              static_cast<uint32_t>(out->lane),
              0};
  char ack = 0;
  if (!conn->WriteAll({{&hello, sizeof hello},
                       {const_cast<char*>(options_.job_token.data()), options_.job_token.size()},
                       {identity.data(), identity.size()}}) ||
      !conn->ReadAll(&ack, 1) || ack != 1) {
    return end(ConnectionEnd::kNotReady);
  }
  conn->SetTimeout(absl::ZeroDuration());
  {
    absl::MutexLock lock(&mu_);
    if (out->stop || closed_) return end(ConnectionEnd::kStopped);
    out->state = Outgoing::State::kReady;
    out->handshake_failing = false;
  }
  std::thread acknowledgements([this, out, c = conn.get()] {
    tcp::BlockSigpipeOnThisThread();
    ReadAcknowledgements(out, c);
  });
  ConnectionEnd how = ConnectionEnd::kBroke;
  for (;;) {
    RecordHeader h{};
    Blob blob;  // shares the record's memory while it is written
    {
      absl::MutexLock lock(&mu_);
      auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return out->stop || closed_ || out->ended || !out->queue.empty();
      };
      mu_.Await(absl::Condition(&work));
      if (out->stop || closed_) {
        how = ConnectionEnd::kStopped;
        break;
      }
      if (out->ended) break;
      const Outgoing::Item& item = out->queue.front();
      blob = item.blob;
      h = {item.id, blob.size(), item.stripe, item.offset, item.total};
      out->sent.push_back(std::move(out->queue.front()));
      out->queue.pop_front();
    }
    std::vector<iovec> iov{{&h, sizeof h}};
    for (const auto& piece : blob.pieces) {
      if (!piece.empty()) iov.push_back({const_cast<char*>(piece.data()), piece.size()});
    }
    if (!conn->WriteAll(std::move(iov))) break;
    absl::MutexLock lock(&mu_);
    ++stats_.blobs_sent;
    stats_.bytes_sent += h.size;
  }
  {
    absl::MutexLock lock(&mu_);
    if (out->state == Outgoing::State::kReady) out->state = Outgoing::State::kConnecting;
  }
  shutdown(fd, SHUT_RDWR);
  acknowledgements.join();
  return end(how);
}

void BulkChannel::ReadAcknowledgements(const std::shared_ptr<Outgoing>& out,
                                       tcp::Connection* conn) {
  uint64_t id;
  while (conn->ReadAll(&id, sizeof id)) {
    std::vector<Outgoing::Item> done;  // their memory is released outside the lock
    absl::MutexLock lock(&mu_);
    while (!out->sent.empty() && out->sent.front().id <= id) {
      done.push_back(std::move(out->sent.front()));
      out->sent.pop_front();
      out->progressed = true;
    }
  }
  absl::MutexLock lock(&mu_);
  out->ended = true;
}

void BulkChannel::AcceptLoop() {
  // Every half second, the waits for senders that did not resume end (B6).
  absl::Time next_check = absl::Now();
  for (;;) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int ready = poll(&p, 1, 500);
    const int poll_errno = errno;  // before the callbacks below
    if (absl::Now() >= next_check) {
      WakeAbandoned();
      next_check = absl::Now() + absl::Milliseconds(500);
    }
    if (ready == 0 || (ready < 0 && poll_errno == EINTR)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: try again once some were released.
        mu_.AwaitWithTimeout(absl::Condition(&closed_), absl::Milliseconds(100));
        continue;
      }
      return;
    }
    auto in = std::make_shared<Incoming>();
    in->fd = fd;
    absl::MutexLock lock(&mu_);
    if (closed_ || handshaking_ >= kMaxHandshakes) {
      close(fd);
      if (closed_) return;
      continue;
    }
    // Readers that ended are joined here (they no longer take the lock).
    for (auto it = in_.begin(); it != in_.end();) {
      if ((*it)->done) {
        if ((*it)->thread.joinable()) (*it)->thread.join();
        it = in_.erase(it);
      } else {
        ++it;
      }
    }
    ++handshaking_;
    in->thread = std::thread([this, in] { ReadLoop(in); });
    in_.push_back(in);
  }
}

void BulkChannel::ReadLoop(std::shared_ptr<Incoming> in) {
  tcp::BlockSigpipeOnThisThread();  // TLS writes (connection.h)
  const int fd = in->fd;
  SetTimeout(fd, options_.handshake_timeout);
  std::unique_ptr<tcp::Connection> conn;
  if (tls_ == nullptr) {
    conn = tcp::PlainConnection(fd);
  } else {  // B9
    auto secured = tcp::TlsServerConnection(fd, tls_, options_.handshake_timeout);
    if (secured.ok()) {
      conn = *std::move(secured);
      conn->SetTimeout(options_.handshake_timeout);
    }
  }
  Hello hello{};
  std::string token, identity;
  bool ok = conn != nullptr && conn->ReadAll(&hello, sizeof hello) && hello.magic == kMagic &&
            hello.version == kVersion && hello.token_len <= kMaxHelloField &&
            hello.identity_len <= kMaxHelloField &&
            hello.lane < static_cast<uint32_t>(std::clamp(options_.lanes, 1, kMaxLanes));
  if (ok) {
    token.resize(hello.token_len);
    identity.resize(hello.identity_len);
    ok = conn->ReadAll(token.data(), token.size()) &&
         conn->ReadAll(identity.data(), identity.size()) && SameBytes(token, options_.job_token);
  }
  absl::StatusOr<int> peer = ok ? authenticate_(identity) : absl::UnauthenticatedError("hello");
  const int lane_index = static_cast<int>(hello.lane);
  std::shared_ptr<Arrivals> arr;
  std::vector<std::function<void()>> wake;  // waits the new floor ends
  {
    absl::MutexLock lock(&mu_);
    --handshaking_;
    if (closed_ || !peer.ok() || *peer < 0) {
      ++stats_.connections_refused;
      conn.reset();
      shutdown(fd, SHUT_RDWR);
      close(fd);
      in->fd = -1;
      in->done = true;
      return;
    }
    auto& slot = arrivals_[*peer];
    if (slot == nullptr) slot = std::make_shared<Arrivals>();
    arr = slot;
    const bool restarted = arr->identity != identity;
    if (restarted) {  // B6: a new incarnation of the sender
      for (Arrivals::Lane& lane : arr->lanes) {
        lane.blobs.clear();
        lane.floor = 0;
        lane.next_id = 0;
        lane.unclaimed = 0;
        lane.seen = false;
      }
      arr->stripes.clear();
      arr->failed.clear();
      arr->identity = identity;
      ++arr->epoch;  // the waits begun before fail (Import)
      wake.swap(arr->waiters);
    }
    // B7: the sender left its earlier connections of this lane (they broke,
    // or it was told another address): what they still carry and it did
    // not resend (B8) is lost with them, and the ids below first_id that
    // have not arrived will not. A new incarnation ends the old one's
    // connections on every lane (B6): nothing they still bring is kept.
    for (const auto& other : in_) {
      if (other != in && other->peer == *peer && (other->lane == lane_index || restarted) &&
          !other->done && other->fd >= 0) {
        other->superseded = true;  // reads nothing more (it may be in a budget wait)
        shutdown(other->fd, SHUT_RDWR);
      }
    }
    Arrivals::Lane& lane = arr->lanes[lane_index];
    if (hello.first_id > lane.floor) {
      lane.floor = hello.first_id;
      for (auto& w : arr->waiters) wake.push_back(std::move(w));
      arr->waiters.clear();
    }
    ++lane.live;
    lane.seen = true;
    in->peer = *peer;
    in->lane = lane_index;
  }
  for (auto& w : wake) w();  // they take the lock (Import)
  conn->SetTimeout(absl::ZeroDuration());
  NoDelay(fd);
  Tolerate(fd, options_.silence_timeout);
  const char ack = 1;
  bool reading = conn->WriteAll({{const_cast<char*>(&ack), 1}});
  Arrivals::Lane& lane = arr->lanes[lane_index];  // guarded by mu_
  while (reading) {
    RecordHeader h{};
    if (!conn->ReadAll(&h, sizeof h) || h.size > options_.max_blob_bytes ||
        h.total > options_.max_blob_bytes || h.size > h.total || h.offset > h.total - h.size ||
        (h.stripe == 0 && (h.offset != 0 || h.total != h.size)) || (h.stripe != 0 && h.size == 0)) {
      break;
    }
    // B8: an id already passed is a resend of a record read before; B6:
    // one below the floor belongs to frames that failed. Decided again
    // after each wait: another connection may have brought it meanwhile.
    auto fresh = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return h.id >= lane.next_id && h.id >= lane.floor;
    };
    bool keep;
    std::shared_ptr<Arrivals::Stripe> stripe;  // B10: the slice's
    std::shared_ptr<char> data;
    {
      absl::MutexLock lock(&mu_);
      auto find_stripe = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Arrivals::Stripe* {
        auto it = arr->stripes.find(h.stripe);
        return h.stripe == 0 || it == arr->stripes.end() ? nullptr : it->second.get();
      };
      // B5: wait while what this lane read and no frame claimed is over the
      // budget. A whole record is charged its size, a stripe its total once,
      // when its first slice comes (its other slices wait for nothing). A
      // lane holding nothing unclaimed always reads one more: each lane
      // delivers in frame order, so the oldest frame's records are never
      // held back behind later ones. B10: a slice also waits while a part
      // of its stripe it overlaps is still being read by a connection of
      // its lane that the sender left (the slice is a resend of that part).
      auto dropped = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !fresh() || (h.stripe != 0 && std::find(arr->failed.begin(), arr->failed.end(),
                                                       h.stripe) != arr->failed.end());
      };
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (closed_ || in->superseded || dropped()) return true;
        if (const Arrivals::Stripe* s = find_stripe(); s != nullptr) {
          return std::none_of(s->taken.begin(), s->taken.end(), [&](const auto& t) {
            return t.owner != nullptr && t.owner->superseded && h.offset < t.end &&
                   t.begin < h.offset + h.size;
          });
        }
        return lane.unclaimed == 0 ||
               lane.unclaimed + Arrivals::ChargeOf(h.stripe != 0 ? h.total : h.size) <=
                   options_.unclaimed_budget;
      };
      mu_.Await(absl::Condition(&room));
      if (closed_ || in->superseded) break;
      keep = !dropped();
      if (keep && h.stripe != 0) {
        auto& slot = arr->stripes[h.stripe];
        if (slot == nullptr) {
          slot = std::make_shared<Arrivals::Stripe>();
          slot->total = h.total;
          slot->lane = lane_index;
          slot->data = buffers_->Allocate(h.total);
          if (slot->data == nullptr) {
            arr->stripes.erase(h.stripe);
            break;
          }
          lane.unclaimed += Arrivals::ChargeOf(h.total);
        }
        stripe = slot;
        const uint64_t begin = h.offset, end = h.offset + h.size;
        // A slice that overlaps another, names another total, comes after
        // its stripe was complete or makes it more slices than lanes breaks
        // the protocol (B10).
        const bool overlaps =
            std::any_of(stripe->taken.begin(), stripe->taken.end(),
                        [&](const auto& t) { return begin < t.end && t.begin < end; });
        if (stripe->total != h.total || stripe->done == stripe->total || overlaps ||
            stripe->taken.size() >= static_cast<size_t>(kMaxLanes)) {
          break;
        }
        stripe->taken.push_back({begin, end, in.get()});
        data = stripe->data;
      }
    }
    if (!keep) {
      if (!conn->Discard(h.size)) break;
    } else {
      if (stripe == nullptr) data = buffers_->Allocate(h.size);
      const bool read = data != nullptr && conn->ReadAll(data.get() + h.offset, h.size);
      std::vector<std::function<void()>> wake;
      {
        absl::MutexLock lock(&mu_);
        auto it = stripe == nullptr ? arr->stripes.end() : arr->stripes.find(h.stripe);
        const bool current =
            stripe == nullptr || (it != arr->stripes.end() && it->second == stripe);
        const bool stored =
            read && !in->superseded && fresh() && current &&
            lane.blobs.emplace(h.id, Arrivals::Arrived{data, h.size, h.stripe, h.offset, h.total})
                .second;
        if (stripe != nullptr && current) {
          auto taken = std::find_if(stripe->taken.begin(), stripe->taken.end(),
                                    [&](const auto& t) { return t.owner == in.get(); });
          if (stored) {
            taken->owner = nullptr;  // read
            stripe->done += h.size;
            stripe->slices.emplace_back(lane_index, h.id);
          } else {
            // Not kept: its part may come again (B8); a stripe left with
            // nothing read or being read goes, with its charge.
            stripe->taken.erase(taken);
            if (stripe->taken.empty()) arr->DropStripe(h.stripe);
          }
        }
        if (!read || in->superseded) break;
        if (stored) {
          lane.next_id = After(h.id);
          if (stripe == nullptr) lane.unclaimed += Arrivals::ChargeOf(h.size);
          ++stats_.blobs_received;
          stats_.bytes_received += h.size;
          wake.swap(arr->waiters);
        }
      }
      for (auto& w : wake) w();
    }
    // B8: acknowledged once read (kept or dropped).
    if (!conn->WriteAll({{&h.id, sizeof h.id}})) break;
  }
  conn.reset();  // before Ended closes the socket
  Ended(in);
}

void BulkChannel::Ended(const std::shared_ptr<Incoming>& in) {
  // The waits on the sender go on (B6, B8): it resumes, or they are
  // abandoned (WakeAbandoned).
  absl::MutexLock lock(&mu_);
  auto it = arrivals_.find(in->peer);
  if (it != arrivals_.end()) {
    Arrivals::Lane& lane = it->second->lanes[in->lane];
    if (--lane.live == 0) lane.lost_since = absl::Now();
  }
  shutdown(in->fd, SHUT_RDWR);
  close(in->fd);
  in->fd = -1;
  // Last: AcceptLoop joins a done reader while holding the lock.
  in->done = true;
}

bool BulkChannel::Abandoned(const Arrivals& arr, int lane) const {
  const Arrivals::Lane& l = arr.lanes[lane];
  return l.seen && l.live == 0 && absl::Now() >= l.lost_since + options_.silence_timeout;
}

void BulkChannel::WakeAbandoned() {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [peer, arr] : arrivals_) {
      bool abandoned = false;
      for (int lane = 0; lane < kMaxLanes && !abandoned; ++lane) abandoned = Abandoned(*arr, lane);
      if (arr->waiters.empty() || !abandoned) continue;
      for (auto& w : arr->waiters) wake.push_back(std::move(w));
      arr->waiters.clear();
    }
  }
  for (auto& w : wake) w();  // they take the lock (Import)
}

absl::StatusOr<bool> BulkChannel::Import(int peer, Frame& frame, std::function<void()> ready,
                                         uint64_t* wait_epoch) {
  const auto& entries = frame.header.tcp_blobs();
  if (entries.empty()) return true;
  // Each blob's entries by offset: one whole record, or the slices of a
  // stripe (B10) covering it exactly once.
  std::vector<std::vector<const proto::TcpBlob*>> parts(frame.payload.blobs.size());
  absl::flat_hash_set<std::pair<uint32_t, uint64_t>> ids;
  auto bad = [&](const proto::TcpBlob& e, absl::string_view why) {
    return absl::DataLossError(absl::StrCat("bad bulk-channel entry (blob ", e.index(), " of ",
                                            frame.payload.blobs.size(), ", lane ", e.lane(),
                                            ", id ", e.id(), ", ", e.size(), " bytes at ",
                                            e.offset(), ") from worker ", peer, ": ", why));
  };
  for (const proto::TcpBlob& e : entries) {
    if (e.index() >= frame.payload.blobs.size() || frame.payload.blobs[e.index()].size() != 0) {
      return bad(e, "no such blob, or it did not travel empty");
    }
    if (e.lane() >= kMaxLanes || !ids.insert({e.lane(), e.id()}).second) {
      return bad(e, "no such lane, or its id named twice");
    }
    if (e.size() > options_.max_blob_bytes || e.offset() > options_.max_blob_bytes ||
        parts[e.index()].size() >= kMaxLanes) {
      return bad(e, "too large, or in too many slices");
    }
    parts[e.index()].push_back(&e);
  }
  std::vector<uint64_t> totals(parts.size(), 0);
  for (size_t i = 0; i < parts.size(); ++i) {
    std::sort(parts[i].begin(), parts[i].end(),
              [](const auto* a, const auto* b) { return a->offset() < b->offset(); });
    for (const proto::TcpBlob* e : parts[i]) {
      if (e->offset() != totals[i] || (e->size() == 0 && parts[i].size() > 1) ||
          e->stripe() != parts[i][0]->stripe() || (e->stripe() == 0) != (parts[i].size() == 1)) {
        return bad(*e, "slices that do not cover the blob once, or of different stripes");
      }
      totals[i] += e->size();
    }
    if (totals[i] > options_.max_blob_bytes) return bad(*parts[i][0], "too large");
  }
  absl::MutexLock lock(&mu_);
  auto it = arrivals_.find(peer);
  std::shared_ptr<Arrivals> arr = it == arrivals_.end() ? nullptr : it->second;
  if (closed_ || arr == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("no bulk connection from worker ", peer, " brings blob id ", entries[0].id()));
  }
  // A frame that cannot complete leaves nothing behind: what of it arrived
  // is released (it no longer counts against the budget, B5), stripes with
  // all of their slices.
  auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const proto::TcpBlob& e : entries) {
      // A stripe goes with its slices, and those still to come are dropped.
      if (e.stripe() != 0) arr->Failed(e.stripe());
      auto& blobs = arr->lanes[e.lane()].blobs;
      auto node = blobs.find(e.id());
      if (node == blobs.end()) continue;
      if (node->second.stripe != 0) {
        arr->Failed(node->second.stripe);
      } else {
        arr->lanes[e.lane()].unclaimed -= Arrivals::ChargeOf(node->second.size);
        blobs.erase(node);
      }
    }
    return s;
  };
  if (wait_epoch != nullptr) {
    if (*wait_epoch == 0) *wait_epoch = arr->epoch;
    if (*wait_epoch != arr->epoch) {
      // What its ids name now is the new incarnation's: left alone.
      return absl::UnavailableError(absl::StrCat(
          "worker ", peer, " restarted before the frame's bulk blobs arrived (blob id ",
          entries[0].id(), ")"));
    }
  }
  for (const proto::TcpBlob& e : entries) {
    Arrivals::Lane& lane = arr->lanes[e.lane()];
    if (lane.blobs.contains(e.id())) continue;
    if (!lane.seen) {  // the sender names only lanes it has connected (B10)
      return fail(
          absl::UnavailableError(absl::StrCat("no bulk connection from worker ", peer, " on lane ",
                                              e.lane(), " brings blob id ", e.id())));
    }
    if (e.id() < lane.floor) {
      return fail(absl::UnavailableError(
          absl::StrCat("worker ", peer, " gave up blob id ", e.id(), " on the bulk channel")));
    }
    if (Abandoned(*arr, static_cast<int>(e.lane()))) {
      // B6: what these frames wanted is dropped if it comes after all.
      for (const proto::TcpBlob& f : entries) {
        Arrivals::Lane& l = arr->lanes[f.lane()];
        l.floor = std::max(l.floor, After(f.id()));
      }
      return fail(absl::UnavailableError(
          absl::StrCat("the bulk connection from worker ", peer, " ended before blob id ", e.id(),
                       " arrived, and it did not resume within ",
                       absl::FormatDuration(options_.silence_timeout))));
    }
    if (e.id() < lane.next_id) {
      return fail(absl::DataLossError(absl::StrCat("bulk blob id ", e.id(), " from worker ", peer,
                                                   " was claimed by another frame")));
    }
    arr->waiters.push_back(std::move(ready));
    return false;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) continue;
    const Arrivals::Arrived& head = arr->lanes[parts[i][0]->lane()].blobs.at(parts[i][0]->id());
    for (const proto::TcpBlob* e : parts[i]) {
      const Arrivals::Arrived& got = arr->lanes[e->lane()].blobs.at(e->id());
      // One whole record, or every slice of one stripe (B10).
      const bool fits = got.size == e->size() && got.offset == e->offset() &&
                        got.total == totals[i] && got.stripe == e->stripe();
      if (!fits) {
        return fail(absl::DataLossError(absl::StrCat(
            "bulk blob id ", e->id(), " (lane ", e->lane(), ") from worker ", peer, " has ",
            got.size, " bytes at ", got.offset, " of ", got.total, " (stripe ", got.stripe,
            "); its frame says ", e->size(), " at ", e->offset(), " of ", totals[i])));
      }
    }
    if (head.stripe != 0) {
      const Arrivals::Stripe& stripe = *arr->stripes.at(head.stripe);
      if (stripe.slices.size() != parts[i].size()) {
        return fail(absl::DataLossError(
            absl::StrCat("bulk stripe ", head.stripe, " from worker ", peer, " has ",
                         stripe.slices.size(), " slices; its frame names ", parts[i].size())));
      }
    }
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) continue;
    auto& head_lane = arr->lanes[parts[i][0]->lane()].blobs;
    const Arrivals::Arrived head = head_lane.at(parts[i][0]->id());
    if (head.stripe != 0) {
      arr->DropStripe(head.stripe);  // its slices, and its charge
    } else {
      head_lane.erase(parts[i][0]->id());
      arr->lanes[parts[i][0]->lane()].unclaimed -= Arrivals::ChargeOf(head.size);
    }
    Blob& blob = frame.payload.blobs[i];
    blob.pieces.clear();
    blob.pieces.emplace_back(head.data.get(), head.total);
    blob.owner = head.data;
  }
  return true;
}

bool BulkChannel::Connected(int peer, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto it = out_.find(peer);
  if (it == out_.end()) return false;
  const std::vector<std::shared_ptr<Outgoing>> lanes = it->second;
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || std::none_of(lanes.begin(), lanes.end(), [](const auto& out) {
             return out->state == Outgoing::State::kConnecting;
           });
  };
  mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
  return !closed_ && std::any_of(lanes.begin(), lanes.end(), [](const auto& out) {
    return out->state == Outgoing::State::kReady;
  });
}

void BulkChannel::DropConnectionsForTesting() {
  absl::MutexLock lock(&mu_);
  for (auto& [peer, lanes] : out_) {
    for (auto& out : lanes) {
      if (out->fd >= 0) shutdown(out->fd, SHUT_RDWR);
    }
  }
  for (auto& in : in_) {
    if (in->fd >= 0) shutdown(in->fd, SHUT_RDWR);
  }
}

BulkChannel::Stats BulkChannel::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace baton::rpc::internal
