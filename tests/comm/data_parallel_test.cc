// comm/data_parallel.h (CUDA builds, CMakeLists.txt's cm_data_parallel_test):
// the refusals on any machine; Forward and backward against the plain module
// on a GPU, over two devices where the machine has them.
#include "comm/data_parallel.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton::comm {
namespace {

torch::Device Cuda(int i) { return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)); }

TEST(DataParallelOptions, DevicesMustBeListedCudaVisibleAndDistinct) {
  DataParallelOptions o;
  EXPECT_TRUE(absl::StrContains(CheckDataParallelOptions(o, 2).message(), "no devices listed"));
  o.devices = {torch::kCPU};
  EXPECT_TRUE(absl::StrContains(CheckDataParallelOptions(o, 2).message(),
                                "device 0 is cpu, not a CUDA device with an index"));
  o.devices = {Cuda(0), Cuda(2)};
  absl::Status missing = CheckDataParallelOptions(o, 2);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(missing.message(),
                                "device 1 is cuda:2, but this process sees 2 CUDA device(s)"))
      << missing;
  o.devices = {Cuda(1), Cuda(0), Cuda(1)};
  EXPECT_TRUE(absl::StrContains(CheckDataParallelOptions(o, 2).message(),
                                "cuda:1 is listed twice (devices 0 and 2)"));
  o.devices = {Cuda(0), Cuda(1)};
  EXPECT_TRUE(CheckDataParallelOptions(o, 2).ok());
  o.output_device = Cuda(5);
  EXPECT_TRUE(absl::StrContains(CheckDataParallelOptions(o, 2).message(),
                                "the output device cuda:5 is neither"));
  o.output_device = torch::Device(torch::kCPU);
  EXPECT_TRUE(CheckDataParallelOptions(o, 2).ok());
}

TEST(DataParallel, CreateRefusesADeviceThisProcessDoesNotSee) {
  const int64_t gpus = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  auto net = torch::nn::Linear(4, 2);
  auto dp = DataParallel<torch::nn::LinearImpl>::Create(net.ptr(), {{Cuda(gpus)}});
  ASSERT_FALSE(dp.ok());
  EXPECT_TRUE(absl::StrContains(dp.status().message(),
                                absl::StrCat("but this process sees ", gpus, " CUDA device(s)")))
      << dp.status();
}

// The replicas' outputs and the gradients summed into the module's own
// parameters equal one forward and backward of the module on the whole
// batch.
void ExpectSameAsTheModule(const std::vector<torch::Device>& devices) {
  torch::manual_seed(3);
  torch::nn::Sequential plain(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 4));
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(plain->clone());
  plain->to(devices.front());
  auto dp = DataParallel<torch::nn::SequentialImpl>::Create(copy, {devices});
  ASSERT_TRUE(dp.ok()) << dp.status();
  const torch::Tensor x = torch::randn({64, 16});
  const torch::Tensor y = torch::randn({64, 4});
  torch::Tensor want = plain->forward(x.to(devices.front()));
  torch::nn::functional::mse_loss(want, y.to(devices.front())).backward();
  torch::Tensor got = (*dp)->Forward(x);
  EXPECT_EQ(got.device(), devices.front());
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6));
  torch::nn::functional::mse_loss(got, y.to(devices.front())).backward();
  auto a = plain->parameters(), b = (*dp)->module().parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].device(), devices.front()) << i;
    ASSERT_TRUE(b[i].grad().defined()) << i;
    EXPECT_TRUE(torch::allclose(b[i].grad(), a[i].grad(), 1e-4, 1e-6)) << "parameter " << i;
  }
}

TEST(DataParallel, OneGpuMatchesTheModule) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectSameAsTheModule({Cuda(0)});
}

TEST(DataParallel, TwoGpusSplitTheBatchAndSumTheGradients) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "fewer than two CUDA devices";
  ExpectSameAsTheModule({Cuda(0), Cuda(1)});
}

TEST(DataParallel, AnEmptyBatchIsRefused) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto net = torch::nn::Linear(4, 2);
  auto dp = DataParallel<torch::nn::LinearImpl>::Create(net.ptr(), {{Cuda(0)}});
  ASSERT_TRUE(dp.ok()) << dp.status();
  try {
    (void)(*dp)->Forward(torch::zeros({0, 4}));
    FAIL() << "an empty batch was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(absl::StrContains(e.what(), "has no rows along dim 0")) << e.what();
  }
}
}  // namespace
}  // namespace baton::comm
