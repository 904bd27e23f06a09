// The parameter server's protocol, in one process: ServerShard objects
// driven directly, as servers, by a small in-test router. Tests are named
// after the guarantees of ps/server_shard.h (PS1-PS9).
#include "ps/server_shard.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "ps/server.h"
#include "ps/sharding.h"
#include "rpc/function.h"
#include "testing/fake_clock.h"
#include "tests/ps/shard_cluster.h"

namespace baton::ps {
namespace {

using dist_optim::OptimizerOptions;
using testing::Cluster;
using testing::ExpectClose;
using testing::LinearSpec;

// A linear model y = x W^T + b trained on per-trainer batches.
struct Model {
  torch::Tensor w, b;
};

torch::Tensor Loss(const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& x,
                   const torch::Tensor& y) {
  return (torch::tanh(torch::addmm(b, x, w.t())) - y).pow(2).mean();
}

std::pair<torch::Tensor, torch::Tensor> Grads(const torch::Tensor& w, const torch::Tensor& b,
                                              const torch::Tensor& x, const torch::Tensor& y) {
  auto wl = w.detach().requires_grad_(true), bl = b.detach().requires_grad_(true);
  Loss(wl, bl, x, y).backward();
  return {wl.grad(), bl.grad()};
}

// Trains `steps` synchronous steps with `trainers` trainers on `servers`
// servers; returns the final (w, b).
Model TrainSync(torch::Dtype dtype, const OptimizerOptions& opt, int trainers, int servers,
                int steps, std::vector<torch::Tensor>* xs, std::vector<torch::Tensor>* ys) {
  PsSpec spec = LinearSpec(dtype, opt, Consistency::Sync(), trainers);
  Cluster cluster(spec, servers);
  torch::manual_seed(3);
  cluster.InitDense(0, torch::randn({7, 300}, dtype) * 0.1);
  cluster.InitDense(1, torch::randn({7}, dtype) * 0.1);
  for (int c = 0; c < steps; ++c) {
    for (int t = 0; t < trainers; ++t) {
      auto w = cluster.PullDense(t, c, 0);
      auto b = cluster.PullDense(t, c, 1);
      EXPECT_TRUE(w.ok() && b.ok());
      const auto& x = (*xs)[c * trainers + t];
      const auto& y = (*ys)[c * trainers + t];
      auto [gw, gb] = Grads(*w, *b, x, y);
      EXPECT_TRUE(cluster.Push(t, c, 0, gw, {}, /*end_clock=*/false).ok());
      EXPECT_TRUE(cluster.Push(t, c, 1, gb, {}, /*end_clock=*/true).ok());
    }
  }
  return {cluster.PullDense(0, steps, 0).value(), cluster.PullDense(0, steps, 1).value()};
}

void MakeData(torch::Dtype dtype, int n, std::vector<torch::Tensor>* xs,
              std::vector<torch::Tensor>* ys) {
  torch::manual_seed(11);
  for (int i = 0; i < n; ++i) {
    xs->push_back(torch::randn({8, 300}, dtype));
    ys->push_back(torch::randn({8, 7}, dtype).tanh());
  }
}

// The same training in one process on the concatenated batches.
Model TrainReference(torch::Dtype dtype, const OptimizerOptions& opt, int trainers, int steps,
                     const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys) {
  torch::manual_seed(3);
  auto w = (torch::randn({7, 300}, dtype) * 0.1).requires_grad_(true);
  auto b = (torch::randn({7}, dtype) * 0.1).requires_grad_(true);
  std::unique_ptr<torch::optim::Optimizer> o;
  if (opt.kind == dist_optim::OptimizerKind::kAdam) {
    o = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{w, b},
                                             torch::optim::AdamOptions(opt.lr));
  } else {
    o = std::make_unique<torch::optim::SGD>(
        std::vector<torch::Tensor>{w, b}, torch::optim::SGDOptions(opt.lr).momentum(opt.momentum));
  }
  for (int c = 0; c < steps; ++c) {
    std::vector<torch::Tensor> bx, by;
    for (int t = 0; t < trainers; ++t) {
      bx.push_back(xs[c * trainers + t]);
      by.push_back(ys[c * trainers + t]);
    }
    o->zero_grad();
    Loss(w, b, torch::cat(bx), torch::cat(by)).backward();
    o->step();
  }
  return {w.detach(), b.detach()};
}

TEST(PsGuarantees, PS1_SyncEqualsSingleProcessOnConcatenatedBatch) {
  struct Case {
    torch::Dtype dtype;
    OptimizerOptions opt;
    double tol;
  };
  OptimizerOptions momentum = OptimizerOptions::SGD(0.1);
  momentum.momentum = 0.9;
  for (const Case& k :
       {Case{torch::kFloat32, momentum, 1e-6}, Case{torch::kFloat64, momentum, 1e-12},
        Case{torch::kFloat32, OptimizerOptions::Adam(0.01), 1e-6},
        Case{torch::kFloat64, OptimizerOptions::Adam(0.01), 1e-12}}) {
    std::vector<torch::Tensor> xs, ys;
    MakeData(k.dtype, 3 * 6, &xs, &ys);
    Model got = TrainSync(k.dtype, k.opt, 3, 2, 6, &xs, &ys);
    Model want = TrainReference(k.dtype, k.opt, 3, 6, xs, ys);
    SCOPED_TRACE(k.opt.DebugString() + " " +
                 std::string(c10::toString(
                     torch::typeMetaToScalarType(torch::scalarTypeToTypeMeta(k.dtype)))));
    ExpectClose(got.w, want.w, k.tol);
    ExpectClose(got.b, want.b, k.tol);
  }
}

TEST(PsGuarantees, PS2_SyncBitIdenticalOn1To3Servers) {
  std::vector<torch::Tensor> xs, ys;
  MakeData(torch::kFloat32, 3 * 5, &xs, &ys);
  for (const auto& opt : {OptimizerOptions::Adam(0.01), OptimizerOptions::SGD(0.1)}) {
    Model one = TrainSync(torch::kFloat32, opt, 3, 1, 5, &xs, &ys);
    for (int servers : {2, 3}) {
      Model many = TrainSync(torch::kFloat32, opt, 3, servers, 5, &xs, &ys);
      EXPECT_TRUE(torch::equal(one.w, many.w)) << servers << " servers, " << opt.DebugString();
      EXPECT_TRUE(torch::equal(one.b, many.b)) << servers << " servers, " << opt.DebugString();
    }
  }
}

TEST(PsGuarantees, PS2_EmbeddingSyncBitIdenticalOn1To3Servers) {
  auto run = [](int servers) {
    PsSpec spec;
    spec.tables = {TableSpec::Embedding("emb", 1000, 8, RowInit::Uniform(0.1, 7),
                                        RowOptimizer::RowWiseAdagrad(0.05))};
    spec.consistency = Consistency::Sync();
    spec.num_trainers = 2;
    Cluster cluster(spec, servers);
    torch::manual_seed(5);
    for (int c = 0; c < 6; ++c) {
      for (int t = 0; t < 2; ++t) {
        auto ids = torch::randint(0, 1000, {50}, torch::kLong);
        auto uniq = std::get<0>(at::_unique2(ids, true));
        EXPECT_TRUE(cluster.PullRows(t, c, 0, uniq).ok());
        auto g = torch::randn({uniq.numel(), 8});
        EXPECT_TRUE(cluster.Push(t, c, 0, g, uniq).ok());
      }
    }
    return cluster.PullRows(0, 6, 0, torch::arange(0, 1000, torch::kLong)).value();
  };
  at::Tensor one = run(1);
  EXPECT_TRUE(torch::equal(one, run(2)));
  EXPECT_TRUE(torch::equal(one, run(3)));
}

TEST(PsSharding, DenseChunksAreAlignedContiguousAndBalancedByBytes) {
  PsSpec spec;
  spec.tables = {TableSpec::Dense("big", {1000, 1000}, torch::kFloat32, OptimizerOptions::SGD(1)),
                 TableSpec::Dense("small", {10}, torch::kFloat32, OptimizerOptions::SGD(1)),
                 TableSpec::Dense("d", {300000}, torch::kFloat64, OptimizerOptions::SGD(1))};
  const int64_t total = 1000 * 1000 * 4 + 40 + 300000 * 8;
  for (int servers : {1, 2, 3, 5}) {
    ShardPlan plan = ShardPlan::Make(spec, servers);
    std::vector<int64_t> bytes(servers, 0);
    for (int t = 0; t < 3; ++t) {
      int64_t next = 0;
      for (const auto& c : plan.chunks(t)) {
        EXPECT_EQ(c.begin, next);
        EXPECT_EQ(c.begin % ShardPlan::kAlign, 0);
        next = c.end;
        bytes[c.server] += c.size() * (t == 2 ? 8 : 4);
      }
      EXPECT_EQ(next, spec.tables[t].numel());
    }
    for (int s = 0; s < servers; ++s) {
      EXPECT_NEAR(bytes[s], total / servers, 3 * ShardPlan::kAlign * 8) << servers;
    }
  }
  // The big table is spread over the servers its bytes span.
  EXPECT_EQ(ShardPlan::Make(spec, 5).chunks(0).size(), 4u);  // 4 MB of 6.4 MB: 4 of 5 servers
}

TEST(PsGuarantees, PS3_AsyncNoLostUpdateUnderConcurrentTrainers) {
  PsSpec spec;
  spec.tables = {
      TableSpec::Dense("w", {1000}, torch::kFloat64, OptimizerOptions::SGD(1)),
      TableSpec::Embedding("emb", 100, 4, RowInit::Zeros(), RowOptimizer::SGD(1), torch::kFloat64)};
  spec.consistency = Consistency::Async();
  spec.num_trainers = 4;
  Cluster cluster(spec, 2);
  cluster.InitDense(0, torch::zeros({1000}, torch::kFloat64));
  at::Tensor all_ids = torch::arange(0, 100, torch::kLong);
  ASSERT_TRUE(cluster.PullRows(0, 0, 1, all_ids).ok());  // creates the rows
  constexpr int kPushes = 300;
  const ShardPlan plan = ShardPlan::Make(spec, 2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPushes; ++i) {
        EXPECT_TRUE(cluster.Push(t, i, 0, torch::ones({1000}, torch::kFloat64)).ok());
        EXPECT_TRUE(cluster
                        .Push(t, i, 1, torch::ones({3, 4}, torch::kFloat64),
                              torch::tensor({1, 1, 42}, torch::kLong))
                        .ok());
        // A concurrent pull sees each push whole: every element equal.
        auto w = cluster.PullDense(t, i, 0).value();
        for (const auto& c : plan.chunks(0)) {
          auto part = w.narrow(0, c.begin, c.size());
          EXPECT_EQ(part.min().item<double>(), part.max().item<double>());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  // SGD lr 1 on gradient 1: each push subtracts exactly 1 (small integers are exact).
  EXPECT_EQ(cluster.PullDense(0, kPushes, 0).value().max().item<double>(), -4.0 * kPushes);
  auto rows = cluster.PullRows(0, kPushes, 1, torch::tensor({1, 42, 7}, torch::kLong)).value();
  EXPECT_EQ(rows[0][0].item<double>(), -2.0 * 4 * kPushes);  // id 1 twice per push, merged
  EXPECT_EQ(rows[1][0].item<double>(), -1.0 * 4 * kPushes);
  EXPECT_EQ(rows[2][0].item<double>(), 0.0);
  int64_t applied = 0;
  for (int s = 0; s < 2; ++s) applied += cluster.shard(s).Stats().applied_pushes;
  EXPECT_EQ(applied, 2 * 2 * 4 * kPushes);  // two push calls per step, each to both servers
}

TEST(PsGuarantees, PS4_SspStalenessNeverExceedsBound) {
  constexpr int64_t kS = 2;
  PsSpec spec;
  spec.tables = {TableSpec::Dense("w", {64}, torch::kFloat32, OptimizerOptions::SGD(0.01))};
  spec.consistency = Consistency::BoundedStaleness(kS);
  spec.num_trainers = 3;
  Cluster cluster(spec, 1);
  cluster.InitDense(0, torch::zeros({64}));
  std::atomic<int64_t> finished[3] = {0, 0, 0};
  std::atomic<bool> violated{false};
  std::atomic<int64_t> max_seen{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t c = 0; c < 30; ++c) {
        auto r = cluster.Blocking(0, t, c, {{"w", {}, {}}}, absl::Seconds(20));
        ASSERT_TRUE(r.ok()) << r.status();
        // When the pull returns, every trainer finished clock c - s - 1.
        for (int o = 0; o < 3; ++o) {
          if (finished[o].load() < c - kS) violated = true;
        }
        max_seen = std::max<int64_t>(max_seen, r->staleness);
        if (t == 2) absl::SleepFor(absl::Milliseconds(5));  // the slow trainer's work, not a wait
        finished[t] = c + 1;  // before the push, so a served pull implies it
        ASSERT_TRUE(cluster.Push(t, c, 0, torch::ones({64})).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(violated.load());
  EXPECT_LE(cluster.shard(0).Stats().max_staleness, kS);
  EXPECT_GT(max_seen.load(), 0) << "the fast trainers never ran ahead";
}

TEST(PsGuarantees, PS4_StalenessZeroIsSync) {
  EXPECT_EQ(Consistency::BoundedStaleness(0).mode, ConsistencyMode::kSync);
}

PsSpec TwoTrainerSync(StragglerPolicy policy) {
  PsSpec spec = LinearSpec(torch::kFloat64, OptimizerOptions::SGD(1), Consistency::Sync(), 2);
  spec.trainer_timeout = absl::Seconds(5);
  spec.straggler_policy = policy;
  return spec;
}

TEST(PsGuarantees, PS5_StragglerIsDroppedAfterTimeoutWithItsName) {
  baton::testing::FakeClock time;
  std::vector<std::string> logs;
  absl::Mutex log_mu;
  PsSpec spec = TwoTrainerSync(StragglerPolicy::kDrop);
  Cluster cluster(spec, 1, &time, [&](const std::string& l) {
    absl::MutexLock lock(&log_mu);
    logs.push_back(l);
  });
  cluster.InitDense(0, torch::zeros({7, 300}, torch::kFloat64));
  cluster.InitDense(1, torch::zeros({7}, torch::kFloat64));
  ASSERT_TRUE(cluster.Push(0, 0, 0, torch::ones({7, 300}, torch::kFloat64)).ok());
  // Trainer 0 pulls clock 1; trainer 1 never pushes clock 0.
  absl::Notification done;
  absl::StatusOr<PullResult> got;
  cluster.shard(0).Pull(0, 1, {{"w", {}, {}}}, absl::InfiniteFuture(),
                        [&](absl::StatusOr<PullResult> r) {
                          got = std::move(r);
                          done.Notify();
                        });
  cluster.shard(0).CheckWaits();
  EXPECT_FALSE(done.HasBeenNotified());
  time.Advance(absl::Seconds(6));
  cluster.shard(0).CheckWaits();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(got.ok()) << got.status();
  // Only trainer 0's gradient, averaged over the one contributor.
  EXPECT_EQ(got->values[0][0].item<double>(), -1.0);
  EXPECT_EQ(cluster.shard(0).Stats().dropped_trainers, 1);
  absl::MutexLock lock(&log_mu);
  ASSERT_FALSE(logs.empty());
  EXPECT_TRUE(absl::StrContains(logs.back(), "dropped trainer 1")) << logs.back();
}

TEST(PsGuarantees, PS5_StragglerFailPolicyFailsTheWaitNamingIt) {
  baton::testing::FakeClock time;
  Cluster cluster(TwoTrainerSync(StragglerPolicy::kFail), 1, &time);
  cluster.InitDense(0, torch::zeros({7, 300}, torch::kFloat64));
  cluster.InitDense(1, torch::zeros({7}, torch::kFloat64));
  ASSERT_TRUE(cluster.Push(0, 0, 0, torch::ones({7, 300}, torch::kFloat64)).ok());
  absl::Notification done;
  absl::Status status;
  cluster.shard(0).Pull(0, 1, {{"w", {}, {}}}, absl::InfiniteFuture(),
                        [&](absl::StatusOr<PullResult> r) {
                          status = r.status();
                          done.Notify();
                        });
  time.Advance(absl::Seconds(6));
  cluster.shard(0).CheckWaits();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(status.message(), "trainer 1 (at clock 0)")) << status;
  EXPECT_EQ(cluster.shard(0).Stats().dropped_trainers, 0);
}

TEST(PsGuarantees, PS5_ParkedPullFailsAtItsDeadline) {
  baton::testing::FakeClock time;
  Cluster cluster(TwoTrainerSync(StragglerPolicy::kDrop), 1, &time);
  cluster.InitDense(0, torch::zeros({7, 300}, torch::kFloat64));
  cluster.InitDense(1, torch::zeros({7}, torch::kFloat64));
  absl::Notification done;
  absl::Status status;
  cluster.shard(0).Pull(0, 1, {{"w", {}, {}}}, time.Now() + absl::Seconds(1),
                        [&](absl::StatusOr<PullResult> r) {
                          status = r.status();
                          done.Notify();
                        });
  EXPECT_EQ(cluster.shard(0).Stats().parked_pulls, 1);
  time.Advance(absl::Seconds(2));
  cluster.shard(0).CheckWaits();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(status.message(), "waiting for trainers 0, 1")) << status;
  EXPECT_EQ(cluster.shard(0).Stats().parked_pulls, 0);
}

TEST(PsGuarantees, PS6_DroppedTrainerRejoinsAtTheCurrentClock) {
  baton::testing::FakeClock time;
  Cluster cluster(TwoTrainerSync(StragglerPolicy::kDrop), 1, &time);
  cluster.InitDense(0, torch::zeros({7, 300}, torch::kFloat64));
  cluster.InitDense(1, torch::zeros({7}, torch::kFloat64));
  ServerShard& s = cluster.shard(0);
  ASSERT_TRUE(cluster.Push(0, 0, 0, torch::ones({7, 300}, torch::kFloat64)).ok());
  s.Pull(0, 1, {{"w", {}, {}}}, absl::InfiniteFuture(), [](absl::StatusOr<PullResult>) {});
  time.Advance(absl::Seconds(6));
  s.CheckWaits();  // drops trainer 1; clock 0 applies
  ASSERT_EQ(s.Stats().applied_clock, 1);
  // Trainer 1 comes back with its push for clock 0: stale, discarded, and
  // told to continue from clock 1.
  auto r = s.Push(1, 0, true, {{"w", {}, torch::full({7 * 300}, 100.0, torch::kFloat64)}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 1);
  EXPECT_EQ(s.Stats().stale_pushes, 1);
  EXPECT_EQ(s.Stats().live_trainers, 2);
  // Both take part in clock 1 again: the mean of 1 and 3 is applied.
  ASSERT_TRUE(cluster.Push(0, 1, 0, torch::full({7, 300}, 1.0, torch::kFloat64)).ok());
  ASSERT_TRUE(cluster.Push(1, 1, 0, torch::full({7, 300}, 3.0, torch::kFloat64)).ok());
  EXPECT_EQ(cluster.PullDense(0, 2, 0).value()[0][0].item<double>(), -1.0 - 2.0);
}

TEST(PsGuarantees, PS6_JoinRedoesTheCurrentClockFencesTheOldSessionAndRejectsAnotherSpec) {
  PsSpec spec = TwoTrainerSync(StragglerPolicy::kDrop);
  Cluster cluster(spec, 1);
  cluster.InitDense(0, torch::zeros({7, 300}, torch::kFloat64));
  cluster.InitDense(1, torch::zeros({7}, torch::kFloat64));
  ServerShard& s = cluster.shard(0);
  // Trainer 1 pushes clock 0 partially, then "restarts" and joins.
  ASSERT_TRUE(cluster.Push(1, 0, 0, torch::full({7, 300}, 50.0, torch::kFloat64), {}, false).ok());
  const int64_t old_session = 1;  // the Cluster's Join
  auto joined = s.Join(1, spec.Fingerprint());
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->clock, 0);
  EXPECT_EQ(joined->session, old_session + 1);
  // A late push of the previous incarnation is refused and changes nothing.
  auto late =
      s.Push(1, 0, true, {{"w", {}, torch::full({7 * 300}, 50.0, torch::kFloat64)}}, old_session);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StrContains(late.status().message(), "superseded incarnation of trainer 1"))
      << late.status();
  ASSERT_TRUE(cluster.Push(0, 0, 0, torch::full({7, 300}, 1.0, torch::kFloat64)).ok());
  ASSERT_TRUE(cluster.Push(1, 0, 0, torch::full({7, 300}, 3.0, torch::kFloat64)).ok());
  EXPECT_EQ(cluster.PullDense(0, 1, 0).value()[0][0].item<double>(), -2.0);  // 50 was dropped

  PsSpec other = spec;
  other.tables[0].shape = {7, 301};
  auto bad = s.Join(0, other.Fingerprint());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "dense w Double[7,301]")) << bad.status();
}

