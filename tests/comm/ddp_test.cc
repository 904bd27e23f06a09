// DDP: on 2 and 3 processes it must end with exactly the parameters of
// single-process training on the concatenated batch; no_sync accumulation;
// unused parameters; the external gradient source (DDP+RPC hybrid hook); and
// the distributed sampler.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "base/status.h"
#include "comm/ddp.h"
#include "comm/sampler.h"
#include "testing/multiprocess.h"
#include "tests/comm/comm_test_util.h"

namespace baton::comm::testing {
namespace {

using ::baton::testing::Describe;
using ::baton::testing::RunWorkers;
using ::baton::testing::WorkerResult;

constexpr int kBatch = 4;  // per rank

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    fc3 = register_module("fc3", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_fc3) {
    torch::Tensor h = fc2->forward(torch::relu(fc1->forward(x)));
    return use_fc3 ? fc3->forward(h) : h;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

std::shared_ptr<Net> MakeNet(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_shared<Net>();
}

// Batch k of the whole job (world * kBatch rows), identical on every rank,
// on `device`.
std::pair<torch::Tensor, torch::Tensor> Batch(int k, int world, at::Device device = at::kCPU) {
  torch::manual_seed(1000 + k);
  return {torch::randn({world * kBatch, 8}).to(device),
          torch::randn({world * kBatch, 4}).to(device)};
}

torch::Tensor Shard(const torch::Tensor& t, int rank) { return t.narrow(0, rank * kBatch, kBatch); }

double MaxDiff(Net& a, Net& b) {
  double worst = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

// Trains a DDP model and a single-process reference side by side, on the
// backend's device (a GPU for NCCL).
void TrainAndCompare(const Worker& w, bool use_fc3, bool find_unused) {
  ProcessGroup pg = w.MakeGroup();
  // Different initial weights on every rank: DDP must broadcast rank 0's.
  std::shared_ptr<Net> model = MakeNet(100 + w.rank);
  std::shared_ptr<Net> ref = MakeNet(100);
  model->to(w.device());
  ref->to(w.device());
  DdpOptions options;
  options.bucket_cap_bytes = 300;  // several buckets
  options.find_unused_parameters = find_unused;
  auto ddp = DistributedDataParallel::Create(model, pg, options);
  WCHECK_OK(ddp.status());
  WCHECK((*ddp)->bucket_layout().size() > 2);
  WCHECK(MaxDiff(*model, *ref) == 0);
  torch::optim::SGD opt(model->parameters(), 0.1);
  torch::optim::SGD ref_opt(ref->parameters(), 0.1);
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = Batch(step, w.world, w.device());
    opt.zero_grad();
    ref_opt.zero_grad();
    if (step == 2) {
      // Gradient accumulation: the first micro-batch under no_sync.
      auto [x2, y2] = Batch(50 + step, w.world, w.device());
      {
        auto guard = (*ddp)->NoSync();
        torch::mse_loss(model->forward(Shard(x2, w.rank), use_fc3), Shard(y2, w.rank)).backward();
      }
      torch::mse_loss(ref->forward(x2, use_fc3), y2).backward();
    }
    torch::mse_loss(model->forward(Shard(x, w.rank), use_fc3), Shard(y, w.rank)).backward();
    torch::mse_loss(ref->forward(x, use_fc3), y).backward();
    opt.step();
    ref_opt.step();
  }
  const double diff = MaxDiff(*model, *ref);
  // One rank averages over itself: the same bits as plain training.
  const double tolerance = w.world == 1 ? 0 : 1e-5;
  if (!(diff <= tolerance)) {
    std::fprintf(stderr, "parameters differ from single-process training by %g\n", diff);
    ::baton::testing::ExitWorker(1);
  }
}

BATON_SCENARIO(ddp_matches_single_process) {
  Worker w = StartWorker();
  TrainAndCompare(w, /*use_fc3=*/true, /*find_unused=*/false);
  w.Finish();
  return 0;
}

BATON_SCENARIO(ddp_unused_parameters) {
  Worker w = StartWorker();
  // Without find_unused_parameters: a clear error naming the parameters.
  {
    ProcessGroup pg = w.MakeGroup(GroupOptions{.name = "strict"});
    std::shared_ptr<Net> model = MakeNet(5);
    model->to(w.device());
    auto ddp = DistributedDataParallel::Create(model, pg);
    WCHECK_OK(ddp.status());
    auto [x, y] = Batch(0, w.world, w.device());
    bool threw = false;
    try {
      torch::mse_loss(model->forward(Shard(x, w.rank), false), Shard(y, w.rank)).backward();
    } catch (const std::exception& e) {
      threw = true;
      const std::string what = e.what();
      WCHECK(absl::StrContains(what, "'fc3.weight'"));
      WCHECK(absl::StrContains(what, "'fc3.bias'"));
      WCHECK(absl::StrContains(what, "find_unused_parameters"));
    }
    WCHECK(threw);
    // The same DDP keeps working once every parameter is used again.
    torch::mse_loss(model->forward(Shard(x, w.rank), true), Shard(y, w.rank)).backward();
  }
  // With it: unused parameters count as zero and training matches.
  TrainAndCompare(w, /*use_fc3=*/false, /*find_unused=*/true);
  w.Finish();
  return 0;
}

// A stand-in for a distributed-autograd context: gradients in a map.
class FakeGradientSource final : public GradientSource {
 public:
  at::Tensor Get(size_t index, const at::Tensor&) override {
    auto it = grads.find(index);
    return it == grads.end() ? at::Tensor() : it->second;
  }
  void Set(size_t index, const at::Tensor&, const at::Tensor& grad) override {
    grads[index] = grad.clone();
  }
  std::map<size_t, at::Tensor> grads;
};

BATON_SCENARIO(ddp_gradient_source) {
  Worker w = StartWorker();
  ProcessGroup pg = w.MakeGroup();
  std::shared_ptr<Net> model = MakeNet(9);
  auto source = std::make_shared<FakeGradientSource>();
  DdpOptions options;
  options.gradient_source = source;
  options.bucket_cap_bytes = 200;
  auto made = DistributedDataParallel::Create(model, pg, options);
  WCHECK_OK(made.status());
  DistributedDataParallel& ddp = **made;
  const auto& params = ddp.parameters();
  const double mean = (w.world + 1) / 2.0;
  // All at once.
  for (size_t i = 0; i < params.size(); ++i) {
    source->grads[i] = torch::full_like(params[i], w.rank + 1.0);
  }
  WCHECK_OK(ddp.SyncGradients());
  for (size_t i = 0; i < params.size(); ++i) {
    WCHECK(source->grads[i].eq(mean).all().item<bool>());
    WCHECK(!params[i].grad().defined());  // .grad untouched
  }
  // As an engine would: ready one by one, in reverse, then finish.
  for (size_t i = 0; i < params.size(); ++i) {
    source->grads[i] = torch::full_like(params[i], 2.0 * (w.rank + 1) + i);
  }
  for (size_t i = params.size(); i-- > 0;) ddp.MarkGradientReady(i);
  WCHECK_OK(ddp.FinishGradients());
  for (size_t i = 0; i < params.size(); ++i) {
    WCHECK(source->grads[i].eq(2.0 * mean + i).all().item<bool>());
  }
  w.Finish();
  return 0;
}

void Expect(const std::string& scenario, int world, const std::string& backend = "gloo") {
  const std::string why = WhyUnavailable(backend, world);
  if (!why.empty()) GTEST_SKIP() << "skipped: " << why;
  const std::vector<WorkerResult> results =
      RunWorkers(scenario, world, absl::Seconds(180), BackendEnv(backend));
  for (const WorkerResult& r : results) {
    ASSERT_TRUE(r.exit_code == 0 && r.signal == 0 && !r.timed_out) << Describe(results);
  }
}

TEST(Ddp, MatchesSingleProcessTwoRanks) { Expect("ddp_matches_single_process", 2); }
TEST(Ddp, MatchesSingleProcessThreeRanks) { Expect("ddp_matches_single_process", 3); }
TEST(Ddp, UnusedParameters) { Expect("ddp_unused_parameters", 2); }
TEST(Ddp, ExternalGradientSource) { Expect("ddp_gradient_source", 2); }
TEST(Ddp, MatchesSingleProcessOneRank) { Expect("ddp_matches_single_process", 1); }

// DDP over NCCL on GPU tensors: bit-identical to plain training on one GPU
// (world size 1; more ranks need a GPU each).
TEST(DdpNccl, MatchesSingleProcessOneRank) { Expect("ddp_matches_single_process", 1, "nccl"); }
TEST(DdpNccl, MatchesSingleProcessTwoRanks) { Expect("ddp_matches_single_process", 2, "nccl"); }
TEST(DdpNccl, UnusedParameters) { Expect("ddp_unused_parameters", 1, "nccl"); }

TEST(Ddp, RejectsBadArguments) {
  EXPECT_EQ(DistributedDataParallel::Create(nullptr, ProcessGroup()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributedDataParallel::Create(MakeNet(1), ProcessGroup()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DistributedSampler, ShardsPadsAndShufflesIdenticallyOnEveryRank) {
  const int replicas = 3;
  std::vector<DistributedSampler> samplers;
  for (int r = 0; r < replicas; ++r) {
    auto s = DistributedSampler::Create(10, replicas, r, {.seed = 42});
    ASSERT_TRUE(s.ok());
    samplers.push_back(*s);
  }
  std::vector<int64_t> epoch0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int64_t> seen;
    std::vector<int64_t> order;
    for (auto& s : samplers) {
      s.SetEpoch(epoch);
      const std::vector<int64_t> mine = s.Indices();
      EXPECT_EQ(mine.size(), 4u);  // ceil(10 / 3), padded
      EXPECT_EQ(s.num_samples(), 4);
      seen.insert(mine.begin(), mine.end());
      order.insert(order.end(), mine.begin(), mine.end());
    }
    EXPECT_EQ(seen.size(), 12u);
    for (int64_t i = 0; i < 10; ++i) EXPECT_GE(seen.count(i), 1u) << i;
    if (epoch == 0)
      epoch0 = order;
    else
      EXPECT_NE(order, epoch0) << "epochs must shuffle differently";
  }
  // Same seed and epoch, built anew: the same indices.
  auto again = DistributedSampler::Create(10, replicas, 1, {.seed = 42});
  again->SetEpoch(1);
  EXPECT_EQ(again->Indices(), samplers[1].Indices());
  // No shuffle, drop_last.
  auto plain = DistributedSampler::Create(10, replicas, 2, {.shuffle = false, .drop_last = true});
  EXPECT_EQ(plain->Indices(), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_FALSE(DistributedSampler::Create(10, 2, 2).ok());
  EXPECT_FALSE(DistributedSampler::Create(-1, 2, 0).ok());
  EXPECT_FALSE(DistributedSampler::Create(10, 0, 0).ok());
}

}  // namespace
}  // namespace baton::comm::testing
