#include "store/memory_store.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/status_macros.h"

namespace baton::store {

absl::Status MemoryStore::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  data_[key] = std::string(value);
  NotifyLocked(key);
  return absl::OkStatus();
}

void MemoryStore::NotifyLocked(absl::string_view key) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  for (Waiter* w : it->second) {
    if (--w->missing == 0) w->wake.Signal();
  }
  watchers_.erase(it);
}

std::vector<std::string> MemoryStore::MissingLocked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!data_.contains(k)) missing.push_back(k);
  }
  return missing;
}

void MemoryStore::Unwatch(Waiter* w, const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    auto it = watchers_.find(k);
    if (it == watchers_.end()) continue;
    auto& list = it->second;
    list.erase(std::remove(list.begin(), list.end(), w), list.end());
    if (list.empty()) watchers_.erase(it);
  }
}

absl::Status MemoryStore::WaitLocked(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Each waiter is woken once, by the write that creates the last key it
  // misses (or by Close), not by every write: a barrier of n ranks costs n
  // wake-ups, not n squared. A key deleted after it was counted is looked
  // for again, so every key exists when this returns OK.
  Waiter w;
  for (;;) {
    if (closed_) return absl::UnavailableError("store is closed");
    std::vector<std::string> missing = MissingLocked(keys);
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out after ", DurationText(timeout), " waiting for ",
          missing.size() == 1 ? "key '" : "keys '", absl::StrJoin(missing, "', '"), "'",
          keys.size() > 1 ? absl::StrCat(" (", missing.size(), " of ", keys.size(), " missing)")
                          : ""));
    }
    w.missing = static_cast<int>(missing.size());
    for (const auto& k : missing) watchers_[k].push_back(&w);
    ++waiting_;
    while (w.missing > 0 && !closed_ && !w.wake.WaitWithDeadline(&mu_, deadline)) {
    }
    --waiting_;
    Unwatch(&w, missing);
  }
}

absl::StatusOr<std::string> MemoryStore::Get(absl::string_view key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(WaitLocked({std::string(key)}, timeout));
  return data_.at(key);
}

absl::StatusOr<int64_t> MemoryStore::Add(absl::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key '", key, "' holds a non-integer value; Add needs a counter"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return absl::OutOfRangeError(absl::StrCat("store key '", key, "': adding ", delta,
                                              " to the counter's ", value, " overflows int64"));
  }
  value = sum;
  data_[key] = absl::StrCat(value);
  NotifyLocked(key);
  return value;
}

absl::StatusOr<std::string> MemoryStore::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return std::string();
    data_[key] = std::string(desired);
    NotifyLocked(key);
    return std::string(desired);
  }
  if (it->second == expected) it->second = std::string(desired);
  return it->second;
}

absl::Status MemoryStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return WaitLocked(keys, timeout);
}

absl::StatusOr<std::vector<std::string>> MemoryStore::MultiGet(const std::vector<std::string>& keys,
                                                               absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(WaitLocked(keys, timeout));
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(data_.find(k)->second);
  return values;
}

int MemoryStore::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

absl::StatusOr<bool> MemoryStore::Delete(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  return data_.erase(key) > 0;
}

absl::StatusOr<int64_t> MemoryStore::NumKeys() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(data_.size());
}

void MemoryStore::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (auto& [key, list] : watchers_) {
    for (Waiter* w : list) w->wake.Signal();
  }
}

absl::StatusOr<std::vector<std::string>> Store::MultiGet(const std::vector<std::string>& keys,
                                                         absl::Duration timeout) {
  RETURN_IF_ERROR(Wait(keys, timeout));
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    ASSIGN_OR_RETURN(auto v, Get(key, timeout));
    values.push_back(std::move(v));
  }
  return values;
}

absl::Status ArriveFor(Store& store, absl::string_view name, int rank) {
  absl::Status s = store.Set(absl::StrCat(name, "/arrived/", rank), "1");
  return s.ok() ? s : Annotate(s, absl::StrCat("barrier '", name, "' (for rank ", rank, ")"));
}

absl::Status Barrier(Store& store, absl::string_view name, int rank, int world_size,
                     absl::Duration timeout) {
  const std::string prefix = absl::StrCat(name, "/arrived/");
  const std::string released = absl::StrCat(name, "/released");
  absl::Status s = store.Set(absl::StrCat(prefix, rank), "1");
  if (!s.ok()) return Annotate(s, absl::StrCat("barrier '", name, "'"));
  std::vector<std::string> arrived;
  arrived.reserve(world_size);
  for (int r = 0; r < world_size; ++r) arrived.push_back(absl::StrCat(prefix, r));
  if (rank == 0) {
    s = store.Wait(arrived, timeout);
    if (s.ok()) s = store.Set(released, "1");
  } else {
    s = store.Wait({released}, timeout);
  }
  if (s.ok()) return s;
  if (s.code() != absl::StatusCode::kDeadlineExceeded) {
    return Annotate(s, absl::StrCat("barrier '", name, "' (rank ", rank, ")"));
  }
  // Every rank arrived but rank 0 did not release the barrier (it died
  // after arriving: an external store outlives it): one read of them all
  // finds it so, and this rank releases it.
  if (rank != 0 && store.MultiGet(arrived, absl::ZeroDuration()).ok()) {
    return store.Set(released, "1");
  }
  // Name the ranks that never arrived: a read per rank, on this path only.
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    if (!store.Get(arrived[r], absl::ZeroDuration()).ok()) missing.push_back(r);
  }
  std::string what =
      missing.empty()
          ? std::string(
                "every rank arrived, but rank 0 never released the barrier (it waits "
                "for them all and then releases it)")
          : absl::StrCat(world_size - static_cast<int>(missing.size()), " of ", world_size,
                         " ranks arrived; missing rank", missing.size() == 1 ? " " : "s ",
                         absl::StrJoin(missing, ", "));
  return absl::DeadlineExceededError(absl::StrCat("barrier '", name, "' timed out after ",
                                                  DurationText(timeout), " on rank ", rank, ": ",
                                                  what));
}

}  // namespace baton::store
