// Store-based exchanges a group runs outside its backend: the debug-mode op
// fingerprint check, and the arrival census after a collective timed out.
//
// Thread-safety: stateless functions; the store is safe for concurrent use.
#ifndef BATON_COMM_INTERNAL_STORE_EXCHANGE_H_
#define BATON_COMM_INTERNAL_STORE_EXCHANGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "store/store.h"

namespace baton::comm::internal {

// "1" for a world group; "1 (global 3)" when group rank 1 is world rank 3.
std::string RankText(int rank, const std::vector<int>& global_ranks);
// "[0, 2]" or "[0 (global 1), 2 (global 5)]".
std::string RanksText(const std::vector<int>& ranks, const std::vector<int>& global_ranks);

// Publishes this rank's fingerprint of collective `seq` and compares it with
// every other rank's. OK when all agree; FAILED_PRECONDITION describing each
// rank that disagreed; DEADLINE_EXCEEDED naming the ranks whose fingerprint
// did not arrive within `timeout`. Deletes this rank's key of `seq - 1`
// (every rank has read it by now).
absl::Status ExchangeFingerprint(store::Store& store, absl::string_view prefix, int64_t seq,
                                 int rank, int size, const std::vector<int>& global_ranks,
                                 absl::string_view fingerprint, absl::Duration timeout);

// After collective `seq` timed out on this rank: records that this rank
// reached it, then waits up to `grace` for the others to record the same (a
// rank records it when its own wait on that op or a later one times out).
// Returns the ranks that did not record reaching `seq`: the ones that never
// arrived. Store errors count as "unknown" and yield an empty list.
std::vector<int> MissingRanks(store::Store& store, absl::string_view prefix, int64_t seq, int rank,
                              int size, absl::Duration grace);

}  // namespace baton::comm::internal

#endif  // BATON_COMM_INTERNAL_STORE_EXCHANGE_H_
