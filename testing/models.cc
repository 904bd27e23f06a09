#include "testing/models.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

namespace baton::testing {

torch::nn::Sequential MakeMlp(const MlpSpec& spec) {
  torch::manual_seed(spec.seed);
  torch::nn::Sequential m;
  int64_t in = spec.inputs;
  for (int i = 0; i < spec.blocks; ++i) {
    m->push_back(torch::nn::Linear(in, spec.width));
    m->push_back(torch::nn::ReLU());
    in = spec.width;
  }
  m->push_back(torch::nn::Linear(in, spec.outputs));
  m->to(spec.dtype);
  return m;
}

}  // namespace baton::testing
