// Checks the CTR workload against the peer benchmark
// /work/shared/peer/torch_ps_sparse_bench.py: the check values in its
// docstring and values printed by the peer itself.
#include "examples/ctr/workload.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <cstdio>
#include <vector>

namespace baton::examples::ctr {
namespace {

const Workload& DefaultWorkload() {
  static const Workload* const kWorkload = new Workload(Workload::Create(WorkloadConfig{}).value());
  return *kWorkload;
}

std::vector<int64_t> Ints(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kInt64).contiguous().reshape({-1});
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

int64_t Distinct(const torch::Tensor& ids) {
  return std::get<0>(torch::_unique(ids.reshape({-1}))).numel();
}

// Float32 values printed by Python as the exact float64 of the float32.
void ExpectFloats(const torch::Tensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  torch::Tensor c = got.contiguous();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(static_cast<double>(c.data_ptr<float>()[i]), want[i]) << i;
  }
}

// Dense features printed rounded to 7 decimals.
void ExpectRounded7(const torch::Tensor& got, const std::vector<double>& want) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  torch::Tensor c = got.contiguous();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(c.data_ptr<float>()[i], want[i], 5.01e-8) << i;
  }
}

TEST(Workload, DocstringCheckValues) {
  const Workload& wl = DefaultWorkload();
  Batch b = wl.MakeBatch(0, 0);
  ASSERT_EQ(b.ids.sizes(), (std::vector<int64_t>{512, 26}));
  ASSERT_EQ(b.dense.sizes(), (std::vector<int64_t>{512, 13}));
  ASSERT_EQ(b.labels.sizes(), (std::vector<int64_t>{512}));
  EXPECT_EQ(b.ids.sum().item<int64_t>(), 6654761339);
  EXPECT_EQ(Distinct(b.ids), 7617);
  EXPECT_EQ(b.labels.sum().item<float>(), 242.0f);
  std::vector<int64_t> row0 = Ints(b.ids[0]);
  EXPECT_EQ(std::vector<int64_t>(row0.begin(), row0.begin() + 4),
            (std::vector<int64_t>{0, 37571, 937802, 701876}));
  EXPECT_NEAR(wl.InitRows(torch::zeros({1}, torch::kInt64))[0][0].item<float>(), 0.0076957964,
              1e-9);
  torch::nn::Sequential tower = wl.MakeTower();
  torch::Tensor w1 = tower[0]->as<torch::nn::Linear>()->weight;
  EXPECT_NEAR(w1[0][0].item<float>(), -0.0209454987, 1e-9);
}

// Printed by the peer: torch_ps_sparse_bench.py --print-data (seed 0, default
// sizes).
TEST(Workload, PeerPrintDataSeed0) {
  const Workload& wl = DefaultWorkload();
  Batch b = wl.MakeBatch(0, 0);
  EXPECT_EQ(
      Ints(b.ids[0]),
      (std::vector<int64_t>{0,      37571,  937802, 701876, 703339, 114154, 230766, 925941, 871699,
                            495226, 691893, 64748,  25326,  945797, 519148, 804383, 224621, 366929,
                            861680, 10218,  640742, 881285, 868645, 884603, 745362, 865747}));
  ExpectRounded7(b.dense[0],
                 {0.7741195, -0.9900805, -0.9269788, 0.6650805, 0.6676267, 0.1158733, -0.0931579,
                  0.7211413, -0.0849453, -0.4037884, 0.0245415, 0.585861, 0.5964876});
  EXPECT_EQ(Ints(b.labels.slice(0, 0, 16)),
            (std::vector<int64_t>{1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1}));
  ExpectFloats(
      wl.InitRows(torch::tensor({int64_t{0}}))[0].slice(0, 0, 4),
      {0.007695796433836222, -0.0019366524647921324, 0.006765298545360565, 0.0015353879425674677});
  ExpectFloats(
      wl.InitRows(torch::tensor({int64_t{999999}}))[0].slice(0, 0, 4),
      {0.0015524688642472029, 0.00992533378303051, -0.009633679874241352, -0.0015645262319594622});
  torch::nn::Sequential tower = wl.MakeTower();
  ExpectFloats(
      tower[0]->as<torch::nn::Linear>()->weight[0].slice(0, 0, 4),
      {-0.02094549871981144, -0.016041448339819908, 0.011944029480218887, 0.016983244568109512});
  const uint64_t k = Key(0, kTagIds, 0, 0);
  EXPECT_EQ(Uniform(k, 0), 0.105227839223337);
  EXPECT_EQ(Uniform(k, 1), 0.7154046682289275);
  EXPECT_EQ(Uniform(k, 2), 0.5132454277120903);
  EXPECT_EQ(Uniform(k, 3), 0.9025722546519204);
}

