// StoreServer: serves a MemoryStore over gRPC. Rank 0 runs one at
// MASTER_ADDR:MASTER_PORT; `baton-store` runs one as its own process.
//
// Contract: if a job token is set, every call must carry it in the
// "x-baton-token" metadata or it fails with UNAUTHENTICATED. Blocking calls
// wait at most their own timeout, capped by the caller's gRPC deadline.
//
// Thread-safety: Start/Shutdown from one owner thread; the served store is
// safe for concurrent use. The destructor shuts down if still running.
#ifndef BATON_STORE_STORE_SERVER_H_
#define BATON_STORE_STORE_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/tls.h"
#include "store/memory_store.h"

namespace grpc {
class Server;
}

namespace baton::store {

// Trailing metadata of every answer of a StoreServer (store_client.h: a
// call that got it is not repeated).
inline constexpr char kStoreAnsweredKey[] = "x-baton-store-answered";

struct StoreServerOptions {
  // host:port to listen on; port 0 picks a free port.
  std::string address = "127.0.0.1:0";
  // Empty: no token is required.
  std::string job_token;
  // Mutual TLS (base/tls.h): clients must present a certificate signed by
  // the CA. Empty: plain text.
  TlsConfig tls;
};

class StoreServer {
 public:
  // Starts listening. Fails with UNAVAILABLE naming the address if it cannot
  // bind (e.g. the port is taken).
  static absl::StatusOr<std::unique_ptr<StoreServer>> Start(StoreServerOptions options);
  ~StoreServer();

  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // "host:port" with the bound port.
  const std::string& address() const { return address_; }
  MemoryStore& store() { return *store_; }

  // Fails pending waits, then stops the server; in-flight calls get at most
  // `grace` to finish.
  void Shutdown(absl::Duration grace = absl::Seconds(1));

 private:
  class Service;
  StoreServer() = default;

  std::unique_ptr<MemoryStore> store_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

}  // namespace baton::store

#endif  // BATON_STORE_STORE_SERVER_H_
