// SlowLink: a TCP relay on loopback that accepts at once but forwards
// nothing on a new connection until `delay` has passed, as a long or
// congested link (or a slow TLS peer) delays a connection's handshake.
// Tests put it between a gRPC client and its server to check that a
// handshake slower than the reconnect backoff still completes.
//
// Cut() breaks the connections relayed at the time, to check that a client
// whose connection broke mid-call makes a new one.
//
// Thread-safety: address() may be called from any thread; the destructor
// closes every connection and joins its threads (within about 50 ms).
#ifndef BATON_TESTING_SLOW_LINK_H_
#define BATON_TESTING_SLOW_LINK_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace baton::testing {

class SlowLink {
 public:
  // Listens on 127.0.0.1 (a port chosen now) and relays to `target`
  // ("127.0.0.1:port").
  static absl::StatusOr<std::unique_ptr<SlowLink>> Start(const std::string& target,
                                                         absl::Duration delay);
  ~SlowLink();
  SlowLink(const SlowLink&) = delete;
  SlowLink& operator=(const SlowLink&) = delete;

  const std::string& address() const { return address_; }
  // Connections accepted so far.
  int accepted() const { return accepted_.load(); }
  // Bytes relayed from clients to the target so far.
  int64_t bytes_to_target() const { return bytes_to_target_.load(); }
  // Breaks every connection relayed now, as a partition that outlasted it
  // does: the client's end gets a reset. Later connections are relayed.
  void Cut() { cuts_.fetch_add(1); }

 private:
  SlowLink(int listen_fd, int target_port, absl::Duration delay);
  void AcceptLoop();
  void Relay(int client_fd);

  const int listen_fd_;
  const int target_port_;
  const absl::Duration delay_;
  std::string address_;
  std::atomic<bool> stop_{false};
  absl::Notification stopping_;  // notified with stop_ set: ends the relays' delays
  std::atomic<int> accepted_{0};
  std::atomic<int64_t> bytes_to_target_{0};
  std::atomic<int> cuts_{0};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<std::thread> relays_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::testing

#endif  // BATON_TESTING_SLOW_LINK_H_
