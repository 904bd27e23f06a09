#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include "absl/status/status.h"
TEST(Smoke, Links) {
  at::Tensor t = at::ones({2, 2});
  EXPECT_EQ(t.sum().item<float>(), 4.0f);
  EXPECT_TRUE(absl::OkStatus().ok());
  grpc::ServerBuilder b;
}
