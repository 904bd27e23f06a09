#include "comm/data_parallel.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace baton::comm {

absl::Status CheckDataParallelOptions(const DataParallelOptions& options, int64_t visible) {
  if (options.devices.empty()) {
    return absl::InvalidArgumentError("DataParallel: no devices listed");
  }
  for (size_t i = 0; i < options.devices.size(); ++i) {
    const torch::Device& d = options.devices[i];
    if (!d.is_cuda() || !d.has_index()) {
      return absl::InvalidArgumentError(absl::StrCat("DataParallel: device ", i, " is ", d.str(),
                                                     ", not a CUDA device with an index"));
    }
    if (d.index() >= visible) {
      return absl::InvalidArgumentError(absl::StrCat("DataParallel: device ", i, " is ", d.str(),
                                                     ", but this process sees ", visible,
                                                     " CUDA device(s)"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (options.devices[j] == d) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DataParallel: ", d.str(), " is listed twice (devices ", j, " and ", i, ")"));
      }
    }
  }
  if (options.output_device.has_value() && !options.output_device->is_cpu() &&
      !(options.output_device->is_cuda() && options.output_device->has_index() &&
        options.output_device->index() < visible)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DataParallel: the output device ", options.output_device->str(),
                     " is neither the host nor a CUDA device this process sees"));
  }
  return absl::OkStatus();
}

}  // namespace baton::comm
