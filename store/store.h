// The rendezvous key-value store: the interface every backend implements.
//
// Contract: keys are strings, values are bytes. Blocking calls (Get, Wait)
// take a timeout and fail with DEADLINE_EXCEEDED naming the key(s) they
// waited for; no call blocks forever. Add keeps an integer counter stored as
// decimal text, so Get on a counter returns e.g. "3".
//
// Backends: MemoryStore (in-process), StoreClient (gRPC, talks to a
// StoreServer such as the one rank 0 runs at MASTER_ADDR:MASTER_PORT).
//
// Thread-safety: every implementation is safe for concurrent use.
#ifndef BATON_STORE_STORE_H_
#define BATON_STORE_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace baton::store {

class Store {
 public:
  virtual ~Store() = default;

  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // Blocks until `key` exists, at most `timeout`.
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;
  // Adds `delta` to the counter at `key` (a missing key counts as 0) and
  // returns the new value. INVALID_ARGUMENT if the value is not an integer;
  // OUT_OF_RANGE, leaving the counter unchanged, if the sum overflows int64.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;
  // Sets `desired` if the current value equals `expected` (a missing key
  // matches an empty `expected`). Returns the value after the operation.
  virtual absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                                 absl::string_view desired) = 0;
  // Blocks until every key exists, at most `timeout`.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // Blocks until every key exists, at most `timeout` (the error names the
  // missing keys, as Wait's), and returns their values in the order of
  // `keys`. The values are read after every key existed, each at some point
  // since; a backend may read them all at one revision (etcd). The default
  // is Wait, then Get for each key.
  virtual absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                            absl::Duration timeout);
  // Returns whether the key existed.
  virtual absl::StatusOr<bool> Delete(absl::string_view key) = 0;
  virtual absl::StatusOr<int64_t> NumKeys() = 0;
  // How many requests this object has sent to a store in another process
  // since it was made (a client's round trips: what the rendezvous costs the
  // store's host); 0 for an in-process store.
  virtual int64_t RequestsSent() const { return 0; }
};

// Every rank in [0, world_size) calls this with the same `name`; it returns
// once all have arrived, or fails after `timeout` with DEADLINE_EXCEEDED
// naming the ranks that did not arrive. A name is for one barrier of the
// store; a rank may call it again (a slice of a longer wait, a restarted
// process), and a call after the barrier passed returns at once.
//
// Its cost does not grow with world_size, except on rank 0: a rank says it
// arrived (name/arrived/<rank>) and waits for one key (name/released);
// rank 0 waits for every rank's arrival, in one request, and then sets
// that key. So the barrier passes once rank 0 has seen everyone, and a
// barrier whose rank 0 never comes fails by the timeout like any other. A
// rank whose wait times out with every rank arrived (rank 0 died after
// arriving, on a store that outlives it) releases the barrier itself.
absl::Status Barrier(Store& store, absl::string_view name, int rank, int world_size,
                     absl::Duration timeout);

// Sets `rank`'s arrival at barrier `name` without waiting: for a rank that
// left the job for good (a dropped worker), so that the others' Barrier()
// does not wait for it. Not for rank 0, which releases the barrier.
absl::Status ArriveFor(Store& store, absl::string_view name, int rank);

}  // namespace baton::store

#endif  // BATON_STORE_STORE_H_
