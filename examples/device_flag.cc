#include "examples/device_flag.h"

#include <torch/cuda.h>

#include "absl/strings/str_cat.h"

namespace baton::examples {

absl::StatusOr<torch::Device> ParseDeviceFlag(const std::string& name) {
  try {
    torch::Device d(name);
    if (d.is_cpu()) return d;
    if (!d.is_cuda()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: '", name, "' is neither cpu nor a CUDA device"));
    }
    const int64_t n = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
    if (d.has_index() ? d.index() >= n : n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: '", name, "', but this process sees ", n,
                       " CUDA device(s) (a CPU-only LibTorch sees none)"));
    }
    return d;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", name, "' is not a device name: ", e.what_without_backtrace()));
  }
}

}  // namespace baton::examples
