#include "ps/internal/rows.h"

#include "ps/sharding.h"

#include <cmath>
#include <cstring>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

namespace baton::ps::internal {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A uniform double in [0, 1) that depends only on (seed, counter).
double Unit(uint64_t seed, uint64_t counter) {
  return static_cast<double>(Mix64(Mix64(seed + kGolden) + (counter + 1) * kGolden) >> 11) *
         (1.0 / 9007199254740992.0);
}

template <typename T>
void FillBuiltIn(const TableSpec& spec, absl::Span<const int64_t> ids, T* out) {
  const int64_t dim = spec.dim;
  const RowInit& init = spec.init;
  for (size_t r = 0; r < ids.size(); ++r) {
    T* row = out + r * dim;
    const uint64_t base = static_cast<uint64_t>(ids[r]) * static_cast<uint64_t>(dim);
    for (int64_t d = 0; d < dim; ++d) {
      switch (init.kind) {
        case RowInit::Kind::kZeros:
        case RowInit::Kind::kCustom: row[d] = 0; break;
        case RowInit::Kind::kUniform:
          row[d] = static_cast<T>(init.scale * (2 * Unit(init.seed, base + d) - 1));
          break;
        case RowInit::Kind::kNormal: {
          // Box-Muller on two independent counters per element.
          const double u1 = 1.0 - Unit(init.seed, 2 * (base + d));
          const double u2 = Unit(init.seed, 2 * (base + d) + 1);
          row[d] =
              static_cast<T>(init.scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
          break;
        }
      }
    }
  }
}

template <typename T>
void UpdateRow(const RowOptimizer& o, int64_t dim, T* p, T* s, const T* g) {
  const T lr = static_cast<T>(o.lr);
  const T eps = static_cast<T>(o.eps);
  switch (o.kind) {
    case RowOptimizerKind::kSGD:
      for (int64_t d = 0; d < dim; ++d) p[d] -= lr * g[d];
      return;
    case RowOptimizerKind::kAdagrad:
      for (int64_t d = 0; d < dim; ++d) {
        s[d] += g[d] * g[d];
        p[d] -= lr * (g[d] / (std::sqrt(s[d]) + eps));
      }
      return;
    case RowOptimizerKind::kRowWiseAdagrad: {
      T sum = 0;
      for (int64_t d = 0; d < dim; ++d) sum += g[d] * g[d];
      s[0] += sum / static_cast<T>(dim);
      const T denom = std::sqrt(s[0]) + eps;
      for (int64_t d = 0; d < dim; ++d) p[d] -= lr * (g[d] / denom);
      return;
    }
    case RowOptimizerKind::kLazyAdam: {
      T* m = s;
      T* v = s + dim;
      T& step = s[2 * dim];
      step += 1;
      const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(step));
      const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(step));
      const T b1 = static_cast<T>(o.beta1), b2 = static_cast<T>(o.beta2);
      const T sqrt_bc2 = static_cast<T>(std::sqrt(bc2));
      const T step_size = static_cast<T>(o.lr / bc1);
      for (int64_t d = 0; d < dim; ++d) {
        m[d] = m[d] * b1 + g[d] * (1 - b1);
        v[d] = v[d] * b2 + g[d] * g[d] * (1 - b2);
        const T denom = std::sqrt(v[d]) / sqrt_bc2 + eps;
        p[d] -= step_size * (m[d] / denom);
      }
      return;
    }
  }
}

}  // namespace

void InitRows(const TableSpec& spec, absl::Span<const int64_t> ids, at::Tensor& out) {
  if (spec.init.kind == RowInit::Kind::kCustom) {
    spec.init.custom(ids, out);
    return;
  }
  if (spec.dtype == c10::ScalarType::Double) {
    FillBuiltIn<double>(spec, ids, out.data_ptr<double>());
  } else {
    FillBuiltIn<float>(spec, ids, out.data_ptr<float>());
  }
}

