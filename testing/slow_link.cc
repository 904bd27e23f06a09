#include "testing/slow_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace baton::testing {
namespace {

constexpr int kPollMs = 50;

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Writes all of buf; false if the socket failed.
bool WriteAll(int fd, const char* buf, ssize_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    buf += w;
    n -= w;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SlowLink>> SlowLink::Start(const std::string& target,
                                                          absl::Duration delay) {
  int port = 0;
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(target.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("SlowLink: bad target '", target, "'"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in any = Loopback(0);
  socklen_t len = sizeof(any);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof(any)) != 0 || ::listen(fd, 16) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&any), &len) != 0) {
    const int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("SlowLink listen: ", std::strerror(e)));
  }
  std::unique_ptr<SlowLink> link(new SlowLink(fd, port, delay));
  link->address_ = absl::StrCat("127.0.0.1:", ntohs(any.sin_port));
  link->acceptor_ = std::thread([l = link.get()] { l->AcceptLoop(); });
  return link;
}

SlowLink::SlowLink(int listen_fd, int target_port, absl::Duration delay)
    : listen_fd_(listen_fd), target_port_(target_port), delay_(delay) {}

SlowLink::~SlowLink() {
  stop_.store(true);
  stopping_.Notify();
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> relays;
  {
    absl::MutexLock lock(&mu_);
    relays.swap(relays_);
  }
  for (std::thread& t : relays) t.join();
  ::close(listen_fd_);
}

void SlowLink::AcceptLoop() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kPollMs) <= 0) continue;
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    accepted_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    relays_.emplace_back([this, client] { Relay(client); });
  }
}

void SlowLink::Relay(int client) {
  // The link's latency (what the link simulates): nothing moves until the
  // delay has passed, or the link stops.
  (void)stopping_.WaitForNotificationWithTimeout(delay_);
  const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to = Loopback(target_port_);
  if (stop_.load() || server < 0 ||
      ::connect(server, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    if (server >= 0) ::close(server);
    ::close(client);
    return;
  }
  const int one = 1;
  (void)::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  (void)::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char buf[64 << 10];
  pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
  bool open = true;
  const int generation = cuts_.load();
  while (open && !stop_.load()) {
    if (cuts_.load() != generation) {
      // A reset, not a clean close: linger 0.
      const linger hard{1, 0};
      (void)::setsockopt(client, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
      (void)::setsockopt(server, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
      break;
    }
    if (::poll(fds, 2, kPollMs) <= 0) continue;
    for (int i = 0; i < 2 && open; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = ::recv(fds[i].fd, buf, sizeof(buf), 0);
      open = n > 0 && WriteAll(fds[1 - i].fd, buf, n);
      if (open && i == 0) bytes_to_target_.fetch_add(n);
    }
  }
  ::close(server);
  ::close(client);
}

}  // namespace baton::testing