// Printed by the peer's own Workload / init_rows functions (imported from
// torch_ps_sparse_bench.py; seed 0, default sizes): values --print-data does
// not show.
TEST(Workload, PeerValuesBeyondPrintData) {
  const Workload& wl = DefaultWorkload();
  Batch b = wl.MakeBatch(1, 1509);  // trainer 1's last default step
  EXPECT_EQ(b.ids.sum().item<int64_t>(), 6653880132);
  EXPECT_EQ(b.labels.sum().item<float>(), 248.0f);
  EXPECT_EQ(Distinct(b.ids), 7716);
  ExpectFloats(
      wl.InitRows(torch::tensor({int64_t{123456}}))[0].slice(0, 60),
      {-0.0023351951967924833, -0.00617632083594799, 0.0024313332978636026, -0.008256742730736732});
  torch::nn::Sequential tower = wl.MakeTower();
  torch::Tensor w1 = tower[0]->as<torch::nn::Linear>()->weight;
  ASSERT_EQ(w1.sizes(), (std::vector<int64_t>{256, 26 * 64 + 13}));
  ExpectFloats(w1[255].slice(0, w1.size(1) - 4), {-0.0004150868917349726, 0.014562472701072693,
                                                  -0.0005273023853078485, 0.007800813298672438});
  torch::Tensor w2 = tower[2]->as<torch::nn::Linear>()->weight;
  ASSERT_EQ(w2.sizes(), (std::vector<int64_t>{1, 256}));
  ExpectFloats(w2[0].slice(0, 0, 4), {-0.04505349323153496, -0.049935199320316315,
                                      -0.025177061557769775, 0.05461430177092552});
  EXPECT_EQ(tower[0]->as<torch::nn::Linear>()->bias.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(tower[2]->as<torch::nn::Linear>()->bias.abs().sum().item<float>(), 0.0f);
}

// Printed by the peer: torch_ps_sparse_bench.py --print-data --rows 1000
// --batch 8 --seed 3; the full ids matrix and labels by the peer's
// Workload(cfg).batch(0, 0) with the same sizes, and trainer 1 step 7's sum.
TEST(Workload, PeerPrintDataSmallConfig) {
  WorkloadConfig config;
  config.rows = 1000;
  config.batch = 8;
  config.seed = 3;
  absl::StatusOr<Workload> wl = Workload::Create(config);
  ASSERT_TRUE(wl.ok()) << wl.status();
  Batch b = wl->MakeBatch(0, 0);
  EXPECT_EQ(
      Ints(b.ids),
      (std::vector<int64_t>{
          0,   799, 525, 875, 152, 951, 121, 788, 65,  310, 747, 619, 784, 626, 820, 692, 287, 300,
          206, 464, 790, 172, 773, 891, 912, 98,  761, 321, 837, 636, 957, 844, 259, 750, 203, 342,
          380, 789, 915, 865, 293, 512, 12,  740, 684, 640, 760, 452, 924, 572, 912, 923, 599, 365,
          440, 875, 951, 780, 989, 561, 956, 342, 380, 984, 978, 304, 859, 796, 369, 929, 684, 810,
          760, 590, 358, 855, 565, 711, 188, 38,  837, 114, 38,  485, 750, 27,  857, 662, 902, 418,
          500, 494, 532, 136, 449, 407, 684, 552, 760, 559, 597, 355, 195, 950, 132, 975, 76,  114,
          806, 190, 780, 593, 335, 809, 902, 701, 544, 494, 576, 205, 935, 407, 621, 810, 86,  96,
          207, 918, 239, 27,  376, 503, 13,  271, 152, 799, 228, 673, 392, 342, 78,  373, 569, 587,
          186, 570, 457, 29,  426, 753, 87,  294, 597, 157, 434, 732, 697, 685, 213, 114, 611, 951,
          989, 549, 328, 168, 946, 638, 450, 538, 972, 637, 608, 262, 967, 483, 539, 81,  779, 679,
          912, 950, 522, 560, 233, 686, 171, 246, 560, 310, 221, 870, 562, 273, 751, 85,  928, 570,
          174, 534, 306, 727, 282, 18,  924, 94,  673, 931}));
  EXPECT_EQ(b.ids.sum().item<int64_t>(), 110939);
  EXPECT_EQ(Distinct(b.ids), 175);
  EXPECT_EQ(Ints(b.labels), (std::vector<int64_t>{0, 1, 1, 0, 0, 1, 1, 1}));
  ExpectRounded7(b.dense[0],
                 {-0.1032073, -0.450947, -0.5215065, -0.4019029, 0.7096293, 0.1615391, 0.8116373,
                  0.2177904, -0.6895435, -0.5634701, 0.6245736, 0.8893089, -0.9626936});
  ExpectFloats(
      wl->InitRows(torch::tensor({int64_t{0}}))[0].slice(0, 0, 4),
      {0.0013005962828174233, -0.008751418441534042, -0.0012883187737315893, 0.005123391281813383});
  ExpectFloats(
      wl->InitRows(torch::tensor({int64_t{999}}))[0].slice(0, 0, 4),
      {0.0025773118250072002, 0.00839312095195055, -0.0025728028267621994, -0.0014898611698299646});
  torch::nn::Sequential tower = wl->MakeTower();
  ExpectFloats(
      tower[0]->as<torch::nn::Linear>()->weight[0].slice(0, 0, 4),
      {0.014002530835568905, 0.0027690958231687546, 0.01271977648139, 0.004493645392358303});
  const uint64_t k = Key(3, kTagIds, 0, 0);
  EXPECT_EQ(Uniform(k, 0), 0.17173719855229574);
  EXPECT_EQ(Uniform(k, 1), 0.20648541744311488);
  EXPECT_EQ(Uniform(k, 2), 0.9543083615592749);
  EXPECT_EQ(Uniform(k, 3), 0.2608367344762059);
  EXPECT_EQ(wl->MakeBatch(1, 7).ids.sum().item<int64_t>(), 102565);
}

TEST(Workload, MakeBatchIsDeterministicAndVaries) {
  const Workload& wl = DefaultWorkload();
  Batch a = wl.MakeBatch(0, 5);
  Batch again = wl.MakeBatch(0, 5);
  EXPECT_TRUE(torch::equal(a.ids, again.ids));
  EXPECT_TRUE(torch::equal(a.dense, again.dense));
  EXPECT_TRUE(torch::equal(a.labels, again.labels));
  // A copy shares the CDF and gives the same data.
  Workload copy = wl;
  EXPECT_TRUE(torch::equal(copy.MakeBatch(0, 5).ids, a.ids));
  for (const Batch& other : {wl.MakeBatch(1, 5), wl.MakeBatch(0, 6)}) {
    EXPECT_FALSE(torch::equal(a.ids, other.ids));
    EXPECT_FALSE(torch::equal(a.dense, other.dense));
  }
  EXPECT_GE(a.ids.min().item<int64_t>(), 0);
  EXPECT_LT(a.ids.max().item<int64_t>(), 1000000);
  EXPECT_GE(a.dense.min().item<float>(), -1.0f);
  EXPECT_LT(a.dense.max().item<float>(), 1.0f);
  // Rows depend only on the id, whatever the tensor's shape.
  torch::Tensor rows = wl.InitRows(torch::tensor({{7, 3}, {7, 9}}));
  ASSERT_EQ(rows.sizes(), (std::vector<int64_t>{4, 64}));
  EXPECT_TRUE(torch::equal(rows[0], rows[2]));
  EXPECT_TRUE(torch::equal(rows[1], wl.InitRows(torch::tensor({3}))[0]));
  EXPECT_EQ(wl.InitRows(torch::empty({0}, torch::kInt64)).sizes(), (std::vector<int64_t>{0, 64}));
}

TEST(Workload, RejectsBadConfig) {
  struct Case {
    WorkloadConfig config;
    const char* field;
  };
  const Case cases[] = {
      {{25, 64, 512, 0}, "rows"},  {{0, 64, 512, 0}, "rows"},
      {{-5, 64, 512, 0}, "rows"},  {{int64_t{1} << 40, 64, 512, 0}, "rows"},
      {{1000, 0, 512, 0}, "dim"},  {{1000, -1, 512, 0}, "dim"},
      {{1000, 64, 0, 0}, "batch"}, {{1000, 64, -8, 0}, "batch"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Workload> wl = Workload::Create(c.config);
    ASSERT_FALSE(wl.ok()) << c.field;
    EXPECT_EQ(wl.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(wl.status().message().find(c.field), absl::string_view::npos) << wl.status();
  }
  EXPECT_TRUE(Workload::Create({26, 1, 1, 0}).ok());
}

// Not a benchmark: prints the per-call cost of the two per-step operations.
TEST(Workload, Timing) {
  using Clock = std::chrono::steady_clock;
  const Workload& wl = DefaultWorkload();
  constexpr int kCalls = 50;
  Clock::time_point t0 = Clock::now();
  int64_t sink = 0;
  for (int k = 0; k < kCalls; ++k) sink += wl.MakeBatch(0, k).ids[0][0].item<int64_t>();
  const double batch_us =
      std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kCalls;
  torch::Tensor ids = torch::arange(8000, torch::kInt64) * 125;
  t0 = Clock::now();
  for (int k = 0; k < kCalls; ++k) sink += wl.InitRows(ids).size(0);
  const double rows_us =
      std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kCalls;
  std::printf(
      "MakeBatch (512x26): %.0f us; InitRows (8000 ids x 64): %.0f us "
      "(sink %lld)\n",
      batch_us, rows_us, static_cast<long long>(sink));
  RecordProperty("make_batch_us", static_cast<int>(batch_us));
  RecordProperty("init_rows_8000_us", static_cast<int>(rows_us));
}

}  // namespace
}  // namespace baton::examples::ctr
