// Blocking socket helpers of the bulk channel (socket_io.h).
#include "rpc/channel/tcp/socket_io.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/time/clock.h"

namespace baton::rpc::internal::tcp {

bool ReadAll(int fd, void* dst, size_t n) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return false;  // end of stream, error, or the handshake's timeout
    }
  }
  return true;
}

// Reads and drops n bytes (a resent record, B8).
bool Discard(int fd, uint64_t n) {
  char sink[64 << 10];
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, sizeof sink));
    if (!ReadAll(fd, sink, chunk)) return false;
    n -= chunk;
  }
  return true;
}

bool WriteAll(int fd, std::vector<iovec> iov) {
  size_t i = 0;
  while (i < iov.size()) {
    // sendmsg, not writev: a connection the peer closed fails the write
    // (EPIPE) instead of raising SIGPIPE in the process.
    msghdr msg{};
    msg.msg_iov = iov.data() + i;
    msg.msg_iovlen = std::min<size_t>(iov.size() - i, IOV_MAX);
    const ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(w);
    while (i < iov.size() && left >= iov[i].iov_len) {
      left -= iov[i].iov_len;
      ++i;
    }
    if (i < iov.size()) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  return true;
}

void SetTimeout(int fd, absl::Duration d) {
  timeval tv = absl::ToTimeval(d);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// A connection outlives silence as the stream does (the agent's partition
// tolerance), no longer: unacknowledged data or a zero window abort it only
// after `silence` (TCP_USER_TIMEOUT, which TCP's own retry counts would
// reach much sooner under a partition), and keepalive probes find a peer
// gone while nothing is sent (the receiving end).
void Tolerate(int fd, absl::Duration silence) {
  const int ms = static_cast<int>(std::max<int64_t>(1000, absl::ToInt64Milliseconds(silence)));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
  int one = 1;
  const int idle = std::max(1, ms / 3000), interval = std::max(1, ms / 6000), count = 6;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

namespace {

// "host:port" or "[v6]:port".
bool SplitAddress(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty() && !port->empty();
}

// Whether a blocking connect(2) that returned `rc` on `fd` connected. A
// signal interrupts it (EINTR) without stopping it: then the outcome is
// waited for, up to `timeout`.
bool ConnectFinished(int fd, int rc, absl::Duration timeout) {
  if (rc == 0) return true;
  if (errno != EINTR) return false;
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    const int ready = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    int error = 0;
    socklen_t len = sizeof error;
    return getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
  }
}

}  // namespace

int Connect(const std::string& address, absl::Duration timeout) {
  std::string host, port;
  if (!SplitAddress(address, &host, &port)) return -1;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    SetTimeout(fd, timeout);  // a connect(2) on a blocking socket honors SO_SNDTIMEO
    if (!ConnectFinished(fd, connect(fd, a->ai_addr, a->ai_addrlen), timeout)) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

bool SameBytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace baton::rpc::internal::tcp