// docs/threading.md: no user callback runs under the shard's lock. The log
// callback calls the shard (which would deadlock on its own mutex if it ran
// under it), even a call that logs again, and still sees the lines one at a
// time in the order of the events.
// A push that went again after a partition broke its connection (its first
// send may have been applied) carries the same push id: applied once.
TEST(PsGuarantees, PS9_ARepeatedPushIdIsAppliedOnce) {
  PsSpec spec = LinearSpec(torch::kFloat64, OptimizerOptions::SGD(1), Consistency::Async(), 1);
  Cluster cluster(spec, 1);
  cluster.InitDense(0, torch::zeros({7, 300}, torch::kFloat64));
  cluster.InitDense(1, torch::zeros({7}, torch::kFloat64));
  ServerShard& s = cluster.shard(0);
  auto push = [&](uint64_t id, bool end) {
    return s.Push(0, 0, end, {{"b", {}, torch::ones({7}, torch::kFloat64)}}, kAnySession, id);
  };
  ASSERT_TRUE(push(1, false).ok());
  auto repeated = push(1, false);  // the repeat
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_EQ(*repeated, 0);
  auto ended = push(2, true);
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(*ended, 1);
  auto repeated_end = push(2, true);  // answered with the trainer's clock
  ASSERT_TRUE(repeated_end.ok());
  EXPECT_EQ(*repeated_end, 1);
  EXPECT_EQ(s.Stats().applied_pushes, 2);
  EXPECT_EQ(s.Stats().duplicate_pushes, 2);
  // Two gradients of one, SGD with lr 1: -2, not -4.
  EXPECT_EQ(cluster.PullDense(0, 1, 1).value()[0].item<double>(), -2.0);
  // Pushes without an id (in-process callers) are applied every time.
  ASSERT_TRUE(push(0, false).ok());
  ASSERT_TRUE(push(0, false).ok());
  EXPECT_EQ(s.Stats().applied_pushes, 4);
  // A new session (Join) numbers its pushes anew.
  ASSERT_TRUE(s.Join(0, spec.Fingerprint()).ok());
  ASSERT_TRUE(
      s.Push(0, 1, false, {{"b", {}, torch::ones({7}, torch::kFloat64)}}, kAnySession, 1).ok());
  EXPECT_EQ(s.Stats().applied_pushes, 5);
}

