#include "ps/spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton::ps {

RowOptimizer RowOptimizer::SGD(double lr) {
  RowOptimizer o;
  o.kind = RowOptimizerKind::kSGD;
  o.lr = lr;
  return o;
}

RowOptimizer RowOptimizer::Adagrad(double lr) {
  RowOptimizer o;
  o.kind = RowOptimizerKind::kAdagrad;
  o.lr = lr;
  o.eps = 1e-10;
  return o;
}

RowOptimizer RowOptimizer::RowWiseAdagrad(double lr, double eps) {
  RowOptimizer o;
  o.kind = RowOptimizerKind::kRowWiseAdagrad;
  o.lr = lr;
  o.eps = eps;
  return o;
}

RowOptimizer RowOptimizer::LazyAdam(double lr) {
  RowOptimizer o;
  o.kind = RowOptimizerKind::kLazyAdam;
  o.lr = lr;
  o.eps = 1e-8;
  return o;
}

int64_t RowOptimizer::StateWidth(int64_t dim) const {
  switch (kind) {
    case RowOptimizerKind::kSGD: return 0;
    case RowOptimizerKind::kAdagrad: return dim;
    case RowOptimizerKind::kRowWiseAdagrad: return 1;
    case RowOptimizerKind::kLazyAdam: return 2 * dim + 1;  // exp_avg, exp_avg_sq, step
  }
  return 0;
}

std::string RowOptimizer::DebugString() const {
  switch (kind) {
    case RowOptimizerKind::kSGD: return absl::StrCat("SGD{lr=", lr, "}");
    case RowOptimizerKind::kAdagrad:
      return absl::StrCat("Adagrad{lr=", lr, ", eps=", eps,
                          ", initial_accumulator_value=", initial_accumulator_value, "}");
    case RowOptimizerKind::kRowWiseAdagrad:
      return absl::StrCat("RowWiseAdagrad{lr=", lr, ", eps=", eps,
                          ", initial_accumulator_value=", initial_accumulator_value, "}");
    case RowOptimizerKind::kLazyAdam:
      return absl::StrCat("LazyAdam{lr=", lr, ", beta1=", beta1, ", beta2=", beta2, ", eps=", eps,
                          "}");
  }
  return "Unknown";
}

RowInit RowInit::Uniform(double scale, uint64_t seed) {
  RowInit r;
  r.kind = Kind::kUniform;
  r.scale = scale;
  r.seed = seed;
  return r;
}

RowInit RowInit::Normal(double stddev, uint64_t seed) {
  RowInit r;
  r.kind = Kind::kNormal;
  r.scale = stddev;
  r.seed = seed;
  return r;
}

RowInit RowInit::Custom(std::string name,
                        std::function<void(absl::Span<const int64_t>, at::Tensor&)> fn) {
  RowInit r;
  r.kind = Kind::kCustom;
  r.custom = std::move(fn);
  r.custom_name = std::move(name);
  return r;
}

TableSpec TableSpec::Dense(std::string name, std::vector<int64_t> shape, c10::ScalarType dtype,
                           dist_optim::OptimizerOptions optimizer) {
  TableSpec t;
  t.name = std::move(name);
  t.kind = TableKind::kDense;
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.optimizer = optimizer;
  return t;
}

TableSpec TableSpec::Embedding(std::string name, int64_t rows, int64_t dim, RowInit init,
                               RowOptimizer optimizer, c10::ScalarType dtype) {
  TableSpec t;
  t.name = std::move(name);
  t.kind = TableKind::kEmbedding;
  t.rows = rows;
  t.dim = dim;
  t.init = std::move(init);
  t.row_optimizer = optimizer;
  t.dtype = dtype;
  return t;
}

