// EtcdStore: the Store interface (store/store.h) on an etcd cluster, through
// etcd's v3 gRPC API (proto/etcd.proto): KV and Txn for the operations,
// Watch for the blocking ones, a Lease for the keys' lifetime.
//
// Contract:
// - Every key lives under `prefix` (a job's keys under their own prefix, so
//   one etcd serves many jobs); NumKeys counts those keys only.
// - Keys expire with the job: every key is attached to one lease per prefix,
//   which the first process to connect grants and every process keeps alive
//   while it runs. Once no process of the job is left, etcd deletes the keys
//   `lease_ttl` later. A process that finds the job's lease expired grants
//   a new one. lease_ttl zero: no lease, the keys stay.
// - Get, Wait and MultiGet read with one transaction per 128 keys and block
//   on one Watch from the revision they read at, so a key set in between is
//   never missed; they end at their timeout with DEADLINE_EXCEEDED naming
//   the missing keys. Add and CompareSet are transactions
//   (compare-and-swap on the key's revision); Add keeps MemoryStore's
//   INVALID_ARGUMENT and OUT_OF_RANGE errors.
// - The server may come up after the client: every call waits for the
//   connection, bounded by its own deadline (call_timeout for the
//   non-blocking ones; connect_timeout for Connect's first answer). A call
//   that failed with UNAVAILABLE (its connection broke: a partition, or
//   etcd restarted or has no leader) goes again until its deadline; an Add
//   whose first transaction was applied but whose answer was lost may then
//   count twice (etcd's transactions carry no request id). Errors name the
//   endpoint and the key.
// - Authentication: with `user` set, Connect() authenticates (etcd's
//   Authenticate) and every call carries the token; an expired token is
//   renewed once per call. TLS: `tls` (base/tls.h) with etcd's CA, and a
//   client certificate when etcd asks for one.
//
// Thread-safety: safe for concurrent use; one thread keeps the lease alive.
#ifndef BATON_STORE_ETCD_STORE_H_
#define BATON_STORE_ETCD_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/tls.h"
#include "proto/etcd.grpc.pb.h"
#include "store/store.h"

namespace baton::store {

struct EtcdStoreOptions {
  // host:port of an etcd client endpoint.
  std::string endpoint;
  // Every key of this store lives under it, e.g. "/baton/<run id>/".
  std::string prefix;
  // Bound on the non-blocking calls, including waiting for etcd to come up
  // again: a call whose connection broke, or that etcd answered with
  // UNAVAILABLE (no leader yet), goes again until then. So it is also how
  // long a partition from etcd may last before calls fail (baton-run sets
  // it from --partition_tolerance).
  absl::Duration call_timeout = absl::Seconds(30);
  // Bound on Connect()'s wait for etcd to answer at all (etcd may start
  // after the job); zero: call_timeout.
  absl::Duration connect_timeout = absl::ZeroDuration();
  // The job's lease (see the contract); zero: none.
  absl::Duration lease_ttl = absl::Seconds(60);
  // etcd's own authentication; empty user: none.
  std::string user;
  std::string password;
  // TLS to etcd: its CA, and a client certificate and key.
  TlsConfig tls;
};

class EtcdStore final : public Store {
 public:
  // Connects (waiting for etcd at most call_timeout), authenticates, and
  // joins or grants the prefix's lease.
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Connect(EtcdStoreOptions options);
  // Stops keeping the lease alive (the keys stay until it expires).
  ~EtcdStore() override;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  // One transaction per 128 keys reads them all; the missing ones are
  // awaited on one watch.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;

  // The lease every key is attached to (0: none).
  int64_t lease_id() const;
  // Creates `key` = `value` unless the key exists, on this process's own
  // session lease (granted on first use with `ttl`, at least 2 s, and kept
  // alive with the job's): the key goes `ttl` after this process stops
  // keeping it alive, i.e. dies or hangs. Returns whether this call created
  // it. This is etcd's leader election: the launcher's rendezvous host.
  absl::StatusOr<bool> CreateOnSession(absl::string_view key, absl::string_view value,
                                       absl::Duration ttl);
  // Ends the job's keys now: revokes the job's lease, which deletes every key
  // on it (the keys of every process that shares it), and this process's
  // session. For the process that knows the job is over; the store is
  // unusable afterwards.
  absl::Status RevokeLease();
  const std::string& endpoint() const { return options_.endpoint; }
  // How many blocking calls (Get, Wait, MultiGet) have read their keys,
  // found some missing, and wait for them on a watch now (as
  // MemoryStore::waiting()): tests synchronise on a call having reached
  // etcd. A key set after this counted a call reaches that call.
  int waiting() const { return waiting_.load(std::memory_order_acquire); }
  // Every call and stream opened toward etcd (a transaction of up to 128
  // reads is one; the lease's keep-alive stream is one, however long).
  int64_t RequestsSent() const override { return requests_.load(std::memory_order_relaxed); }

 private:
  explicit EtcdStore(EtcdStoreOptions options);

  // Sets deadline, wait-for-ready and the auth token.
  void Prepare(grpc::ClientContext* ctx, absl::Time deadline) const;
  // Waits until etcd answers a call, at most connect_timeout.
  absl::Status WaitForEtcd();
  absl::Status Authenticate();
  // Runs `call` (one etcd RPC) with a fresh context; renews an expired auth
  // token once.
  template <typename Call>
  absl::Status Rpc(const char* op, absl::string_view key, absl::Time deadline, Call call);
  absl::Status Fail(const char* op, absl::string_view key, const absl::Status& s) const;

  // The job's lease: the one stored at the prefix's lease key while it is
  // alive, else a new one (replacing `dead`).
  absl::Status JoinOrGrantLease(int64_t dead);
  absl::StatusOr<int64_t> KeepAliveOnce(int64_t id, absl::Time deadline);
  void KeepAliveLoop();
  // Put with the lease; renews a lease found dead once.
  absl::Status PutWithLease(const std::string& full_key, absl::string_view value,
                            absl::Time deadline);
  etcdserverpb::RequestOp PutOp(const std::string& full_key, absl::string_view value) const;

  // Waits until every key exists, at most until `deadline`; their values,
  // or the indices of the keys still missing at the deadline.
  struct Awaited {
    std::vector<std::optional<std::string>> values;
    std::vector<size_t> missing;
  };
  absl::StatusOr<Awaited> AwaitKeys(const std::vector<std::string>& keys, absl::Time deadline);
  // Reads `full_keys` (transactions of at most 128 ranges); sets *revision to
  // the lowest revision they were read at.
  absl::StatusOr<std::vector<std::optional<std::string>>> ReadKeys(
      const std::vector<std::string>& full_keys, int64_t* revision);
  std::string DataKey(absl::string_view key) const;
  std::string LeaseKey() const;

  const EtcdStoreOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth_;

  mutable absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // CreateOnSession's lease (0: none yet, or expired) and its TTL.
  int64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration session_ttl_ ABSL_GUARDED_BY(mu_);
  // Wakes the keep-alive loop when a session begins (its period shrinks).
  bool session_new_ ABSL_GUARDED_BY(mu_) = false;
  // The keep-alive stream's context, to cancel it at destruction.
  grpc::ClientContext* keepalive_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread keepalive_;
  std::atomic<int> waiting_{0};
  mutable std::atomic<int64_t> requests_{0};
};

}  // namespace baton::store

#endif  // BATON_STORE_ETCD_STORE_H_
