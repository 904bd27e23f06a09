#include "obs/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton::obs {
namespace {

constexpr absl::Duration kConnectionBound = absl::Seconds(2);
constexpr size_t kMaxRequestBytes = 8 << 10;

int MillisLeft(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

void WriteAll(int fd, const std::string& data, absl::Time deadline) {
  size_t off = 0;
  while (off < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, MillisLeft(deadline)) <= 0) return;
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string Response(int code, const char* reason, const std::string& type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, const MetricsRegistry* registry) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "': '", host, "' is not an IPv4 address"));
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->registry_ = registry;
  s->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (s->listen_fd_ < 0 || ::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(s->listen_fd_, 16) != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(a);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  s->port_ = ntohs(a.sin_port);
  if (::pipe2(s->wake_, O_CLOEXEC) != 0) {
    return absl::UnavailableError("metrics: cannot make a pipe");
  }
  s->thread_ = std::thread([srv = s.get()] { srv->Serve(); });
  return s;
}

MetricsServer::~MetricsServer() {
  if (wake_[1] >= 0) {
    const char b = 1;
    while (::write(wake_[1], &b, 1) < 0 && errno == EINTR) {
    }
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void MetricsServer::Serve() {
  while (true) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    Handle(fd);
    ::close(fd);
  }
}

void MetricsServer::Handle(int fd) {
  const absl::Time deadline = absl::Now() + kConnectionBound;
  std::string request;
  char buf[1024];
  while (request.find("\r\n\r\n") == std::string::npos) {
    if (request.size() > kMaxRequestBytes) {
      WriteAll(fd, Response(400, "Bad Request", "text/plain", "request too large\n"), deadline);
      return;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, MillisLeft(deadline)) <= 0) return;  // stalled: drop it
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) {
    WriteAll(fd, Response(400, "Bad Request", "text/plain", "malformed request line\n"), deadline);
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET") {
    WriteAll(fd, Response(405, "Method Not Allowed", "text/plain", "GET /metrics only\n"),
             deadline);
    return;
  }
  if (path != "/metrics") {
    WriteAll(fd, Response(404, "Not Found", "text/plain", "try /metrics\n"), deadline);
    return;
  }
  WriteAll(fd, Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8", registry_->Render()),
           deadline);
}

}  // namespace baton::obs
