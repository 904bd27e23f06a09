// EtcdServer: a real etcd (Debian's etcd-server, /usr/bin/etcd) for one
// test or benchmark, on loopback.
//
// Contract:
// - Start() runs one single-member etcd with its client and peer ports
//   chosen at run time (FreePort) and its data in a fresh temporary
//   directory, and returns once etcd logged that it serves client traffic, at most
//   `timeout` later. The process gets PR_SET_PDEATHSIG(SIGKILL), so it dies
//   with the test even if the test is killed.
// - With `auth`, a root user with `root_password` is created and
//   authentication enabled before Start() returns (etcdctl).
// - The destructor (or Stop()) ends it (SIGTERM, then SIGKILL after 5 s) and
//   reaps it; Kill() sends SIGKILL and reaps at once.
// - Errors: UNAVAILABLE naming what failed, with etcd's last output.
//
// Thread-safety: not thread-safe; owned by one test thread.
#ifndef BATON_TESTING_ETCD_SERVER_H_
#define BATON_TESTING_ETCD_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::testing {

struct EtcdServerOptions {
  absl::Duration timeout = absl::Seconds(30);
  // Turn on etcd's authentication with a root user.
  bool auth = false;
  std::string root_password = "baton-test-root";
  // Mutual TLS for clients: DIR/ca.pem, DIR/etcd.pem and DIR/etcd.key
  // (tools/make_certs.sh DIR etcd); etcd then requires a client certificate
  // signed by that CA. Not with `auth`.
  std::string tls_dir;
  // Run etcd in this network namespace (`ip netns exec`, as root), listening
  // on `host` there; empty: this process's namespace, on loopback.
  std::string netns;
  std::string host = "127.0.0.1";
};

class EtcdServer {
 public:
  static bool Available();  // /usr/bin/etcd exists
  static absl::StatusOr<std::unique_ptr<EtcdServer>> Start(EtcdServerOptions options = {});
  ~EtcdServer();

  // host:<client port>
  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }
  void Stop();
  void Kill();

 private:
  EtcdServer() = default;
  // Reads etcd's output until it closes (etcd, a Go program, exits on
  // SIGPIPE if nobody reads its stderr).
  void Drain(int fd);
  absl::Status WaitReady(absl::Duration timeout);
  std::string LogTail() const;

  pid_t pid_ = -1;
  std::string endpoint_;
  std::string data_dir_;
  std::thread drain_;
  mutable absl::Mutex mu_;
  std::string log_ ABSL_GUARDED_BY(mu_);  // the last 16 KiB of etcd's output
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::testing

#endif  // BATON_TESTING_ETCD_SERVER_H_
