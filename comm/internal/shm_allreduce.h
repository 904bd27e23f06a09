// Same-host all-reduce through shared memory: the Gloo backend's fast path
// when every rank of a group shares this host's /dev/shm (not a public header).
//
// Protocol (every rank runs the same sequence of all-reduces, in the order
// the group's collective thread issues them; each chunk of a tensor is one
// round with a generation number g, the same on every rank):
//   1. Before overwriting its slot, a rank waits until every rank has
//       finished reading the slots of round g-1 (done[k] >= g-1).
//   2. It copies its chunk into its own slot and publishes arrive[r] = g.
//   3. It waits until arrive[k] >= g for every k, then folds the slots in
//       rank order (slot 0, then 1, ...) into its tensor: every rank computes
//       the same result with the same rounding. Then it publishes done[r] = g.
// Counters are 32-bit with wrap-around comparison; waits spin briefly, then
// sleep on a futex, and are bounded by the op's deadline (the error then
// names the ranks that did not arrive) and by Abort().
// The segment (4 KiB of counters, then one 4 MiB slot per rank) is reserved
// with posix_fallocate, so a /dev/shm too small for it makes the group use
// Gloo instead; it is unlinked as soon as every rank has mapped it, so nothing
// is left in /dev/shm when processes die. BATON_COMM_SHM=0 turns it off.
//
// Thread-safety: Run() is called from one thread at a time (the group's
// collective thread); Abort() from any thread.
#ifndef BATON_COMM_INTERNAL_SHM_ALLREDUCE_H_
#define BATON_COMM_INTERNAL_SHM_ALLREDUCE_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/shm_segment.h"
#include "comm/backend.h"
#include "comm/internal/reduce_kernels.h"

namespace baton::comm::internal {

// Thrown by the Gloo backend's op body when a shared-memory round times out
// (mapped to DEADLINE_EXCEEDED naming the missing ranks).
class ShmTimeoutError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ShmAllReduce {
 public:
  // Per-rank slot: chunks of at most this many bytes go in one round.
  static constexpr size_t kSlotBytes = size_t{4} << 20;
  static constexpr int kMaxRanks = 16;

  // Null (no error) when the ranks do not all share this host's /dev/shm,
  // when the group is too large, or when BATON_COMM_SHM=0. Every rank of the
  // group must call it (it exchanges keys under ctx.prefix); all of them get
  // a channel or none does.
  static absl::StatusOr<std::unique_ptr<ShmAllReduce>> Create(const BackendContext& ctx);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  struct Header;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // All-reduces `t` (dense, contiguous, CPU) in place with `fn`.
  // DEADLINE_EXCEEDED naming the ranks that did not arrive; CANCELLED after
  // Abort().
  absl::Status Run(const at::Tensor& t, const ReduceFn& fn, absl::Time deadline);

  // Makes waiting and future Run() calls fail.
  void Abort() { aborted_.store(true); }

 private:
  ShmAllReduce(int rank, int size, ShmSegment segment);
  char* slot(int k) const;
  // Waits until counter[k] >= g for every k; false on deadline or abort
  // (then `late` lists the ranks still behind).
  bool WaitAll(std::atomic<uint32_t>* const* counters, uint32_t g, absl::Time deadline,
               std::string* late);
  // Marks the channel unusable and describes why (late ranks, or abort).
  absl::Status Fail(const std::string& late, const char* what);

  const int rank_;
  const int size_;
  const ShmSegment segment_;
  void* const base_;  // segment_'s memory
  Header* const header_;
  uint32_t generation_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace baton::comm::internal

#endif  // BATON_COMM_INTERNAL_SHM_ALLREDUCE_H_