TEST(PsShardThreading, LogCallbackRunsWithoutTheLockMayCallTheShardAndKeepsEventOrder) {
  baton::testing::FakeClock time;
  Cluster* cluster_ptr = nullptr;
  struct Seen {
    std::string line;
    int64_t dropped;  // Stats() read from inside the callback
    int64_t live;
  };
  std::vector<Seen> seen;  // the callback's calls are serialized (contract)
  absl::StatusOr<int64_t> push_from_callback = absl::UnknownError("not called");
  Cluster cluster(TwoTrainerSync(StragglerPolicy::kDrop), 1, &time, [&](const std::string& l) {
    ServerShard& s = cluster_ptr->shard(0);
    const ShardStats st = s.Stats();
    seen.push_back({l, st.dropped_trainers, st.live_trainers});
    if (absl::StrContains(l, "dropped trainer 1")) {
      // Trainer 1 comes back from inside the callback: its
      // rejoin is logged too, after this line.
      push_from_callback =
          s.Push(1, 0, true, {{"w", {}, torch::full({7 * 300}, 100.0, torch::kFloat64)}});
    }
  });
  cluster_ptr = &cluster;
  cluster.InitDense(0, torch::zeros({7, 300}, torch::kFloat64));
  cluster.InitDense(1, torch::zeros({7}, torch::kFloat64));
  ServerShard& s = cluster.shard(0);
  ASSERT_TRUE(cluster.Push(0, 0, 0, torch::ones({7, 300}, torch::kFloat64)).ok());
  absl::Notification done;
  s.Pull(0, 1, {{"w", {}, {}}}, absl::InfiniteFuture(),
         [&](absl::StatusOr<PullResult>) { done.Notify(); });
  time.Advance(absl::Seconds(6));
  s.CheckWaits();  // drops trainer 1; clock 0 applies; the parked pull completes
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(absl::StrContains(seen[0].line, "dropped trainer 1")) << seen[0].line;
  EXPECT_EQ(seen[0].dropped, 1);
  EXPECT_EQ(seen[0].live, 1);
  EXPECT_TRUE(absl::StrContains(seen[1].line, "trainer 1 rejoined the clock at clock 1"))
      << seen[1].line;
  EXPECT_EQ(seen[1].live, 2);
  // The push made from the callback was for the applied clock 0: stale.
  ASSERT_TRUE(push_from_callback.ok()) << push_from_callback.status();
  EXPECT_EQ(*push_from_callback, 1);
  EXPECT_EQ(s.Stats().stale_pushes, 1);
}

