// The bulk channel (bulk_channel.h): its start and end, its peers, the
// acceptor, and what each lane of a sender left behind (B6).
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

#include "base/status_macros.h"
#include "rpc/channel/tcp/bulk_channel_internal.h"
#include "rpc/channel/tcp/connection.h"
#include "rpc/channel/tcp/socket_io.h"

namespace baton::rpc::internal {

using bulk::kMaxHandshakes;

BulkChannel::BulkChannel(BulkChannelOptions options, Authenticator authenticate)
    : options_(std::move(options)),
      authenticate_(std::move(authenticate)),
      buffers_(std::make_shared<BufferPool>()) {}

absl::StatusOr<std::unique_ptr<BulkChannel>> BulkChannel::Start(BulkChannelOptions options,
                                                                Authenticator authenticate) {
  options.lanes = std::clamp(options.lanes, 1, kMaxLanes);
  std::unique_ptr<BulkChannel> c(new BulkChannel(std::move(options), std::move(authenticate)));
  if (c->options_.tls.enabled()) {
    ASSIGN_OR_RETURN(auto tls, tcp::TlsContext::Create(c->options_.tls));
    c->tls_ = std::move(tls);
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
    for (int lane = 0; lane < options_.lanes; ++lane) {
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
