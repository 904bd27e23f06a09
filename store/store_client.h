// StoreClient: the Store interface over gRPC, talking to a StoreServer.
//
// Contract: the server may start after the client (the master may come up
// last): every call waits for the connection, retrying with a short backoff,
// until its own deadline. Blocking calls (Get, Wait) are bounded by their
// timeout; the others by `options.call_timeout`. Errors name the store
// address and, for waits, the keys.
//
// A partition between client and server: a call whose connection breaks
// before its answer (UNAVAILABLE: the connection timed out, was reset, or
// could not be made again) is sent again on a new connection, until the
// call's deadline. So `call_timeout` is how long a partition may last
// before the non-blocking calls fail (baton-run sets it to
// --partition_tolerance). A repeated call has the effect of one: Set, Get,
// Wait and Delete are idempotent; a repeated CompareSet that was applied
// answers with the value it set; an Add carries a request id, and the
// server applies each id once (store_server.h). The Try* calls fail fast
// and are not repeated.
//
// Thread-safety: safe for concurrent use.
#ifndef BATON_STORE_STORE_CLIENT_H_
#define BATON_STORE_STORE_CLIENT_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include "base/tls.h"
#include "proto/store.grpc.pb.h"
#include "store/store.h"

namespace baton::store {

struct StoreClientOptions {
  // host:port of the StoreServer.
  std::string address;
  std::string job_token;
  // Bound on non-blocking calls, including waiting for the server to come up.
  absl::Duration call_timeout = absl::Seconds(60);
  // Mutual TLS (base/tls.h); empty: plain text.
  TlsConfig tls;
};

class StoreClient final : public Store {
 public:
  explicit StoreClient(StoreClientOptions options);
  ~StoreClient() override;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  // One round trip, where the default would need a Get per key.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;
  // Every attempt of every call, repeats after a broken connection included.
  int64_t RequestsSent() const override { return requests_.load(std::memory_order_relaxed); }

  // Waits until the server answers, at most `timeout`.
  absl::Status WaitForServer(absl::Duration timeout);

  // The value of `key` if the server is up and has it now; fails fast
  // (UNAVAILABLE, NOT_FOUND-like DEADLINE_EXCEEDED) instead of waiting for
  // the server or the key, bounded by `deadline`.
  absl::StatusOr<std::string> TryGet(absl::string_view key, absl::Duration deadline);
  // Set() that fails fast (UNAVAILABLE) when the server is not up, instead
  // of waiting for it, bounded by `deadline`: for a worker leaving a job
  // whose store may already be gone.
  absl::Status TrySet(absl::string_view key, absl::string_view value, absl::Duration deadline);

  const std::string& address() const { return options_.address; }

 private:
  void Prepare(grpc::ClientContext* ctx, absl::Time deadline) const;
  // Runs attempt(ctx), each time in a new context bounded by `deadline`,
  // again while it fails with UNAVAILABLE and the deadline is not reached.
  template <typename Attempt>
  absl::Status Retrying(absl::Time deadline, Attempt attempt) const;
  // For the Try* calls: no waiting for the server, the whole call within
  // `deadline`.
  void PrepareFailFast(grpc::ClientContext* ctx, absl::Duration deadline) const;
  absl::Status Fail(const char* op, absl::string_view key, const absl::Status& s) const;

  const StoreClientOptions options_;
  // Names this client's Add requests (with next_request_) for the server.
  const std::string client_id_;
  std::atomic<uint64_t> next_request_{1};
  mutable std::atomic<int64_t> requests_{0};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Store::Stub> stub_;
};

}  // namespace baton::store

#endif  // BATON_STORE_STORE_CLIENT_H_