RowStore::RowStore(const TableSpec& spec, int server, int num_servers)
    : spec_(spec),
      server_(server),
      num_servers_(num_servers),
      dim_(spec.dim),
      state_width_(spec.row_optimizer.StateWidth(spec.dim)),
      element_size_(c10::elementSize(spec.dtype)),
      lazy_(spec.lazy_rows),
      local_rows_(ShardPlan::LocalRows(spec.rows, num_servers, server)) {
  if (lazy_) return;
  const auto opts = at::TensorOptions().dtype(spec.dtype);
  value_blocks_.push_back(at::empty({local_rows_, dim_}, opts));
  state_blocks_.push_back(at::empty({local_rows_, std::max<int64_t>(state_width_, 1)}, opts));
  // Initialize in chunks, so a custom initializer never sees huge batches.
  constexpr int64_t kChunk = 1 << 15;
  std::vector<int64_t> ids;
  for (int64_t start = 0; start < local_rows_; start += kChunk) {
    const int64_t n = std::min(kChunk, local_rows_ - start);
    ids.resize(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = (start + i) * num_servers_ + server_;
    at::Tensor out = value_blocks_[0].narrow(0, start, n);
    InitRows(spec_, ids, out);
  }
  for (int64_t slot = 0; slot < local_rows_; ++slot) {
    InitRowState(spec_.row_optimizer, spec_.dtype, state_width_, State(slot));
  }
}

int64_t RowStore::Find(int64_t id) const {
  if (!lazy_) return ShardPlan::LocalRow(id, num_servers_);
  auto it = slots_.find(id);
  return it == slots_.end() ? -1 : it->second;
}

int64_t RowStore::AllocateSlot() {
  const int64_t slot = static_cast<int64_t>(slot_ids_.size());
  if (slot / kBlockRows >= static_cast<int64_t>(value_blocks_.size())) {
    const auto opts = at::TensorOptions().dtype(spec_.dtype);
    value_blocks_.push_back(at::empty({kBlockRows, dim_}, opts));
    state_blocks_.push_back(at::empty({kBlockRows, std::max<int64_t>(state_width_, 1)}, opts));
  }
  return slot;
}

void RowStore::Create(absl::Span<const int64_t> ids) {
  if (!lazy_) return;
  std::vector<int64_t> missing;
  for (int64_t id : ids) {
    if (slots_.find(id) == slots_.end()) missing.push_back(id);
  }
  if (missing.empty()) return;
  at::Tensor fresh = at::empty({static_cast<int64_t>(missing.size()), dim_},
                               at::TensorOptions().dtype(spec_.dtype));
  InitRows(spec_, missing, fresh);
  const char* src = static_cast<const char*>(fresh.data_ptr());
  const size_t row_bytes = dim_ * element_size_;
  for (size_t i = 0; i < missing.size(); ++i) {
    auto [it, inserted] = slots_.emplace(missing[i], 0);
    if (!inserted) continue;  // a duplicate id within `ids`
    const int64_t slot = AllocateSlot();
    it->second = slot;
    slot_ids_.push_back(missing[i]);
    std::memcpy(Row(slot), src + i * row_bytes, row_bytes);
    InitRowState(spec_.row_optimizer, spec_.dtype, state_width_, State(slot));
  }
}

char* RowStore::Row(int64_t slot) {
  return const_cast<char*>(static_cast<const RowStore*>(this)->Row(slot));
}

const char* RowStore::Row(int64_t slot) const {
  const int64_t block = lazy_ ? slot / kBlockRows : 0;
  const int64_t within = lazy_ ? slot % kBlockRows : slot;
  return static_cast<const char*>(value_blocks_[block].data_ptr()) + within * dim_ * element_size_;
}

char* RowStore::State(int64_t slot) {
  return const_cast<char*>(static_cast<const RowStore*>(this)->State(slot));
}

const char* RowStore::State(int64_t slot) const {
  const int64_t block = lazy_ ? slot / kBlockRows : 0;
  const int64_t within = lazy_ ? slot % kBlockRows : slot;
  return static_cast<const char*>(state_blocks_[block].data_ptr()) +
         within * std::max<int64_t>(state_width_, 1) * element_size_;
}

std::vector<int64_t> RowStore::Ids() const {
  if (lazy_) return slot_ids_;
  std::vector<int64_t> ids(local_rows_);
  for (int64_t i = 0; i < local_rows_; ++i) ids[i] = i * num_servers_ + server_;
  return ids;
}

void RowStore::Clear() {
  if (!lazy_) return;
  slots_.clear();
  slot_ids_.clear();
  value_blocks_.clear();
  state_blocks_.clear();
}

void ApplyRowUpdate(const RowOptimizer& opt, c10::ScalarType dtype, int64_t dim, char* row,
                    char* state, const char* g) {
  if (dtype == c10::ScalarType::Double) {
    UpdateRow<double>(opt, dim, reinterpret_cast<double*>(row), reinterpret_cast<double*>(state),
                      reinterpret_cast<const double*>(g));
  } else {
    UpdateRow<float>(opt, dim, reinterpret_cast<float*>(row), reinterpret_cast<float*>(state),
                     reinterpret_cast<const float*>(g));
  }
}

void InitRowState(const RowOptimizer& opt, c10::ScalarType dtype, int64_t width, char* state) {
  const double v =
      (opt.kind == RowOptimizerKind::kAdagrad || opt.kind == RowOptimizerKind::kRowWiseAdagrad)
          ? opt.initial_accumulator_value
          : 0.0;
  for (int64_t i = 0; i < width; ++i) {
    if (dtype == c10::ScalarType::Double) {
      reinterpret_cast<double*>(state)[i] = v;
    } else {
      reinterpret_cast<float*>(state)[i] = static_cast<float>(v);
    }
  }
}

}  // namespace baton::ps::internal
