// MetricsServer: serves a MetricsRegistry over HTTP for Prometheus to
// scrape (GET /metrics, text exposition format 0.0.4).
//
// Contract:
// - Start() binds `address` (host:port; port 0 picks a free one) and serves
//   from one thread: GET /metrics answers 200 with Render(); any other path
//   404, any other method 405, a malformed request 400. One request per
//   connection (Connection: close).
// - Every read and write is bounded (2 s per connection), so a client that
//   stalls delays other scrapes by at most that, never forever.
// - The destructor stops accepting, and joins the thread.
// - Errors: Start() returns UNAVAILABLE naming the address when it cannot
//   bind.
//
// Thread-safety: Start/the destructor from one thread; scraping is
// concurrent with everything the registry allows.
#ifndef BATON_OBS_METRICS_SERVER_H_
#define BATON_OBS_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "obs/metrics.h"

namespace baton::obs {

class MetricsServer {
 public:
  // REQUIRES: `registry` outlives the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              const MetricsRegistry* registry);
  ~MetricsServer();

  // The port bound.
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  void Serve();
  void Handle(int fd);

  const MetricsRegistry* registry_ = nullptr;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: a byte on it ends Serve()
  int port_ = 0;
  std::thread thread_;
};

}  // namespace baton::obs

#endif  // BATON_OBS_METRICS_SERVER_H_