TEST(PsGuarantees, PS7_BadInputIsRejectedNamingItAndChangesNothing) {
  PsSpec spec;
  spec.tables = {TableSpec::Dense("w", {10}, torch::kFloat32, OptimizerOptions::SGD(1)),
                 TableSpec::Dense("fresh", {10}, torch::kFloat32, OptimizerOptions::SGD(1)),
                 TableSpec::Embedding("emb", 100, 4, RowInit::Uniform(1, 1), RowOptimizer::SGD(1))};
  spec.consistency = Consistency::Async();
  spec.num_trainers = 1;
  Cluster cluster(spec, 1);
  ServerShard& s = cluster.shard(0);
  cluster.InitDense(0, torch::ones({10}));
  ASSERT_TRUE(cluster.PullRows(0, 0, 2, torch::tensor({3, 5}, torch::kLong)).ok());
  const std::string before = s.Serialize().value();

  struct Bad {
    std::vector<TableRequest> reqs;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Bad> cases = {
      {{{"nope", {}, torch::ones({10})}},
       absl::StatusCode::kInvalidArgument,
       "ps table 'nope': no such table"},
      {{{"w", {}, torch::ones({11})}},
       absl::StatusCode::kInvalidArgument,
       "ps table 'w': gradient chunk Float[11] does not match Float[10]"},
      {{{"w", {}, torch::ones({10}, torch::kFloat64)}},
       absl::StatusCode::kInvalidArgument,
       "ps table 'w': gradient dtype Double does not match the table's Float"},
      {{{"emb", torch::tensor({3, 100}, torch::kLong), torch::ones({2, 4})}},
       absl::StatusCode::kInvalidArgument,
       "ps table 'emb': row id 100 out of range [0, 100)"},
      {{{"emb", torch::tensor({-1}, torch::kLong), torch::ones({1, 4})}},
       absl::StatusCode::kInvalidArgument,
       "row id -1 out of range"},
      {{{"emb", torch::tensor({3, 7}, torch::kLong), torch::ones({2, 4})}},
       absl::StatusCode::kInvalidArgument,
       "ps table 'emb': push for row 7, which no trainer has pulled"},
      {{{"emb", torch::tensor({3}, torch::kLong), torch::ones({1, 5})}},
       absl::StatusCode::kInvalidArgument,
       "row gradients Float[1,5] do not match 1 ids x dim 4"},
      {{{"emb", torch::tensor({3.0}), torch::ones({1, 4})}},
       absl::StatusCode::kInvalidArgument,
       "row ids must be int64[n] (got Float[1])"},
      {{{"fresh", {}, torch::ones({10})}},
       absl::StatusCode::kFailedPrecondition,
       "ps table 'fresh': pushed before any trainer initialized it"},
      // A valid first part does not get applied when a later part is bad.
      {{{"w", {}, torch::ones({10})},
        {"emb", torch::tensor({9}, torch::kLong), torch::ones({1, 4})}},
       absl::StatusCode::kInvalidArgument,
       "push for row 9"},
  };
  for (const auto& c : cases) {
    auto r = s.Push(0, 0, true, c.reqs);
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.says)) << r.status();
  }
  auto p = cluster.Blocking(0, 0, 0, {{"emb", torch::tensor({500}, torch::kLong), {}}},
                            absl::Seconds(1));
  EXPECT_TRUE(absl::StrContains(p.status().message(), "row id 500 out of range")) << p.status();
  EXPECT_EQ(s.Join(7, spec.Fingerprint()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Serialize().value(), before) << "state changed";
  EXPECT_EQ(s.Stats().applied_pushes, 0);
}

}  // namespace
}  // namespace baton::ps
