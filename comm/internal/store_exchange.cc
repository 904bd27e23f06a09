#include "comm/internal/store_exchange.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status.h"

namespace baton::comm::internal {
namespace {

std::string FingerprintKey(absl::string_view prefix, int64_t seq, int rank) {
  return absl::StrCat(prefix, "/fp/", seq, "/", rank);
}

std::string ProgressKey(absl::string_view prefix, int rank) {
  return absl::StrCat(prefix, "/progress/", rank);
}

}  // namespace

std::string RankText(int rank, const std::vector<int>& global_ranks) {
  if (rank >= 0 && rank < static_cast<int>(global_ranks.size()) && global_ranks[rank] != rank) {
    return absl::StrCat(rank, " (global ", global_ranks[rank], ")");
  }
  return absl::StrCat(rank);
}

std::string RanksText(const std::vector<int>& ranks, const std::vector<int>& global_ranks) {
  std::vector<std::string> parts;
  parts.reserve(ranks.size());
  for (int r : ranks) parts.push_back(RankText(r, global_ranks));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

absl::Status ExchangeFingerprint(store::Store& store, absl::string_view prefix, int64_t seq,
                                 int rank, int size, const std::vector<int>& global_ranks,
                                 absl::string_view fingerprint, absl::Duration timeout) {
  absl::Status set = store.Set(FingerprintKey(prefix, seq, rank), fingerprint);
  if (!set.ok()) return Annotate(set, "publishing the op fingerprint");
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> missing;
  std::vector<std::string> disagreements;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
    absl::StatusOr<std::string> other = store.Get(FingerprintKey(prefix, seq, r), left);
    if (!other.ok()) {
      if (other.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return Annotate(other.status(), "reading the op fingerprints");
      }
      missing.push_back(r);
      continue;
    }
    if (*other != fingerprint) {
      disagreements.push_back(absl::StrCat("rank ", RankText(r, global_ranks), " called ", *other));
    }
  }
  if (seq > 0) {
    // Best effort cleanup; a failure only leaves a small key behind.
    (void)store.Delete(FingerprintKey(prefix, seq - 1, rank));
  }
  if (!disagreements.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ranks disagree on the collective (debug fingerprint check): rank ",
                     RankText(rank, global_ranks), " called ", fingerprint, "; ",
                     absl::StrJoin(disagreements, "; ")));
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrCat("ranks ", RanksText(missing, global_ranks),
                                                    " never arrived (no op fingerprint after ",
                                                    DurationText(timeout), ")"));
  }
  return absl::OkStatus();
}

std::vector<int> MissingRanks(store::Store& store, absl::string_view prefix, int64_t seq, int rank,
                              int size, absl::Duration grace) {
  if (!store.Set(ProgressKey(prefix, rank), absl::StrCat(seq)).ok()) return {};
  const absl::Time deadline = absl::Now() + grace;
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (r != rank) missing.push_back(r);
  }
  while (!missing.empty()) {
    std::vector<int> still;
    for (int r : missing) {
      absl::StatusOr<std::string> v = store.Get(ProgressKey(prefix, r), absl::Milliseconds(1));
      int64_t reached = -1;
      if (v.ok() && absl::SimpleAtoi(*v, &reached) && reached >= seq) continue;
      if (!v.ok() && v.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return {};
      }
      still.push_back(r);
    }
    missing.swap(still);
    if (missing.empty() || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return missing;
}

}  // namespace baton::comm::internal
