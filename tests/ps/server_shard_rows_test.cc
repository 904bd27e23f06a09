// The parameter server's row tables, checkpoints and spec validation, in
// one process: ServerShard objects driven directly through shard_cluster.h's
// Cluster. Tests are named after the guarantees of ps/server_shard.h (PS8).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/match.h"
#include "ps/server.h"
#include "ps/server_shard.h"
#include "ps/sharding.h"
#include "tests/ps/shard_cluster.h"

namespace baton::ps {
namespace {

using dist_optim::OptimizerOptions;
using testing::Cluster;
using testing::ExpectClose;
using testing::LinearSpec;

// A row optimizer against a dense LibTorch reference on the same rows.
TEST(PsRowOptimizers, EachMatchesItsDenseReferenceOnThePushedRows) {
  for (RowOptimizer opt : {RowOptimizer::SGD(0.1), RowOptimizer::Adagrad(0.1),
                           RowOptimizer::RowWiseAdagrad(0.1), RowOptimizer::LazyAdam(0.05)}) {
    SCOPED_TRACE(opt.DebugString());
    PsSpec spec;
    spec.tables = {TableSpec::Embedding("emb", 6, 4, RowInit::Uniform(1, 3), opt, torch::kFloat64)};
    spec.num_trainers = 1;
    Cluster cluster(spec, 2);
    at::Tensor all = torch::arange(0, 6, torch::kLong);
    at::Tensor init = cluster.PullRows(0, 0, 0, all).value();
    // Per-row reference parameters and optimizers.
    std::vector<torch::Tensor> ref;
    std::vector<std::unique_ptr<torch::optim::Optimizer>> ref_opt;
    std::vector<torch::Tensor> rowwise_acc;
    for (int r = 0; r < 6; ++r) {
      ref.push_back(init[r].clone().requires_grad_(true));
      rowwise_acc.push_back(torch::zeros({}, torch::kFloat64));
      switch (opt.kind) {
        case RowOptimizerKind::kSGD:
        case RowOptimizerKind::kRowWiseAdagrad:
          ref_opt.push_back(std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{ref[r]},
                                                                torch::optim::SGDOptions(opt.lr)));
          break;
        case RowOptimizerKind::kAdagrad:
          ref_opt.push_back(std::make_unique<torch::optim::Adagrad>(
              std::vector<torch::Tensor>{ref[r]},
              torch::optim::AdagradOptions(opt.lr).eps(opt.eps)));
          break;
        case RowOptimizerKind::kLazyAdam:
          ref_opt.push_back(std::make_unique<torch::optim::Adam>(
              std::vector<torch::Tensor>{ref[r]}, torch::optim::AdamOptions(opt.lr).eps(opt.eps)));
          break;
      }
    }
    torch::manual_seed(9);
    const std::vector<std::vector<int64_t>> pushes = {{1, 3}, {3, 4, 3}, {0, 5}, {1}, {3, 1}};
    int64_t clock = 0;
    for (const auto& ids : pushes) {
      at::Tensor id_t = torch::tensor(ids, torch::kLong);
      at::Tensor g = torch::randn({static_cast<int64_t>(ids.size()), 4}, torch::kFloat64);
      ASSERT_TRUE(cluster.Push(0, clock++, 0, g, id_t).ok());
      // Reference: merge duplicates, then step each pushed row alone.
      std::map<int64_t, torch::Tensor> merged;
      for (size_t k = 0; k < ids.size(); ++k) {
        merged[ids[k]] = merged.count(ids[k]) ? merged[ids[k]] + g[k] : g[k].clone();
      }
      for (auto& [r, gr] : merged) {
        if (opt.kind == RowOptimizerKind::kRowWiseAdagrad) {
          rowwise_acc[r] += gr.pow(2).mean();
          torch::NoGradGuard ng;
          ref[r] -= opt.lr * gr / (rowwise_acc[r].sqrt() + opt.eps);
          continue;
        }
        ref[r].mutable_grad() = gr;
        ref_opt[r]->step();
      }
    }
    at::Tensor got = cluster.PullRows(0, clock, 0, all).value();
    for (int r = 0; r < 6; ++r) ExpectClose(got[r], ref[r].detach(), 1e-12);
  }
}

TEST(PsRows, LazyRowsCostOnlyTheIdsSeenAndDoNotDependOnServers) {
  PsSpec spec;
  spec.tables = {TableSpec::Embedding("emb", 10'000'000, 16, RowInit::Normal(0.1, 4),
                                      RowOptimizer::Adagrad(0.1))};
  spec.num_trainers = 1;
  at::Tensor ids = torch::randint(0, 10'000'000, {1000}, torch::kLong);
  ids = std::get<0>(at::_unique2(ids, true));
  Cluster one(spec, 1), three(spec, 3);
  at::Tensor a = one.PullRows(0, 0, 0, ids).value();
  at::Tensor b = three.PullRows(0, 0, 0, ids).value();
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_NEAR(a.std().item<double>(), 0.1, 0.01);
  EXPECT_EQ(one.shard(0).Stats().tables[0].rows, ids.numel());
  int64_t rows = 0;
  for (int s = 0; s < 3; ++s) rows += three.shard(s).Stats().tables[0].rows;
  EXPECT_EQ(rows, ids.numel());
}

TEST(PsGuarantees, PS8_CheckpointRestoresParametersOptimizerStateAndClocks) {
  PsSpec spec;
  spec.tables = {
      TableSpec::Dense("w", {200}, torch::kFloat32, OptimizerOptions::Adam(0.01)),
      TableSpec::Embedding("emb", 1000, 8, RowInit::Uniform(0.1, 1), RowOptimizer::LazyAdam(0.01))};
  spec.consistency = Consistency::Sync();
  spec.num_trainers = 1;
  Cluster a(spec, 2), b(spec, 2);
  a.InitDense(0, torch::randn({200}));
  for (int c = 0; c < 3; ++c) {
    at::Tensor ids = torch::tensor({c, 10 + c, 500}, torch::kLong);
    ASSERT_TRUE(a.PullRows(0, c, 1, ids).ok());
    ASSERT_TRUE(a.Push(0, c, 1, torch::randn({3, 8}), ids, false).ok());
    ASSERT_TRUE(a.Push(0, c, 0, torch::randn({200})).ok());
  }
  for (int s = 0; s < 2; ++s) {
    const std::string bytes = a.shard(s).Serialize().value();
    ASSERT_TRUE(b.shard(s).Restore(bytes).ok());
    EXPECT_EQ(b.shard(s).Serialize().value(), bytes);
    EXPECT_EQ(b.shard(s).Stats().applied_clock, 3);
    // Corrupt or foreign bytes change nothing.
    EXPECT_EQ(b.shard(s).Restore(bytes.substr(0, bytes.size() - 3)).code(),
              absl::StatusCode::kDataLoss);
    EXPECT_EQ(b.shard(s).Restore("garbage").code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(b.shard(1 - s).Restore(bytes).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(b.shard(s).Serialize().value(), bytes);
  }
  // The restored shards train on identically (optimizer state included).
  for (Cluster* c : {&a, &b}) {
    at::Tensor ids = torch::tensor({2, 500}, torch::kLong);
    torch::manual_seed(1);
    ASSERT_TRUE(c->Push(0, 3, 1, torch::randn({2, 8}), ids, false).ok());
    ASSERT_TRUE(c->Push(0, 3, 0, torch::randn({200})).ok());
  }
  EXPECT_TRUE(torch::equal(a.PullDense(0, 4, 0).value(), b.PullDense(0, 4, 0).value()));
  at::Tensor ids = torch::tensor({0, 2, 12, 500}, torch::kLong);
  EXPECT_TRUE(torch::equal(a.PullRows(0, 4, 1, ids).value(), b.PullRows(0, 4, 1, ids).value()));
}

TEST(PsServerCheckpoints, PS8_AtomicFilesNewestValidOneIsLoaded) {
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
      "/ps_ckpt_test";
  ASSERT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  PsSpec spec = LinearSpec(torch::kFloat32, OptimizerOptions::SGD(1), Consistency::Async(), 1);
  ServerOptions o;
  o.checkpoint_dir = dir;
  o.log = [](const std::string&) {};
  rpc::FunctionRegistry registry;
  auto server = PsServer::Create(spec, o, registry).value();
  EXPECT_EQ(server->restored_clock(), -1);
  ServerShard& s = server->shard();
  ASSERT_TRUE(s.InitDense(0, {{"w", {}, torch::zeros({2100})}, {"b", {}, torch::zeros({7})}}).ok());
  ASSERT_TRUE(s.Push(0, 0, true, {{"w", {}, torch::ones({2100})}}).ok());
  const std::string first = server->CheckpointNow().value();
  ASSERT_TRUE(s.Push(0, 1, true, {{"w", {}, torch::ones({2100})}}).ok());
  const std::string second = server->CheckpointNow().value();
  EXPECT_NE(first, second);
  ASSERT_TRUE(server->Stop(/*final_checkpoint=*/false).ok());
  server.reset();

  // A new server (a restart) loads the newest: w = -2.
  rpc::FunctionRegistry r2;
  auto restarted = PsServer::Create(spec, o, r2).value();
  EXPECT_EQ(restarted->restored_clock(), 2);
  EXPECT_EQ(restarted->shard().Peek("w", {}).value()[0].item<float>(), -2.0f);
  restarted.reset();

  // A corrupt newest file is skipped: the older one (w = -1) is loaded.
  {
    FILE* f = std::fopen(second.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 100, SEEK_SET);
    std::fputc(0x5a, f);
    std::fclose(f);
  }
  rpc::FunctionRegistry r3;
  auto fallback = PsServer::Create(spec, o, r3).value();
  EXPECT_EQ(fallback->restored_clock(), 1);
  EXPECT_EQ(fallback->shard().Peek("w", {}).value()[0].item<float>(), -1.0f);
}

TEST(PsSpecValidation, BadSpecsNameTheTableAndField) {
  PsSpec spec;
  spec.tables = {TableSpec::Embedding("emb", 10, 0, RowInit::Zeros(), RowOptimizer::SGD(1))};
  auto s = ValidateSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "ps table 'emb': dim must be positive (got 0)")) << s;
  spec.tables = {TableSpec::Dense("a", {2}, torch::kFloat32, OptimizerOptions::SGD(-1))};
  EXPECT_TRUE(absl::StrContains(ValidateSpec(spec).message(), "ps table 'a'"));
  spec.tables = {TableSpec::Dense("a", {2}, torch::kFloat32, OptimizerOptions::SGD(1)),
                 TableSpec::Dense("a", {3}, torch::kFloat32, OptimizerOptions::SGD(1))};
  EXPECT_TRUE(absl::StrContains(ValidateSpec(spec).message(), "ps table 'a': declared twice"));
}

}  // namespace
}  // namespace baton::ps
