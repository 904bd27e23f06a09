// The examples' --device flag: where a process computes (cpu, cuda,
// cuda:N).
//
// ParseDeviceFlag returns INVALID_ARGUMENT naming the flag for a name
// LibTorch does not parse, a device that is neither the CPU nor a CUDA
// device, or a CUDA device this process cannot use (a CPU-only LibTorch sees
// none), e.g. "--device: 'cuda', but this process sees 0 CUDA device(s)".
//
// Thread-safety: a pure function.
#ifndef BATON_EXAMPLES_DEVICE_FLAG_H_
#define BATON_EXAMPLES_DEVICE_FLAG_H_

#include <torch/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace baton::examples {

absl::StatusOr<torch::Device> ParseDeviceFlag(const std::string& name);

}  // namespace baton::examples

#endif  // BATON_EXAMPLES_DEVICE_FLAG_H_
