// MemoryStore: the in-process Store backend. StoreServer serves one over
// gRPC; tests use it directly.
//
// Thread-safety: safe for concurrent use. A blocking call waits on its own
// condition variable with a deadline, woken by the write that creates the
// last key it misses; Close() wakes them all with UNAVAILABLE.
#ifndef BATON_STORE_MEMORY_STORE_H_
#define BATON_STORE_MEMORY_STORE_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "store/store.h"

namespace baton::store {

class MemoryStore final : public Store {
 public:
  MemoryStore() = default;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  // OUT_OF_RANGE, leaving the counter as it is, if the sum overflows int64.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key, absl::string_view expected,
                                         absl::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  // Every value read under the lock that saw the last key arrive.
  absl::StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;

  // Fails every current and future blocking call with UNAVAILABLE.
  void Close();

  // How many blocking calls (Get, Wait) are waiting for keys now. A server
  // reports it; tests synchronise on a call having reached the store.
  int waiting() const;

 private:
  // Waits until all `keys` exist, the deadline passes, or Close().
  absl::Status WaitLocked(const std::vector<std::string>& keys, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A blocking call in progress: how many of its keys do not exist yet.
  struct Waiter {
    absl::CondVar wake;
    int missing = 0;
  };
  // Counts `key` as arrived for the waiters that miss it.
  void NotifyLocked(absl::string_view key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> MissingLocked(const std::vector<std::string>& keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unwatch(Waiter* w, const std::vector<std::string>& keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  // The waiters of each key that does not exist yet.
  absl::flat_hash_map<std::string, std::vector<Waiter*>> watchers_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton::store

#endif  // BATON_STORE_MEMORY_STORE_H_