int64_t TableSpec::numel() const {
  if (kind == TableKind::kEmbedding) return rows * dim;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Consistency::DebugString() const {
  switch (mode) {
    case ConsistencyMode::kSync: return "sync";
    case ConsistencyMode::kAsync: return "async";
    case ConsistencyMode::kBoundedStaleness:
      return absl::StrCat("bounded_staleness(", staleness, ")");
  }
  return "unknown";
}

const TableSpec* PsSpec::Find(const std::string& name) const {
  for (const auto& t : tables) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

std::string InitText(const RowInit& init) {
  switch (init.kind) {
    case RowInit::Kind::kZeros: return "zeros";
    case RowInit::Kind::kUniform: return absl::StrCat("uniform(", init.scale, ",", init.seed, ")");
    case RowInit::Kind::kNormal: return absl::StrCat("normal(", init.scale, ",", init.seed, ")");
    case RowInit::Kind::kCustom: return absl::StrCat("custom(", init.custom_name, ")");
  }
  return "?";
}

}  // namespace

std::string PsSpec::Fingerprint() const {
  std::vector<std::string> parts;
  parts.push_back(
      absl::StrCat("consistency=", consistency.DebugString(), ";trainers=", num_trainers));
  for (const auto& t : tables) {
    if (t.kind == TableKind::kDense) {
      parts.push_back(absl::StrCat("dense ", t.name, " ", c10::toString(t.dtype), "[",
                                   absl::StrJoin(t.shape, ","), "] ", t.optimizer.DebugString()));
    } else {
      parts.push_back(absl::StrCat("embedding ", t.name, " ", c10::toString(t.dtype), "[", t.rows,
                                   "x", t.dim, "] lazy=", t.lazy_rows, " ", InitText(t.init), " ",
                                   t.row_optimizer.DebugString()));
    }
  }
  return absl::StrJoin(parts, "\n");
}

absl::Status ValidateSpec(const PsSpec& spec) {
  if (spec.num_trainers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps spec: num_trainers must be positive (got ", spec.num_trainers, ")"));
  }
  if (spec.consistency.mode == ConsistencyMode::kBoundedStaleness &&
      spec.consistency.staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps spec: staleness must be >= 0 (got ", spec.consistency.staleness, ")"));
  }
  if (spec.trainer_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ps spec: trainer_timeout must be positive");
  }
  if (spec.tables.empty()) return absl::InvalidArgumentError("ps spec: no tables");
  for (size_t i = 0; i < spec.tables.size(); ++i) {
    const TableSpec& t = spec.tables[i];
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("ps table '", t.name, "': ", what));
    };
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("ps spec: table #", i, " has no name"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (spec.tables[j].name == t.name) return bad("declared twice");
    }
    if (t.kind == TableKind::kDense) {
      for (int64_t d : t.shape) {
        if (d < 0) return bad(absl::StrCat("negative dimension ", d, " in its shape"));
      }
      if (c10::isFloatingType(t.dtype)) {
        if (absl::Status s = dist_optim::ValidateOptions(t.optimizer); !s.ok()) {
          return bad(std::string(s.message()));
        }
      }
    } else {
      if (t.rows <= 0) return bad(absl::StrCat("rows must be positive (got ", t.rows, ")"));
      if (t.dim <= 0) return bad(absl::StrCat("dim must be positive (got ", t.dim, ")"));
      if (t.dtype != c10::ScalarType::Float && t.dtype != c10::ScalarType::Double) {
        return bad(absl::StrCat("embedding rows must be float32 or float64 (got ",
                                c10::toString(t.dtype), ")"));
      }
      const RowOptimizer& o = t.row_optimizer;
      if (!(o.lr >= 0) || !std::isfinite(o.lr)) {
        return bad(absl::StrCat("row optimizer lr must be finite and >= 0 (got ", o.lr, ")"));
      }
      if (!(o.eps >= 0) || !std::isfinite(o.eps)) {
        return bad(absl::StrCat("row optimizer eps must be finite and >= 0 (got ", o.eps, ")"));
      }
      if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) {
        return bad(absl::StrCat("row optimizer betas must be in [0, 1) (got ", o.beta1, ", ",
                                o.beta2, ")"));
      }
      if (t.init.kind == RowInit::Kind::kCustom && !t.init.custom) {
        return bad("custom row initializer without a function");
      }
      if (!t.lazy_rows && t.rows * t.dim > (int64_t{1} << 34)) {
        return bad("too large for eager rows: use lazy_rows");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::ps
