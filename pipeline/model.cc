#include "pipeline/model.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton::pipeline {

std::string Split::DebugString() const {
  switch (kind) {
    case Kind::kLayers: return absl::StrCat("Layers(", absl::StrJoin(cuts, ","), ")");
    case Kind::kEachLayer: return "EachLayer";
    case Kind::kParameters: return "ByParameters";
    case Kind::kForwardTime: return "ByForwardTime";
  }
  return "?";
}

std::vector<int> BalancedCuts(const std::vector<double>& costs, int parts) {
  const int n = static_cast<int>(costs.size());
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest largest-slice sum of layers [0, i) in k slices.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> from(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k) {
    for (int i = k; i <= n - (parts - k); ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {  // strict: ties keep the earliest cut
          best[k][i] = v;
          from[k][i] = j;
        }
      }
    }
  }
  std::vector<int> cuts(parts + 1, 0);
  cuts[parts] = n;
  for (int k = parts; k > 0; --k) cuts[k - 1] = from[k][cuts[k]];
  return cuts;
}

torch::nn::Sequential Slice(const torch::nn::SequentialImpl& model, int begin, int end) {
  torch::nn::Sequential out;
  auto it = model.begin();
  for (int i = 0; i < end; ++i, ++it) {
    if (i >= begin) out->push_back(*it);
  }
  return out;
}

absl::StatusOr<std::vector<int>> ComputeCuts(const torch::nn::SequentialImpl& model, int stages,
                                             const Split& split) {
  const int layers = static_cast<int>(model.size());
  if (stages < 1 || layers < stages) {
    return absl::InvalidArgumentError(absl::StrCat("split ", split.DebugString(), ": ", stages,
                                                   " stages need at least as many layers; the "
                                                   "model has ",
                                                   layers));
  }
  switch (split.kind) {
    case Split::Kind::kLayers: {
      const auto& c = split.cuts;
      bool ok = static_cast<int>(c.size()) == stages + 1 && c.front() == 0 && c.back() == layers;
      for (size_t i = 1; ok && i < c.size(); ++i) ok = c[i] > c[i - 1];
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            "split Layers(", absl::StrJoin(c, ","), "): need ", stages + 1,
            " strictly increasing cut points from 0 to ", layers, " (the model's layers)"));
      }
      return c;
    }
    case Split::Kind::kEachLayer: {
      if (layers != stages) {
        return absl::InvalidArgumentError(absl::StrCat("split EachLayer: the model has ", layers,
                                                       " layers for ", stages, " stages"));
      }
      std::vector<int> c(stages + 1);
      for (int i = 0; i <= stages; ++i) c[i] = i;
      return c;
    }
    case Split::Kind::kParameters: {
      std::vector<double> costs;
      for (int i = 0; i < layers; ++i) {
        double n = 0;
        for (const auto& p : model.ptr(i)->parameters()) n += static_cast<double>(p.numel());
        costs.push_back(n);
      }
      return BalancedCuts(costs, stages);
    }
    case Split::Kind::kForwardTime: {
      if (!split.sample.defined()) {
        return absl::InvalidArgumentError("split ByForwardTime: no sample input");
      }
      torch::NoGradGuard no_grad;
      std::vector<double> costs;
      torch::Tensor x = split.sample;
      // Running a layer does not change the Sequential's structure.
      auto& layers_of = const_cast<torch::nn::SequentialImpl&>(model);
      auto it = layers_of.begin();
      for (int i = 0; i < layers; ++i, ++it) {
        constexpr int kRuns = 5;
        std::vector<double> runs;
        torch::Tensor y;
        try {
          for (int r = 0; r < kRuns; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            y = it->forward(x);
            runs.push_back(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
        } catch (const std::exception& e) {
          return absl::InvalidArgumentError(
              absl::StrCat("split ByForwardTime: layer ", i, " fails on the sample: ", e.what()));
        }
        std::sort(runs.begin(), runs.end());
        costs.push_back(runs[kRuns / 2]);
        x = y;
      }
      return BalancedCuts(costs, stages);
    }
  }
  return absl::InvalidArgumentError("unknown split kind");
}

}  // namespace baton::pipeline
