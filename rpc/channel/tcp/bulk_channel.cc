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
constexpr uint32_t kVersion = 2;         // 2: acknowledgements (B8)
constexpr uint32_t kMaxHelloField = 4096;
constexpr int kMaxHandshakes = 64;  // unauthenticated connections at once
constexpr size_t kAlign = 64;

struct Hello {
  uint32_t magic, version, token_len, identity_len;
  uint64_t first_id;  // the connection's first record id; none below it follows (B7, B8)
};
struct RecordHeader {
  uint64_t id, size;
};

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
  };
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
  std::deque<Item> queue;
  std::deque<Item> sent;  // written, not acknowledged yet (B8)
  std::thread thread;
};

struct BulkChannel::Incoming {
  int fd = -1;
  int peer = -1;
  bool done = false;
  bool superseded = false;  // a newer connection from its sender came (B7)
  std::thread thread;
};

struct BulkChannel::Arrivals {
  struct Arrived {
    std::shared_ptr<char> data;
    uint64_t size = 0;
  };
  absl::flat_hash_map<uint64_t, Arrived> blobs;
  uint64_t unclaimed = 0;
  int live = 0;           // connections from the sender now
  absl::Time lost_since;  // when `live` last fell to 0 (B6)
  uint64_t floor = 0;     // below it, nothing more arrives (B6, B7)
  uint64_t next_id = 0;   // below it, a record is a resend (B8)
  uint64_t epoch = 1;     // counts the sender's incarnations (Import's wait_epoch)
  std::string identity;   // of the sender's incarnation that sent `blobs`
  std::vector<std::function<void()>> waiters;
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
    for (auto& [peer, out] : out_) {
      out->stop = true;
      if (out->fd >= 0) shutdown(out->fd, SHUT_RDWR);
      if (out->thread.joinable()) threads.push_back(std::move(out->thread));
      records.push_back(std::exchange(out->queue, {}));
      records.push_back(std::exchange(out->sent, {}));
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
  std::thread old;
  std::deque<Outgoing::Item> queued, sent;  // their memory goes after the lock
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    auto& slot = out_[peer];
    if (slot != nullptr && slot->address == address && slot->identity == identity) return;
    if (slot != nullptr) {
      slot->stop = true;
      if (slot->fd >= 0) shutdown(slot->fd, SHUT_RDWR);
      queued.swap(slot->queue);
      sent.swap(slot->sent);
      old = std::move(slot->thread);
    }
    slot = std::make_shared<Outgoing>();
    slot->address = address;
    slot->identity = identity;
  }
  if (old.joinable()) old.join();
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
  std::shared_ptr<Outgoing> out = it->second;
  if (out->state != Outgoing::State::kReady) {
    const bool start = out->state == Outgoing::State::kIdle ||
                       (out->state == Outgoing::State::kBroken && absl::Now() >= out->retry_at);
    if (start) {
      // The last writer has set kBroken and takes no lock again: the join
      // is short.
      if (out->thread.joinable()) out->thread.join();
      out->state = Outgoing::State::kConnecting;
      out->thread = std::thread([this, out] { WriteLoop(out); });
    }
    return;
  }
  for (size_t i = 0; i < frame.payload.blobs.size(); ++i) {
    Blob& blob = frame.payload.blobs[i];
    const size_t size = blob.size();
    // Over max_blob_bytes: the receiver would refuse the record (B5).
    if (size < options_.min_bytes || size > options_.max_blob_bytes) continue;
    proto::TcpBlob* entry = frame.header.add_tcp_blobs();
    entry->set_index(static_cast<uint32_t>(i));
    entry->set_id(out->next_id);
    entry->set_size(size);
    out->queue.push_back({out->next_id++, std::move(blob)});
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
  Hello hello{kMagic, kVersion, static_cast<uint32_t>(options_.job_token.size()),
              static_cast<uint32_t>(identity.size()), first_id};
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
    uint64_t id;
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
      id = out->queue.front().id;
      blob = out->queue.front().blob;
      out->sent.push_back(std::move(out->queue.front()));
      out->queue.pop_front();
    }
    RecordHeader h{id, blob.size()};
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
            hello.identity_len <= kMaxHelloField;
  if (ok) {
    token.resize(hello.token_len);
    identity.resize(hello.identity_len);
    ok = conn->ReadAll(token.data(), token.size()) &&
         conn->ReadAll(identity.data(), identity.size()) && SameBytes(token, options_.job_token);
  }
  absl::StatusOr<int> peer = ok ? authenticate_(identity) : absl::UnauthenticatedError("hello");
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
    if (arr->identity != identity) {  // B6: a new incarnation of the sender
      arr->blobs.clear();
      arr->unclaimed = 0;
      arr->floor = 0;
      arr->next_id = 0;
      arr->identity = identity;
      ++arr->epoch;  // the waits begun before fail (Import)
      wake.swap(arr->waiters);
    }
    // B7: the sender left its earlier connections (they broke, or it was
    // told another address): what they still carry and it did not resend
    // (B8) is lost with them, and the ids below first_id that have not
    // arrived will not.
    for (const auto& other : in_) {
      if (other != in && other->peer == *peer && !other->done && other->fd >= 0) {
        other->superseded = true;  // reads nothing more (it may be in a budget wait)
        shutdown(other->fd, SHUT_RDWR);
      }
    }
    if (hello.first_id > arr->floor) {
      arr->floor = hello.first_id;
      for (auto& w : arr->waiters) wake.push_back(std::move(w));
      arr->waiters.clear();
    }
    ++arr->live;
    in->peer = *peer;
  }
  for (auto& w : wake) w();  // they take the lock (Import)
  conn->SetTimeout(absl::ZeroDuration());
  NoDelay(fd);
  Tolerate(fd, options_.silence_timeout);
  const char ack = 1;
  bool reading = conn->WriteAll({{const_cast<char*>(&ack), 1}});
  while (reading) {
    RecordHeader h{};
    if (!conn->ReadAll(&h, sizeof h) || h.size > options_.max_blob_bytes) break;
    // B8: an id already passed is a resend of a record read before; B6:
    // one below the floor belongs to frames that failed. Decided again
    // after each wait: another connection may have brought it meanwhile.
    auto fresh = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return h.id >= arr->next_id && h.id >= arr->floor;
    };
    bool keep;
    {
      absl::MutexLock lock(&mu_);
      // B5: wait while what was read and not claimed is over the budget.
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || in->superseded || !fresh() || arr->unclaimed == 0 ||
               arr->unclaimed + h.size <= options_.unclaimed_budget;
      };
      mu_.Await(absl::Condition(&room));
      if (closed_ || in->superseded) break;
      keep = fresh();
    }
    if (!keep) {
      if (!conn->Discard(h.size)) break;
    } else {
      std::shared_ptr<char> data = buffers_->Allocate(h.size);
      if (data == nullptr || !conn->ReadAll(data.get(), h.size)) break;
      std::vector<std::function<void()>> wake;
      {
        absl::MutexLock lock(&mu_);
        if (in->superseded) break;
        if (fresh()) {
          if (!arr->blobs.emplace(h.id, Arrivals::Arrived{std::move(data), h.size}).second) break;
          arr->next_id = After(h.id);
          arr->unclaimed += h.size;
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
  if (it != arrivals_.end() && --it->second->live == 0) it->second->lost_since = absl::Now();
  shutdown(in->fd, SHUT_RDWR);
  close(in->fd);
  in->fd = -1;
  // Last: AcceptLoop joins a done reader while holding the lock.
  in->done = true;
}

bool BulkChannel::Abandoned(const Arrivals& arr) const {
  return arr.live == 0 && absl::Now() >= arr.lost_since + options_.silence_timeout;
}

void BulkChannel::WakeAbandoned() {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [peer, arr] : arrivals_) {
      if (arr->waiters.empty() || !Abandoned(*arr)) continue;
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
  std::vector<bool> named(frame.payload.blobs.size(), false);
  absl::flat_hash_set<uint64_t> ids;
  for (const proto::TcpBlob& e : entries) {
    if (e.index() >= frame.payload.blobs.size() || named[e.index()] || !ids.insert(e.id()).second ||
        frame.payload.blobs[e.index()].size() != 0 || e.size() > options_.max_blob_bytes) {
      return absl::DataLossError(absl::StrCat("bad bulk-channel entry (blob ", e.index(), " of ",
                                              frame.payload.blobs.size(), ", id ", e.id(), ", ",
                                              e.size(), " bytes) from worker ", peer));
    }
    named[e.index()] = true;
  }
  absl::MutexLock lock(&mu_);
  auto it = arrivals_.find(peer);
  std::shared_ptr<Arrivals> arr = it == arrivals_.end() ? nullptr : it->second;
  if (closed_ || arr == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("no bulk connection from worker ", peer, " brings blob id ", entries[0].id()));
  }
  // A frame that cannot complete leaves nothing behind: what of it arrived
  // is released (it no longer counts against the budget, B5).
  auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const proto::TcpBlob& e : entries) {
      auto node = arr->blobs.extract(e.id());
      if (!node.empty()) arr->unclaimed -= node.mapped().size;
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
    if (arr->blobs.contains(e.id())) continue;
    if (e.id() < arr->floor) {
      return fail(absl::UnavailableError(
          absl::StrCat("worker ", peer, " gave up blob id ", e.id(), " on the bulk channel")));
    }
    if (Abandoned(*arr)) {
      // B6: what these frames wanted is dropped if it comes after all.
      for (const proto::TcpBlob& f : entries) arr->floor = std::max(arr->floor, After(f.id()));
      return fail(absl::UnavailableError(
          absl::StrCat("the bulk connection from worker ", peer, " ended before blob id ", e.id(),
                       " arrived, and it did not resume within ",
                       absl::FormatDuration(options_.silence_timeout))));
    }
    if (e.id() < arr->next_id) {
      return fail(absl::DataLossError(absl::StrCat("bulk blob id ", e.id(), " from worker ", peer,
                                                   " was claimed by another frame")));
    }
    arr->waiters.push_back(std::move(ready));
    return false;
  }
  for (const proto::TcpBlob& e : entries) {
    const Arrivals::Arrived& got = arr->blobs.at(e.id());
    if (got.size != e.size()) {
      return fail(
          absl::DataLossError(absl::StrCat("bulk blob id ", e.id(), " from worker ", peer, " has ",
                                           got.size, " bytes; its frame says ", e.size())));
    }
  }
  for (const proto::TcpBlob& e : entries) {
    auto node = arr->blobs.extract(e.id());
    Arrivals::Arrived& got = node.mapped();
    arr->unclaimed -= got.size;
    Blob& blob = frame.payload.blobs[e.index()];
    blob.pieces.clear();
    blob.pieces.emplace_back(got.data.get(), got.size);
    blob.owner = std::move(got.data);
  }
  return true;
}

bool BulkChannel::Connected(int peer, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto it = out_.find(peer);
  if (it == out_.end()) return false;
  std::shared_ptr<Outgoing> out = it->second;
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || out->state != Outgoing::State::kConnecting;
  };
  mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
  return !closed_ && out->state == Outgoing::State::kReady;
}

void BulkChannel::DropConnectionsForTesting() {
  absl::MutexLock lock(&mu_);
  for (auto& [peer, out] : out_) {
    if (out->fd >= 0) shutdown(out->fd, SHUT_RDWR);
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
