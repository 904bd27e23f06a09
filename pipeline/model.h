// How a model becomes pipeline stages: a torch::nn::Sequential cut into
// consecutive slices, one per (virtual) stage.
//
//   auto cuts = pipeline::ComputeCuts(*model, /*stages=*/4, pipeline::Split::ByParameters());
//   torch::nn::Sequential stage2 = pipeline::Slice(*model, (*cuts)[2], (*cuts)[3]);
//
// A model given as a list of stage modules is a Sequential whose elements are
// those modules, with Split::EachLayer() (element k is stage k).
//
// Splits (cuts[s]..cuts[s+1] are the layers of stage s; cuts[0] = 0 and
// cuts[stages] = the number of layers; every stage gets at least one layer):
// - Layers(cuts): the caller's cut points, checked.
// - EachLayer(): one layer per stage; REQUIRES layers == stages.
// - ByParameters(): contiguous slices that minimise the largest stage's
//   parameter count (ties go to the earliest cut). Deterministic, so every
//   process that builds the same model computes the same cuts.
// - ByForwardTime(sample): the same with each layer's measured forward time
//   on `sample` (median of a few runs) as its cost. Timing is not
//   reproducible, so one process (the pipeline's driver) computes the cuts and
//   sends them to the stages.
//
// Errors: INVALID_ARGUMENT naming the split and the offending value (fewer
// layers than stages, cuts not increasing, a layer that fails on the sample).
//
// Thread-safety: pure functions of their arguments; ByForwardTime runs the
// model's forward, so the model must not be used concurrently meanwhile.
#ifndef BATON_PIPELINE_MODEL_H_
#define BATON_PIPELINE_MODEL_H_

#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::pipeline {

// Builds the whole model; must give the same architecture and initial
// values in every process (seed it). The pipeline's driver builds it to
// compute the split, each stage worker to keep its slices.
using ModelFactory = std::function<torch::nn::Sequential()>;

struct Split {
  enum class Kind { kLayers, kEachLayer, kParameters, kForwardTime };
  Kind kind = Kind::kParameters;
  std::vector<int> cuts;  // kLayers
  torch::Tensor sample;   // kForwardTime: one micro-batch of input

  static Split Layers(std::vector<int> cuts) { return {Kind::kLayers, std::move(cuts), {}}; }
  static Split EachLayer() { return {Kind::kEachLayer, {}, {}}; }
  static Split ByParameters() { return {Kind::kParameters, {}, {}}; }
  static Split ByForwardTime(torch::Tensor sample) {
    return {Kind::kForwardTime, {}, std::move(sample)};
  }
  std::string DebugString() const;
};

// stages + 1 cut points (see the header comment).
absl::StatusOr<std::vector<int>> ComputeCuts(const torch::nn::SequentialImpl& model, int stages,
                                             const Split& split);

// The contiguous partition of `costs` into `parts` non-empty slices whose
// largest sum is smallest; returns parts + 1 cut points. REQUIRES
// 1 <= parts <= costs.size(), costs >= 0.
std::vector<int> BalancedCuts(const std::vector<double>& costs, int parts);

// Layers [begin, end) of `model` as a new Sequential sharing their modules
// (and so their parameters). REQUIRES 0 <= begin < end <= model.size().
torch::nn::Sequential Slice(const torch::nn::SequentialImpl& model, int begin, int end);

}  // namespace baton::pipeline

#endif  // BATON_PIPELINE_MODEL_H_
