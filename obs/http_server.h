// HttpServer: the small HTTP/1.1 endpoint a worker serves its observability
// on: GET /metrics (Prometheus's text exposition format 0.0.4, for a scrape)
// and GET /state (the worker's state for the hang report, obs/state.h), on a
// TCP port (AgentOptions::observability.metrics_address) or a Unix socket
// (AgentOptions::observability.state_socket, baton-run's). HttpGet is its client.
//
// Contract:
// - Start() binds `address` and serves `routes` from one thread. An address
//   is "HOST:PORT" (IPv4; port 0 picks a free one) or "unix:PATH" (a stale
//   socket file at PATH is replaced; the destructor removes it).
// - GET of a route answers 200 with its body; any other path 404, any other
//   method 405, a malformed request 400. One request per connection
//   (Connection: close).
// - Every read and write is bounded (2 s per connection), so a client that
//   stalls delays other requests by at most that, never forever. A route's
//   body function must not block.
// - The destructor stops accepting, and joins the thread.
// - Errors: Start() returns INVALID_ARGUMENT for an address of neither form,
//   UNAVAILABLE naming the address when it cannot bind.
//
// Thread-safety: Start/the destructor from one thread; route functions run
// on the server's thread, concurrently with everything else.
#ifndef BATON_OBS_HTTP_SERVER_H_
#define BATON_OBS_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton::obs {

struct HttpRoute {
  std::string content_type;
  std::function<std::string()> body;
};

class HttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           std::map<std::string, HttpRoute> routes);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The TCP port bound; 0 on a Unix socket.
  int port() const { return port_; }

 private:
  HttpServer() = default;
  void Serve();
  void Handle(int fd);

  std::map<std::string, HttpRoute> routes_;
  std::string unix_path_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: a byte on it ends Serve()
  int port_ = 0;
  std::thread thread_;
};

// The whole response (status line, headers, body) of GET `path` at
// `address` (either form above), within `timeout`. UNAVAILABLE when the
// address cannot be reached, DEADLINE_EXCEEDED past the timeout.
absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path,
                                    absl::Duration timeout, const std::string& method = "GET");

// The body of a response, and its status code (0 when malformed).
std::string HttpBody(const std::string& response);
int HttpStatus(const std::string& response);

}  // namespace baton::obs

#endif  // BATON_OBS_HTTP_SERVER_H_
