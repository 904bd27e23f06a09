#include "examples/ctr/workload.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <utility>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// Every float64 step below mirrors one numpy operation of the peer (separate
// multiply and add, no fused multiply-add: BUILD.bazel passes
// -ffp-contract=off), so the results match it bit for bit.

namespace baton::examples::ctr {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr int64_t kIdMult = 2654435761;  // Knuth's multiplicative hash
constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;
// The largest rows for which r * kIdMult + f * (rows / 26) fits in int64.
constexpr int64_t kMaxRows = std::numeric_limits<int64_t>::max() / kIdMult;

absl::Status CheckConfig(const WorkloadConfig& c) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (c.rows < kFields || c.rows > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("WorkloadConfig.rows must be in [", kFields, ", ", kMaxRows,
                     "] (one table row per field at least), got ", c.rows));
  }
  if (c.dim <= 0 || c.dim > (kMax - kDense) / kFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("WorkloadConfig.dim must be positive and small enough for the "
                     "tower's input width 26*dim+13 to fit in int64, got ",
                     c.dim));
  }
  if (c.batch <= 0 || c.batch > kMax / kFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("WorkloadConfig.batch must be positive and batch*26 must fit in "
                     "int64, got ",
                     c.batch));
  }
  return absl::OkStatus();
}

// CDF[m] = c[m] / c[N-1], c[m] = sum_{q<=m} (q+1)^-1.1 summed in order (as
// numpy's cumsum does).
std::vector<double> ZipfCdf(int64_t rows) {
  std::vector<double> cdf(static_cast<size_t>(rows));
  double c = 0.0;
  for (int64_t q = 0; q < rows; ++q) {
    c += std::pow(static_cast<double>(q + 1), -1.1);
    cdf[q] = c;
  }
  const double total = cdf.back();
  for (double& x : cdf) x /= total;
  return cdf;
}

// 2*U - 1, as the peer writes it.
inline double Signed(uint64_t k, uint64_t i) { return 2 * Uniform(k, i) - 1; }

// Writes W[o][i] = float32((2*U(Key(seed, TOWER, layer), o*n + i) - 1) /
// sqrt(n)) into `linear` ([m, n]) and zeroes its bias.
void InitLinear(uint64_t seed, uint64_t layer, torch::nn::Linear& linear) {
  torch::NoGradGuard no_grad;
  torch::Tensor w = linear->weight;
  const int64_t m = w.size(0), n = w.size(1);
  const uint64_t k = Key(seed, kTagTower, layer);
  const double scale = std::sqrt(static_cast<double>(n));
  // The weight is a fresh contiguous CPU float32 parameter.
  float* out = w.data_ptr<float>();
  for (int64_t j = 0; j < m * n; ++j) {
    out[j] = static_cast<float>(Signed(k, static_cast<uint64_t>(j)) / scale);
  }
  linear->bias.zero_();
}

}  // namespace

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t Key(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b) {
  uint64_t h = seed;
  for (uint64_t p : {tag, a, b}) h = Mix64((h ^ p) + kGolden);
  return h;
}

double Uniform(uint64_t k, uint64_t i) {
  return static_cast<double>(Mix64(k + (i + 1) * kGolden) >> 11) * kTwoPowMinus53;
}

absl::StatusOr<Workload> Workload::Create(const WorkloadConfig& config) {
  if (absl::Status s = CheckConfig(config); !s.ok()) return s;
  try {
    auto cdf = std::make_shared<const std::vector<double>>(ZipfCdf(config.rows));
    return Workload(config, std::move(cdf));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Workload::Create: cannot allocate the Zipf CDF for ", config.rows, " rows"));
  }
}

Workload::Workload(const WorkloadConfig& config, std::shared_ptr<const std::vector<double>> cdf)
    : config_(config), cdf_(std::move(cdf)), hidden_key_(Key(config.seed, kTagHidden, 0)) {
  const uint64_t vk = Key(config.seed, kTagHidden, 1);
  for (int j = 0; j < kDense; ++j) v_[j] = Signed(vk, j);
}

Batch Workload::MakeBatch(int trainer, int64_t step) const {
  const int64_t batch = config_.batch, rows = config_.rows;
  const int64_t field_offset = rows / kFields;
  const uint64_t t = static_cast<uint64_t>(trainer);
  const uint64_t k = static_cast<uint64_t>(step);
  const uint64_t ids_key = Key(config_.seed, kTagIds, t, k);
  const uint64_t dense_key = Key(config_.seed, kTagDense, t, k);
  const std::vector<double>& cdf = *cdf_;

  Batch out;
  out.ids = torch::empty({batch, kFields}, torch::kInt64);
  out.dense = torch::empty({batch, kDense}, torch::kFloat32);
  out.labels = torch::empty({batch}, torch::kFloat32);
  int64_t* ids = out.ids.data_ptr<int64_t>();
  float* dense = out.dense.data_ptr<float>();
  float* labels = out.labels.data_ptr<float>();

  for (int64_t i = 0; i < batch; ++i) {
    double z = 0.0;
    for (int f = 0; f < kFields; ++f) {
      const uint64_t n = static_cast<uint64_t>(i * kFields + f);
      // rank = number of m with CDF[m] <= u (numpy searchsorted side=right).
      const int64_t r = std::upper_bound(cdf.begin(), cdf.end(), Uniform(ids_key, n)) - cdf.begin();
      const int64_t id = (r * kIdMult + f * field_offset) % rows;
      ids[n] = id;
      z += Signed(hidden_key_, static_cast<uint64_t>(id));
    }
    for (int j = 0; j < kDense; ++j) {
      const double x = Signed(dense_key, static_cast<uint64_t>(i * kDense + j));
      dense[i * kDense + j] = static_cast<float>(x);
      z += v_[j] * x;
    }
    labels[i] = z > 0 ? 1.0f : 0.0f;
  }
  return out;
}

torch::Tensor Workload::InitRows(const torch::Tensor& ids) const {
  const torch::Tensor flat = ids.to(torch::kCPU, torch::kInt64).contiguous().reshape({-1});
  const int64_t n = flat.numel(), dim = config_.dim;
  torch::Tensor out = torch::empty({n, dim}, torch::kFloat32);
  const int64_t* in = flat.data_ptr<int64_t>();
  float* rows = out.data_ptr<float>();
  const uint64_t k = Key(config_.seed, kTagEmb, 0);
  const uint64_t d_count = static_cast<uint64_t>(dim);
  for (int64_t i = 0; i < n; ++i) {
    // numpy's uint64 arithmetic: id * D + d, mod 2^64.
    const uint64_t base = static_cast<uint64_t>(in[i]) * d_count;
    float* row = rows + i * dim;
    for (uint64_t d = 0; d < d_count; ++d) {
      row[d] = static_cast<float>(0.01 * Signed(k, base + d));
    }
  }
  return out;
}

torch::nn::Sequential Workload::MakeTower() const {
  torch::nn::Linear first(kFields * config_.dim + kDense, kHidden);
  torch::nn::Linear second(kHidden, 1);
  InitLinear(config_.seed, 1, first);
  InitLinear(config_.seed, 2, second);
  return torch::nn::Sequential(first, torch::nn::ReLU(), second);
}

}  // namespace baton::examples::ctr
