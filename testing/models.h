// MakeMlp: the small multi-layer perceptrons that tests and benchmarks train
// (pipeline splits, stage runners, their benchmark).
//
// Contract: `blocks` times Linear(in -> width) + ReLU (in is `inputs` for
// the first block, `width` after), then Linear(width -> outputs); weights
// drawn after torch::manual_seed(seed), so equal specs give equal models;
// parameters in `dtype`.
//
// Thread-safety: seeds LibTorch's global generator; call from one thread at
// a time.
#ifndef BATON_TESTING_MODELS_H_
#define BATON_TESTING_MODELS_H_

#include <cstdint>

#include <torch/nn/modules/container/sequential.h>

namespace baton::testing {

struct MlpSpec {
  int64_t inputs = 8;
  int64_t width = 16;
  int blocks = 4;
  int64_t outputs = 4;
  uint64_t seed = 0;
  torch::Dtype dtype = torch::kFloat32;
};

torch::nn::Sequential MakeMlp(const MlpSpec& spec);

}  // namespace baton::testing

#endif  // BATON_TESTING_MODELS_H_
