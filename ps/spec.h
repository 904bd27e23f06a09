// The declaration of a parameter-server job: its tables, how they are
// updated, and the consistency model.
//
// Contract:
// - A PsSpec is a plain value built by the same code on every server and
//   trainer (as Function handles are shared through a common header). The
//   client sends Fingerprint() when it joins a server, and the server rejects
//   a trainer whose spec differs with FAILED_PRECONDITION naming the first
//   difference it can see (a table's name, kind, shape, dtype or optimizer).
// - Dense tables hold one tensor of any shape and dtype; floating-point ones
//   are trained with one of dist_optim's functional optimizers (LibTorch-exact
//   update rules). Their initial value comes from the first trainer that
//   calls PsClient::InitDense (first writer wins).
// - Embedding tables hold `rows` x `dim` rows of float32 or float64. A row's
//   initial value depends only on its id (RowInit), so rows can be created
//   lazily on first pull and a huge id space costs memory only for the ids
//   seen. They are trained with row-wise sparse optimizers (RowOptimizer)
//   that touch only the pushed rows.
// - ValidateSpec() checks everything a server or client relies on; both call
//   it, so a bad spec fails at Create() with INVALID_ARGUMENT naming the table
//   and the field.
//
// Thread-safety: value types; distinct objects may be used from any thread.
#ifndef BATON_PS_SPEC_H_
#define BATON_PS_SPEC_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "dist_optim/optimizer_options.h"

namespace at {
class Tensor;
}

namespace baton::ps {

enum class TableKind { kDense, kEmbedding };

// Row-wise updates of embedding rows. Each applies only to the rows of one
// push (merged per id), in ascending id order:
//   kSGD             row -= lr * g
//   kAdagrad         element-wise, as torch::optim::Adagrad on those rows
//                    (lr_decay 0): s += g*g; row -= lr * g / (sqrt(s) + eps)
//   kRowWiseAdagrad  one accumulator per row (FBGEMM's and the peer's):
//                    a += mean(g*g); row -= lr * g / (sqrt(a) + eps)
//   kLazyAdam        Adam whose moments and step count are per row and move
//                    only when the row is pushed (torch.optim.SparseAdam's
//                    rule): exactly torch::optim::Adam stepped on that row
//                    alone, once per push that contains it.
enum class RowOptimizerKind { kSGD, kAdagrad, kRowWiseAdagrad, kLazyAdam };

struct RowOptimizer {
  RowOptimizerKind kind = RowOptimizerKind::kSGD;
  double lr = 0.01;
  double eps = 1e-10;  // Adagrad's LibTorch default; Adam uses 1e-8 (LazyAdam()).
  double beta1 = 0.9;
  double beta2 = 0.999;
  double initial_accumulator_value = 0;

  static RowOptimizer SGD(double lr);
  static RowOptimizer Adagrad(double lr);
  static RowOptimizer RowWiseAdagrad(double lr, double eps = 1e-8);
  static RowOptimizer LazyAdam(double lr);
  // Number of optimizer-state scalars kept per row of `dim` elements.
  int64_t StateWidth(int64_t dim) const;
  std::string DebugString() const;
};

// How a row gets its initial value. The built-ins depend only on (seed, id,
// element), through a counter-based hash, never on creation order.
struct RowInit {
  enum class Kind { kZeros, kUniform, kNormal, kCustom };
  Kind kind = Kind::kZeros;
  double scale = 0;  // kUniform: U(-scale, scale); kNormal: N(0, scale^2)
  uint64_t seed = 0;
  // kCustom: fills out (float32 or float64, [ids.size(), dim]) with the rows'
  // initial values. Must be deterministic in the ids and thread-safe. It runs
  // on the server under its shard's lock, as the rows are created: it must
  // not call into the parameter server. It is not part of the fingerprint:
  // name it in `custom_name`.
  std::function<void(absl::Span<const int64_t> ids, at::Tensor& out)> custom;
  std::string custom_name;

  static RowInit Zeros() { return RowInit{}; }
  static RowInit Uniform(double scale, uint64_t seed);
  static RowInit Normal(double stddev, uint64_t seed);
  static RowInit Custom(std::string name,
                        std::function<void(absl::Span<const int64_t>, at::Tensor&)> fn);
};

struct TableSpec {
  std::string name;
  TableKind kind = TableKind::kDense;
  c10::ScalarType dtype = c10::ScalarType::Float;
  // kDense: the tensor's shape.
  std::vector<int64_t> shape;
  dist_optim::OptimizerOptions optimizer = dist_optim::OptimizerOptions::SGD(0.01);
  // kEmbedding.
  int64_t rows = 0;
  int64_t dim = 0;
  bool lazy_rows = true;
  RowInit init;
  RowOptimizer row_optimizer;

  static TableSpec Dense(std::string name, std::vector<int64_t> shape, c10::ScalarType dtype,
                         dist_optim::OptimizerOptions optimizer);
  static TableSpec Embedding(std::string name, int64_t rows, int64_t dim, RowInit init,
                             RowOptimizer optimizer,
                             c10::ScalarType dtype = c10::ScalarType::Float);
  int64_t numel() const;  // dense: product of shape; embedding: rows * dim
};

enum class ConsistencyMode { kSync, kAsync, kBoundedStaleness };

struct Consistency {
  ConsistencyMode mode = ConsistencyMode::kAsync;
  int64_t staleness = 0;  // kBoundedStaleness only

  static Consistency Sync() { return {ConsistencyMode::kSync, 0}; }
  static Consistency Async() { return {ConsistencyMode::kAsync, 0}; }
  // s = 0 is kSync (the same aggregation, not only the same visibility).
  static Consistency BoundedStaleness(int64_t s) {
    return s == 0 ? Sync() : Consistency{ConsistencyMode::kBoundedStaleness, s};
  }
  std::string DebugString() const;
};

// What a server does with a trainer that keeps the others waiting.
enum class StragglerPolicy {
  kDrop,  // drop it from the clock (logged, naming it); it rejoins when back
  kFail,  // fail the waiting calls with DEADLINE_EXCEEDED naming it
};

struct PsSpec {
  std::vector<TableSpec> tables;
  Consistency consistency;
  // Trainers of the job (ids 0..num_trainers-1). All count as live from the
  // start, so the first synchronous clock waits for every one of them (or
  // for trainer_timeout).
  int num_trainers = 1;
  absl::Duration trainer_timeout = absl::Seconds(30);
  StragglerPolicy straggler_policy = StragglerPolicy::kDrop;

  // The table named `name`, or nullptr.
  const TableSpec* Find(const std::string& name) const;
  // A stable text of everything the servers and trainers must agree on.
  std::string Fingerprint() const;
};

// INVALID_ARGUMENT naming the table and the field, e.g. "ps table 'emb':
// dim must be positive (got 0)".
absl::Status ValidateSpec(const PsSpec& spec);

}  // namespace baton::ps

#endif  // BATON_PS_SPEC_H_
