// DistributedSampler: shards a dataset of `size` examples across the ranks
// of a data-parallel job.
//
// Contract: every rank builds it with the same size, replicas, seed and
// options, and calls SetEpoch(e) with the same e before each epoch. Then:
//  - the permutation of an epoch is identical on every rank (a fixed
//    Fisher-Yates over mt19937_64 seeded with seed + epoch; it does not
//    depend on the standard library's shuffle);
//  - every rank gets the same number of indices: the index list is padded by
//    repeating its head to a multiple of `replicas` (or, with drop_last, cut
//    down to one);
//  - rank r takes positions r, r + replicas, r + 2 * replicas, ...
//
// Thread-safety: not thread-safe; one sampler per data loader.
#ifndef BATON_COMM_SAMPLER_H_
#define BATON_COMM_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::comm {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // INVALID_ARGUMENT unless size >= 0, replicas >= 1, 0 <= rank < replicas.
  static absl::StatusOr<DistributedSampler> Create(int64_t size, int replicas, int rank,
                                                   SamplerOptions options = {});

  void SetEpoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch.
  std::vector<int64_t> Indices() const;
  // How many indices each rank gets per epoch.
  int64_t num_samples() const { return num_samples_; }

 private:
  DistributedSampler(int64_t size, int replicas, int rank, SamplerOptions options);

  int64_t size_;
  int replicas_;
  int rank_;
  SamplerOptions options_;
  int64_t num_samples_;
  uint64_t epoch_ = 0;
};

}  // namespace baton::comm

#endif  // BATON_COMM_SAMPLER_H_
