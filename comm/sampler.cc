#include "comm/sampler.h"

#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace baton::comm {

absl::StatusOr<DistributedSampler> DistributedSampler::Create(int64_t size, int replicas, int rank,
                                                              SamplerOptions options) {
  if (size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: dataset size ", size, " < 0"));
  }
  if (replicas < 1 || rank < 0 || rank >= replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: rank ", rank, " is not in [0, replicas=", replicas, ")"));
  }
  return DistributedSampler(size, replicas, rank, options);
}

DistributedSampler::DistributedSampler(int64_t size, int replicas, int rank, SamplerOptions options)
    : size_(size), replicas_(replicas), rank_(rank), options_(options) {
  num_samples_ = options_.drop_last ? size_ / replicas_ : (size_ + replicas_ - 1) / replicas_;
}

std::vector<int64_t> DistributedSampler::Indices() const {
  std::vector<int64_t> all(size_);
  std::iota(all.begin(), all.end(), 0);
  if (options_.shuffle && size_ > 1) {
    std::mt19937_64 rng(options_.seed + epoch_);
    for (int64_t i = size_ - 1; i > 0; --i) {
      // Modulo bias is irrelevant here (i < 2^63, rng is 64-bit) and keeps
      // the permutation independent of the library's distributions.
      const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(all[i], all[j]);
    }
  }
  const int64_t total = num_samples_ * replicas_;
  if (total > size_ && size_ > 0) {
    // Pad by repeating the head (several times if the dataset is tiny).
    for (int64_t i = size_; i < total; ++i) all.push_back(all[i % size_]);
  }
  all.resize(total);
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = rank_; i < total; i += replicas_) mine.push_back(all[i]);
  return mine;
}

}  // namespace baton::comm
