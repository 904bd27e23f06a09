#include "obs/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
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
constexpr absl::string_view kUnix = "unix:";

int MillisLeft(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

bool WriteAll(int fd, const std::string& data, absl::Time deadline) {
  size_t off = 0;
  while (off < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, MillisLeft(deadline)) <= 0) return false;
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string Response(int code, const char* reason, const std::string& type,
                     const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

// A socket address for either form of `address`.
struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_INET;
  std::string unix_path;
};

absl::StatusOr<Address> Resolve(const std::string& address) {
  Address out;
  if (absl::StartsWith(address, kUnix)) {
    out.unix_path = address.substr(kUnix.size());
    sockaddr_un a{};
    if (out.unix_path.empty() || out.unix_path.size() >= sizeof(a.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("socket path '", out.unix_path,
                                                     "' must be 1 to ", sizeof(a.sun_path) - 1,
                                                     " bytes long"));
    }
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, out.unix_path.data(), out.unix_path.size());
    std::memcpy(&out.storage, &a, sizeof(a));
    out.length = sizeof(a);
    out.family = AF_UNIX;
    return out;
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is neither HOST:PORT nor unix:PATH"));
  }
  std::string host = address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "': '", host, "' is not an IPv4 address"));
  }
  std::memcpy(&out.storage, &a, sizeof(a));
  out.length = sizeof(a);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, std::map<std::string, HttpRoute> routes) {
  auto a = Resolve(address);
  if (!a.ok()) return a.status();
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->routes_ = std::move(routes);
  s->listen_fd_ = ::socket(a->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (a->family == AF_INET) {
    const int one = 1;
    ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  } else {
    ::unlink(a->unix_path.c_str());  // a stale socket of an earlier process
  }
  if (s->listen_fd_ < 0 ||
      ::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&a->storage), a->length) != 0 ||
      ::listen(s->listen_fd_, 16) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", std::strerror(errno)));
  }
  s->unix_path_ = a->unix_path;
  if (a->family == AF_INET) {
    sockaddr_in bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
    s->port_ = ntohs(bound.sin_port);
  }
  if (::pipe2(s->wake_, O_CLOEXEC) != 0) {
    return absl::UnavailableError("http server: cannot make a pipe");
  }
  s->thread_ = std::thread([srv = s.get()] { srv->Serve(); });
  return s;
}

HttpServer::~HttpServer() {
  if (wake_[1] >= 0) {
    const char b = 1;
    while (::write(wake_[1], &b, 1) < 0 && errno == EINTR) {
    }
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
}

void HttpServer::Serve() {
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

void HttpServer::Handle(int fd) {
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
  std::string paths;
  for (const auto& [p, route] : routes_) absl::StrAppend(&paths, paths.empty() ? "" : ", ", p);
  if (method != "GET") {
    WriteAll(fd,
             Response(405, "Method Not Allowed", "text/plain", absl::StrCat("GET ", paths, "\n")),
             deadline);
    return;
  }
  auto it = routes_.find(path);
  if (it == routes_.end()) {
    WriteAll(fd, Response(404, "Not Found", "text/plain", absl::StrCat("try ", paths, "\n")),
             deadline);
    return;
  }
  WriteAll(fd, Response(200, "OK", it->second.content_type, it->second.body()), deadline);
}

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path,
                                    absl::Duration timeout, const std::string& method) {
  auto a = Resolve(address);
  if (!a.ok()) return a.status();
  const absl::Time deadline = absl::Now() + timeout;
  const int fd = ::socket(a->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a->storage), a->length) != 0 &&
      errno != EINPROGRESS) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", address, ": ", std::strerror(errno)));
  }
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, MillisLeft(deadline)) <= 0) {
    return absl::DeadlineExceededError(absl::StrCat("connecting to ", address));
  }
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", address, ": ", std::strerror(err)));
  }
  if (!WriteAll(fd, absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: baton\r\n\r\n"),
                deadline)) {
    return absl::UnavailableError(absl::StrCat("cannot send the request to ", address));
  }
  std::string out;
  char buf[16 << 10];
  while (true) {
    pollfd r{fd, POLLIN, 0};
    const int ready = ::poll(&r, 1, MillisLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no complete answer from ", address, " in ", absl::FormatDuration(timeout)));
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return absl::UnavailableError(
          absl::StrCat("reading from ", address, ": ", std::strerror(errno)));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string HttpBody(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? std::string() : response.substr(at + 4);
}

int HttpStatus(const std::string& response) {
  int code = 0;
  if (!absl::StartsWith(response, "HTTP/1.1 ") || response.size() < 12 ||
      !absl::SimpleAtoi(response.substr(9, 3), &code)) {
    return 0;
  }
  return code;
}

}  // namespace baton::obs
