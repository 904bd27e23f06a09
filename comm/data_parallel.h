// DataParallel: one process drives several GPUs of its host, a thread per
// device, as torch.nn.DataParallel does, on LibTorch's
// torch::nn::parallel::data_parallel:
//
//   auto dp = DataParallel<Net>::Create(net, {{torch::Device(torch::kCUDA, 0),
//                                               torch::Device(torch::kCUDA, 1)}}).value();
//   torch::Tensor loss = torch::mse_loss(dp->Forward(x), y);  // x may be on the host
//   loss.backward();                 // gradients land on net's own parameters
//   optimizer.step();                // an optimizer over net->parameters()
//
// Contract:
//  - Create moves the module onto the first device, where its parameters
//    stay (the optimizer steps them there).
//  - Each Forward splits the batch along Options::dim into one chunk per
//    device (fewer where the batch has fewer rows), replicates the module
//    onto each device, runs the replicas on threads, and gathers their
//    outputs on Options::output_device (default: the first device). The
//    replicas' parameters are differentiable copies: backward sums every
//    replica's gradient into the module's own. With one device, Forward is
//    the module's forward on it.
//  - Against DistributedDataParallel (comm/ddp.h): DDP runs one process per
//    device, each with its own model, and all-reduces gradient buckets
//    during backward, overlapping communication; it scales across hosts.
//    DataParallel needs one process and no process group, but copies the
//    parameters to every device in each forward and gathers on one device.
//    Its replica threads run C++ only (torch.nn.DataParallel's hold Python's
//    GIL for their Python code). docs/api.md compares them.
//  - CUDA builds only (CMakeLists.txt): LibTorch's data parallelism is in
//    its CUDA library.
// Errors: Create returns INVALID_ARGUMENT for no devices, a device that is
// not CUDA or that this process does not see, a device listed twice, or a
// module that cannot be replicated onto several devices (it must derive from
// torch::nn::Cloneable). Forward throws baton::Error for a batch with no rows
// along dim; LibTorch's own errors (a shape mismatch) pass through as
// c10::Error.
//
// Thread-safety: one training thread drives a DataParallel object.
#ifndef BATON_COMM_DATA_PARALLEL_H_
#define BATON_COMM_DATA_PARALLEL_H_

#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/nn/parallel/data_parallel.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/status_macros.h"

namespace baton::comm {

struct DataParallelOptions {
  // The GPUs of this process that the replicas run on; the module lives on
  // the first.
  std::vector<torch::Device> devices;
  // Where Forward gathers the outputs (default: the first device).
  std::optional<torch::Device> output_device;
  // The batch dimension that is split.
  int64_t dim = 0;
};

// The checks of Create that do not depend on the module type: devices
// listed, CUDA, seen by this process (`visible` of them), each once.
absl::Status CheckDataParallelOptions(const DataParallelOptions& options, int64_t visible);

template <typename ModuleType>
class DataParallel {
 public:
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(std::shared_ptr<ModuleType> module,
                                                              DataParallelOptions options) {
    if (module == nullptr) return absl::InvalidArgumentError("DataParallel: no module");
    const int64_t visible =
        torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
    RETURN_IF_ERROR(CheckDataParallelOptions(options, visible));
    module->to(options.devices.front());
    if (options.devices.size() > 1) {
      // Replication clones the module: one that cannot be cloned is refused
      // here rather than at the first Forward.
      try {
        (void)module->clone(options.devices.front());
      } catch (const c10::Error& e) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DataParallel: the module cannot be replicated onto ", options.devices.size(),
            " devices (derive it from torch::nn::Cloneable): ", e.what_without_backtrace()));
      }
    }
    return std::unique_ptr<DataParallel>(new DataParallel(std::move(module), std::move(options)));
  }

  torch::Tensor Forward(torch::Tensor input) {
    const int64_t dim = options_.dim < 0 ? options_.dim + input.dim() : options_.dim;
    if (dim < 0 || dim >= input.dim() || input.size(dim) == 0) {
      throw Error(absl::InvalidArgumentError(
          absl::StrCat("DataParallel: the input (sizes ", c10::str(input.sizes()),
                       ") has no rows along dim ", options_.dim, " to split")));
    }
    return torch::nn::parallel::data_parallel(
        module_, std::move(input), options_.devices,
        options_.output_device.value_or(options_.devices.front()), dim);
  }

  ModuleType& module() { return *module_; }
  const DataParallelOptions& options() const { return options_; }

 private:
  DataParallel(std::shared_ptr<ModuleType> module, DataParallelOptions options)
      : module_(std::move(module)), options_(std::move(options)) {}

  std::shared_ptr<ModuleType> module_;
  DataParallelOptions options_;
};

}  // namespace baton::comm

#endif  // BATON_COMM_DATA_PARALLEL_H_
