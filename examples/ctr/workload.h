// The CTR (click-through-rate) workload of the peer benchmark
// /work/shared/peer/torch_ps_sparse_bench.py, re-implemented from the
// "WORKLOAD DEFINITION" in its docstring: per-step batches (Zipf(1.1) ids over
// one shared table for 26 fields, 13 dense features, labels from a hidden
// linear function), the table's initial rows and the tower's initial weights.
//
// Contract: every value is a pure function of (config, trainer, step) or
// (config, id): counter-based SplitMix64 random numbers, so values can be made
// in any order, on any process, lazily. Integers (ids, labels) and every
// float64 intermediate match the peer bit for bit, and so do the float32
// values (dense features, table rows, tower weights), which are float32 casts
// of bit-exact float64 values. One documented exception: the peer builds its
// Zipf CDF with numpy's `**`, which on AVX-512 machines uses SVML's pow (off
// by one ulp for ~28% of the 1M terms); here each term is std::pow (glibc,
// correctly rounded in practice), then summed in order like numpy's cumsum.
// The CDFs then differ by at most 2.2e-16, a rank differs with probability
// ~8e-11 per draw, and none differed over 4 trainers x 1510 steps of seed 0.
//
// Thread-safety: a Workload is immutable once created; all its methods are
// const and safe for concurrent use. Copies are cheap (they share the CDF).
#ifndef BATON_EXAMPLES_CTR_WORKLOAD_H_
#define BATON_EXAMPLES_CTR_WORKLOAD_H_

#include <torch/nn/modules/container/sequential.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::examples::ctr {

struct WorkloadConfig {
  int64_t rows = 1000000;  // table rows N (ids are 0..N-1)
  int64_t dim = 64;        // row width D
  int64_t batch = 512;     // samples per step B
  uint64_t seed = 0;
};

constexpr int kFields = 26;   // categorical fields, all looking up one table
constexpr int kDense = 13;    // dense features per sample
constexpr int kHidden = 256;  // the tower's hidden width

// Tags of the random streams (the docstring's EMB, TOWER, HIDDEN, IDS, DENSE).
constexpr uint64_t kTagEmb = 1;
constexpr uint64_t kTagTower = 2;
constexpr uint64_t kTagHidden = 3;
constexpr uint64_t kTagIds = 4;
constexpr uint64_t kTagDense = 5;

// SplitMix64's finaliser (all arithmetic mod 2^64).
uint64_t Mix64(uint64_t z);
// The key of one random stream: h = seed; for p in (tag, a, b):
// h = Mix64((h ^ p) + 0x9E3779B97F4A7C15).
uint64_t Key(uint64_t seed, uint64_t tag, uint64_t a = 0, uint64_t b = 0);
// The i-th output of SplitMix64 seeded k, as a float64 in [0, 1) with 53 bits.
double Uniform(uint64_t k, uint64_t i);

// One trainer's data for one step.
struct Batch {
  torch::Tensor ids;     // int64 [B, 26], values in [0, rows)
  torch::Tensor dense;   // float32 [B, 13], values in [-1, 1)
  torch::Tensor labels;  // float32 [B], 0 or 1
};

class Workload {
 public:
  // Builds the Zipf CDF (O(rows) time, 8 bytes per row). Errors:
  // INVALID_ARGUMENT naming the field for rows < 26, dim <= 0, batch <= 0 or
  // sizes whose ids or shapes would overflow int64; RESOURCE_EXHAUSTED if the
  // CDF cannot be allocated.
  static absl::StatusOr<Workload> Create(const WorkloadConfig& config);

  // Trainer `trainer`'s batch for step `step` (a fresh tensor each call).
  // REQUIRES: trainer >= 0, step >= 0.
  Batch MakeBatch(int trainer, int64_t step) const;

  // Initial table rows for `ids` (any integer tensor, read flattened):
  // float32 [ids.numel(), dim]. A row depends only on its id.
  torch::Tensor InitRows(const torch::Tensor& ids) const;

  // Linear(26*dim+13 -> 256), ReLU, Linear(256 -> 1) with the defined initial
  // weights and zero biases; every call returns a new, identical module.
  // (Constructing Linear draws from LibTorch's global generator before the
  // weights are overwritten.)
  torch::nn::Sequential MakeTower() const;

  const WorkloadConfig& config() const { return config_; }

 private:
  Workload(const WorkloadConfig& config, std::shared_ptr<const std::vector<double>> cdf);

  // Set at construction, never changed.
  WorkloadConfig config_;
  std::shared_ptr<const std::vector<double>> cdf_;  // CDF[m], m < rows
  uint64_t hidden_key_;                             // Key(seed, HIDDEN, 0, 0)
  std::array<double, kDense> v_;                    // the hidden dense weights
};

}  // namespace baton::examples::ctr

#endif  // BATON_EXAMPLES_CTR_WORKLOAD_H_
