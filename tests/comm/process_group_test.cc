// The ProcessGroup suite: every op on every backend this build has, on real
// processes over loopback, at world sizes 1, 2 and 3 (NCCL allows one rank
// per GPU, so a one-GPU machine runs its world-size-1 cases); plus the error
// cases (wrong device, destroyed group, non-member, op mismatch in debug
// mode, timeouts naming the missing ranks) and subgroups. The CUDA build
// (CMakeLists.txt, BATON_CUDA) adds NCCL and may leave Gloo out.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/imag.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/real.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#ifndef BATON_TEST_WITHOUT_GLOO
#include "comm/gloo_backend.h"
#endif
#include "comm/process_group.h"
#include "store/memory_store.h"
#include "testing/multiprocess.h"
#include "tests/comm/comm_test_util.h"

#ifdef BATON_TEST_WITH_NCCL
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include "comm/internal/nccl_status.h"
#endif

namespace baton::comm::testing {
namespace {

using ::baton::testing::Describe;
using ::baton::testing::RunWorkers;
using ::baton::testing::WorkerResult;

constexpr absl::Duration kWait = absl::Seconds(60);

#define WCHECK_CODE(status, code_, needle)                                                     \
  do {                                                                                         \
    const absl::Status _st = (status);                                                         \
    if (_st.code() != (code_) || !absl::StrContains(_st.message(), needle)) {                  \
      std::fprintf(stderr, "%s:%d: expected %s containing '%s', got %s\n", __FILE__, __LINE__, \
                   #code_, std::string(needle).c_str(), _st.ToString().c_str());               \
      ::baton::testing::ExitWorker(1);                                                         \
    }                                                                                          \
  } while (0)

bool AllEqual(const at::Tensor& t, double v) {
  return t.cpu().to(at::kDouble).eq(v).all().item<bool>();
}

at::TensorOptions opts_for(const Worker& w, at::ScalarType type) {
  return at::TensorOptions().device(w.device()).dtype(type);
}

void CheckReductions(ProcessGroup& pg, const Worker& w) {
  const int n = w.world, r = w.rank;
  double factorial = 1;
  for (int i = 2; i <= n; ++i) factorial *= i;
  std::vector<at::ScalarType> types = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                       at::kChar,  at::kByte,   at::kInt,  at::kLong};
  if (w.backend == "gloo") types.push_back(at::kShort);
  for (at::ScalarType type : types) {
    const auto opts = at::TensorOptions().device(w.device()).dtype(type);
    struct Case {
      ReduceOp op;
      double expected;
    } cases[] = {{ReduceOp::kSum, n * (n + 1) / 2.0},
                 {ReduceOp::kProduct, factorial},
                 {ReduceOp::kMin, 1},
                 {ReduceOp::kMax, static_cast<double>(n)}};
    for (const Case& c : cases) {
      at::Tensor t = at::full({5}, r + 1, opts);
      WCHECK_OK(pg.AllReduce({t}, c.op)->Wait(kWait));
      if (!AllEqual(t, c.expected)) {
        std::fprintf(stderr, "all_reduce %s %s: got %f, expected %f\n",
                     std::string(ReduceOpName(c.op)).c_str(), c10::toString(type),
                     t.cpu().to(at::kDouble)[0].item<double>(), c.expected);
        WCHECK(false);
      }
    }
  }
  // AVG: exact mean for floats, rejected for integers.
  at::Tensor f = at::full({3}, r + 1.0, at::TensorOptions().device(w.device()));
  WCHECK_OK(pg.AllReduce({f}, ReduceOp::kAvg)->Wait(kWait));
  WCHECK(AllEqual(f, (n + 1) / 2.0));
  at::Tensor i = at::full({3}, r, at::TensorOptions().device(w.device()).dtype(at::kInt));
  WCHECK_CODE(pg.AllReduce({i}, ReduceOp::kAvg)->Wait(kWait), absl::StatusCode::kInvalidArgument,
              "avg is not exact for int32");
  if (w.backend == "nccl") {
    // bool travels as uint8: sum and max mean "or", min means "and".
    const auto bopts = at::TensorOptions().device(w.device()).dtype(at::kBool);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      at::Tensor b = at::full({4}, r == 0, bopts);
      WCHECK_OK(pg.AllReduce({b}, op)->Wait(kWait));
      const bool any_rank = true;      // rank 0 holds true
      const bool every_rank = n == 1;  // the others hold false
      WCHECK(b.all().item<bool>() == (op == ReduceOp::kMin ? every_rank : any_rank));
    }
    // int16 and complex are refused with the dtype named.
    WCHECK_CODE(pg.AllReduce({at::ones({2}, opts_for(w, at::kShort))})->Wait(kWait),
                absl::StatusCode::kInvalidArgument, "cannot reduce dtype Short");
  }
  if (w.backend == "gloo") {
    at::Tensor b = at::full({4}, r == 0, at::TensorOptions().dtype(at::kBool));
    WCHECK_OK(pg.AllReduce({b}, ReduceOp::kMax)->Wait(kWait));
    WCHECK(b.all().item<bool>());
    b.fill_(r == 0);
    WCHECK_OK(pg.AllReduce({b}, ReduceOp::kMin)->Wait(kWait));
    // "and" over ranks: only rank 0 holds true.
    WCHECK(b.all().item<bool>() == (n == 1) && b.any().item<bool>() == (n == 1));
    // A list of tensors on one process is reduced too (the multigpu form).
    at::Tensor a = at::full({4}, r + 1.0), c = at::full({4}, 10.0 * (r + 1));
    WCHECK_OK(pg.AllReduce({a, c})->Wait(kWait));
    WCHECK(AllEqual(a, 11 * n * (n + 1) / 2.0) && AllEqual(c, 11 * n * (n + 1) / 2.0));
    // Complex sums.
    at::Tensor z = at::full({2}, c10::complex<float>(r, 1), at::kComplexFloat);
    WCHECK_OK(pg.AllReduce({z})->Wait(kWait));
    WCHECK(at::real(z).eq(n * (n - 1) / 2.0).all().item<bool>());
    WCHECK(at::imag(z).eq(n).all().item<bool>());
  }
  // Large enough for several gloo segments, odd element count.
  at::Tensor big = at::full({3 * 1024 * 1024 + 7}, r + 1.0, at::TensorOptions().device(w.device()));
  WCHECK_OK(pg.AllReduce({big})->Wait(kWait));
  WCHECK(AllEqual(big, n * (n + 1) / 2.0));
}

void CheckDataMovement(ProcessGroup& pg, const Worker& w) {
  const int n = w.world, r = w.rank;
  const auto opts = at::TensorOptions().device(w.device());
  // broadcast from the last rank.
  at::Tensor t = at::full({7}, 1.0 * r, opts);
  WCHECK_OK(pg.Broadcast({t}, n - 1)->Wait(kWait));
  WCHECK(AllEqual(t, n - 1));
  // reduce to rank 0 (and to the last rank with max).
  t = at::full({6}, r + 1.0, opts);
  WCHECK_OK(pg.Reduce({t}, 0)->Wait(kWait));
  if (r == 0) WCHECK(AllEqual(t, n * (n + 1) / 2.0));
  t = at::full({6}, r + 1.0, opts);
  WCHECK_OK(pg.Reduce({t}, n - 1, ReduceOp::kMax)->Wait(kWait));
  if (r == n - 1) WCHECK(AllEqual(t, n));
  // all_gather
  std::vector<at::Tensor> outs;
  for (int i = 0; i < n; ++i) outs.push_back(at::full({2, 3}, -1.0, opts));
  WCHECK_OK(pg.AllGather(outs, at::full({2, 3}, 1.0 * r, opts))->Wait(kWait));
  for (int i = 0; i < n; ++i) WCHECK(AllEqual(outs[i], i));
  // gather to rank 1 (rank 0 in a world of one)
  const int gather_root = std::min(1, n - 1);
  std::vector<at::Tensor> gathered;
  if (r == gather_root) {
    for (int i = 0; i < n; ++i) gathered.push_back(at::zeros({3}, opts));
  }
  WCHECK_OK(pg.Gather(gathered, at::full({3}, 10.0 * r, opts), gather_root)->Wait(kWait));
  for (int i = 0; i < static_cast<int>(gathered.size()); ++i) {
    WCHECK(AllEqual(gathered[i], 10 * i));
  }
  // scatter from rank 0
  std::vector<at::Tensor> pieces;
  if (r == 0) {
    for (int i = 0; i < n; ++i) pieces.push_back(at::full({4}, 100.0 + i, opts));
  }
  at::Tensor piece = at::zeros({4}, opts);
  WCHECK_OK(pg.Scatter(piece, pieces, 0)->Wait(kWait));
  WCHECK(AllEqual(piece, 100 + r));
  // reduce_scatter: inputs[i] = r + i  ->  output = sum_r (r + rank)
  std::vector<at::Tensor> ins;
  for (int i = 0; i < n; ++i) ins.push_back(at::full({5}, 1.0 * (r + i), opts));
  at::Tensor out = at::zeros({5}, opts);
  WCHECK_OK(pg.ReduceScatter(out, ins)->Wait(kWait));
  WCHECK(AllEqual(out, n * r + n * (n - 1) / 2.0));
  // all_to_all: row j of rank r holds 100 r + j; afterwards row j holds
  // 100 j + r.
  at::Tensor in = at::arange(n, opts.dtype(at::kFloat)).add(100.0 * r).view({n, 1}).repeat({1, 3});
  at::Tensor a2a = at::zeros({n, 3}, opts);
  WCHECK_OK(pg.AllToAll(a2a, in)->Wait(kWait));
  for (int j = 0; j < n; ++j) WCHECK(AllEqual(a2a[j], 100 * j + r));
  // barrier, and several ops in flight at once.
  WCHECK_OK(pg.Barrier()->Wait(kWait));
  std::vector<at::Tensor> many;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 8; ++k) {
    many.push_back(at::full({1000}, 1.0 * (k + r), opts));
    works.push_back(pg.AllReduce({many.back()}));
  }
  for (int k = 0; k < 8; ++k) {
    WCHECK_OK(works[k]->Wait(kWait));
    WCHECK(works[k]->IsCompleted());
    WCHECK(AllEqual(many[k], n * k + n * (n - 1) / 2.0));
  }
  // send/recv around a ring, two tags in flight (a world of one has no
  // peer: sending to itself is refused, see the errors scenario).
  if (n == 1) return;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  at::Tensor s1 = at::full({9}, 1.0 * r, opts), s2 = at::full({9}, 50.0 + r, opts);
  at::Tensor r1 = at::zeros({9}, opts), r2 = at::zeros({9}, opts);
  WorkPtr recv2 = pg.Recv(r2, prev, 2);
  WorkPtr recv1 = pg.Recv(r1, prev, 1);
  WorkPtr send1 = pg.Send(s1, next, 1);
  WorkPtr send2 = pg.Send(s2, next, 2);
  for (const WorkPtr& p : {recv2, recv1, send1, send2}) WCHECK_OK(p->Wait(kWait));
  WCHECK(AllEqual(r1, prev) && AllEqual(r2, 50 + prev));
}

#ifdef BATON_TEST_WITH_NCCL
// A producer on a side stream: the collective waits (an event, not the
// host) for the caller's current stream, so it reduces what the producer
// wrote, after milliseconds of queued GPU work.
void CheckSideStreamProducer(ProcessGroup& pg, const Worker& w) {
  const c10::DeviceIndex device = w.device().index();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
  at::Tensor t;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    t = at::zeros({1 << 24}, at::TensorOptions().device(w.device()));
    for (int k = 0; k < 64; ++k) t.add_(1.0);
    WorkPtr work = pg.AllReduce({t});
    WCHECK_OK(work->Wait(kWait));
  }
  // Back on the default stream: the op is complete, its result visible.
  WCHECK(AllEqual(t, 64.0 * w.world));
}
#endif

BATON_SCENARIO(collectives) {
  Worker w = StartWorker();
  ProcessGroup pg = w.MakeGroup();
  WCHECK(pg.backend_name() == w.backend);
  WCHECK(pg.rank() == w.rank && pg.size() == w.world && pg.is_member());
  CheckReductions(pg, w);
  CheckDataMovement(pg, w);
#ifdef BATON_TEST_WITH_NCCL
  if (w.backend == "nccl") CheckSideStreamProducer(pg, w);
#endif
  WCHECK_OK(pg.Destroy());
  w.Finish();
  return 0;
}

// Bad input fails with a clear status and leaves the group usable.
BATON_SCENARIO(errors) {
  Worker w = StartWorker();
  ProcessGroup pg = w.MakeGroup();
  const auto opts = at::TensorOptions().device(w.device());
  // A tensor on the wrong device for the backend.
  at::Tensor wrong =
      w.backend == "gloo" ? at::empty({4}, at::TensorOptions().device(at::kMeta)) : at::zeros({4});
  const std::string wrong_dev = wrong.device().str();
  WCHECK_CODE(pg.AllReduce({wrong})->Wait(kWait), absl::StatusCode::kInvalidArgument,
              absl::StrCat("all_reduce #0 on group 'default' (backend ", w.backend));
  WCHECK_CODE(pg.Broadcast({wrong}, 0)->Wait(kWait), absl::StatusCode::kInvalidArgument,
              absl::StrCat("is on device ", wrong_dev, " but backend ", w.backend));
  // Non-contiguous, mismatched list, bad roots and peers, wrong counts.
  at::Tensor nc = at::zeros({4, 4}, opts).t();
  WCHECK_CODE(pg.AllReduce({nc})->Wait(kWait), absl::StatusCode::kInvalidArgument,
              "not contiguous");
  WCHECK_CODE(
      pg.AllReduce({at::zeros({2}, opts), at::zeros({2}, opts.dtype(at::kInt))})->Wait(kWait),
      absl::StatusCode::kInvalidArgument, "dtype");
  WCHECK_CODE(pg.Broadcast({at::zeros({2}, opts)}, w.world)->Wait(kWait),
              absl::StatusCode::kInvalidArgument, "root");
  WCHECK_CODE(pg.Send(at::zeros({2}, opts), w.rank)->Wait(kWait),
              absl::StatusCode::kInvalidArgument, "this rank itself");
  std::vector<at::Tensor> too_many(w.world + 1, at::zeros({2}, opts));
  WCHECK_CODE(pg.AllGather(too_many, at::zeros({2}, opts))->Wait(kWait),
              absl::StatusCode::kInvalidArgument, "output tensors");
  WCHECK_CODE(pg.AllReduce({})->Wait(kWait), absl::StatusCode::kInvalidArgument, "empty");
  // Still usable after rejected calls (no sequence number was consumed).
  at::Tensor ok = at::ones({3}, opts);
  WCHECK_OK(pg.AllReduce({ok})->Wait(kWait));
  WCHECK(AllEqual(ok, w.world));
  // Destroyed group, and a handle to no group.
  WCHECK_OK(pg.Destroy());
  WCHECK_OK(pg.Destroy());  // idempotent
  WCHECK_CODE(pg.AllReduce({ok})->Wait(kWait), absl::StatusCode::kFailedPrecondition, "destroyed");
  ProcessGroup none;
  WCHECK_CODE(none.Barrier()->Wait(kWait), absl::StatusCode::kFailedPrecondition,
              "not initialised");
  WCHECK(none.backend_name() == "none");
  w.Finish();
  return 0;
}

BATON_SCENARIO(subgroups) {
  Worker w = StartWorker();
  ProcessGroup pg = w.MakeGroup();
  // World 3: {0, 2} and {1}.
  absl::StatusOr<ProcessGroup> even = pg.NewGroup({2, 0});
  WCHECK_OK(even.status());
  absl::StatusOr<ProcessGroup> odd = pg.NewGroup({1});
  WCHECK_OK(odd.status());
  WCHECK(!pg.NewGroup({0, 0}).ok());
  WCHECK(!pg.NewGroup({0, 5}).ok());
  const auto opts = at::TensorOptions().device(w.device());
  at::Tensor t = at::full({4}, w.rank + 1.0, opts);
  if (w.rank == 1) {
    WCHECK(!even->is_member() && even->rank() == -1);
    WCHECK_CODE(even->AllReduce({t})->Wait(kWait), absl::StatusCode::kFailedPrecondition,
                "is not a member of the group (ranks [0, 2])");
    WCHECK(odd->is_member() && odd->size() == 1);
    WCHECK_OK(odd->AllReduce({t})->Wait(kWait));
    WCHECK(AllEqual(t, 2));
  } else {
    WCHECK(even->is_member() && even->size() == 2);
    WCHECK(even->rank() == (w.rank == 0 ? 0 : 1));
    WCHECK_OK(even->AllReduce({t})->Wait(kWait));
    WCHECK(AllEqual(t, 4));
    WCHECK_OK(even->Broadcast({t}, 1)->Wait(kWait));  // group rank 1 = global 2
    WCHECK_CODE(odd->Barrier()->Wait(kWait), absl::StatusCode::kFailedPrecondition, "not a member");
  }
  // The world group still works alongside.
  at::Tensor all = at::ones({2}, opts);
  WCHECK_OK(pg.AllReduce({all})->Wait(kWait));
  WCHECK(AllEqual(all, 3));
  w.Finish();
  return 0;
}

// Debug mode (BATON_COMM_DEBUG=1): mismatched ops and shapes are reported.
BATON_SCENARIO(fingerprint_mismatch) {
  Worker w = StartWorker();
  GroupOptions options;
  options.timeout = absl::Seconds(20);
  ProcessGroup pg = w.MakeGroup(options);
  const auto opts = at::TensorOptions().device(w.device());
  at::Tensor t = at::ones({4}, opts);
  WCHECK_OK(pg.AllReduce({t})->Wait(kWait));  // agreement passes
  absl::Status s = w.rank == 0 ? pg.AllReduce({t})->Wait(kWait) : pg.Broadcast({t}, 0)->Wait(kWait);
  WCHECK_CODE(s, absl::StatusCode::kFailedPrecondition, "ranks disagree");
  WCHECK(absl::StrContains(s.message(), "called broadcast(root=0) float32[4]"));
  WCHECK(absl::StrContains(s.message(), "called all_reduce(sum) float32[4]"));
  WCHECK(absl::StrContains(s.message(), "rank 1"));
  // Shapes.
  at::Tensor u = at::ones({w.rank == 0 ? 4 : 5}, opts);
  s = pg.AllReduce({u})->Wait(kWait);
  WCHECK_CODE(s, absl::StatusCode::kFailedPrecondition, "float32[5]");
  w.Finish();
  return 0;
}

// Rank 2 never calls the collective: the others fail naming it.
BATON_SCENARIO(timeout_names_missing) {
  Worker w = StartWorker();
  GroupOptions options;
  options.timeout = absl::Seconds(2);
  ProcessGroup pg = w.MakeGroup(options);
  const auto opts = at::TensorOptions().device(w.device());
  at::Tensor t = at::ones({16}, opts);
  WCHECK_OK(pg.AllReduce({t})->Wait(kWait));
  if (w.rank != 2) {
    absl::Status s = pg.AllReduce({t})->Wait(kWait);
    WCHECK_CODE(s, absl::StatusCode::kDeadlineExceeded, "all_reduce #1 on group 'default'");
    WCHECK(absl::StrContains(s.message(), "ranks [2] never arrived"));
    // The group is aborted now: fail fast.
    WCHECK_CODE(pg.Barrier()->Wait(absl::Seconds(5)), absl::StatusCode::kFailedPrecondition,
                "aborted");
  }
  // Work::Wait itself is bounded too.
  w.Finish();
  return 0;
}

class CollectiveSuite : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

void Expect(const std::string& scenario, const std::string& backend, int world,
            std::map<std::string, std::string> env = {}) {
  const std::string why = WhyUnavailable(backend, world);
  if (!why.empty()) GTEST_SKIP() << "skipped: " << why;
  for (const auto& [k, v] : BackendEnv(backend)) env[k] = v;
  const std::vector<WorkerResult> results = RunWorkers(scenario, world, absl::Seconds(120), env);
  for (const WorkerResult& r : results) {
    ASSERT_TRUE(r.exit_code == 0 && r.signal == 0 && !r.timed_out) << Describe(results);
  }
}

TEST_P(CollectiveSuite, AllOps) {
  Expect("collectives", std::get<0>(GetParam()), std::get<1>(GetParam()));
}

TEST_P(CollectiveSuite, Errors) {
  const int world = std::get<1>(GetParam());
  if (world > 2) GTEST_SKIP() << "runs with 1 and 2 ranks only";
  Expect("errors", std::get<0>(GetParam()), world);
}

TEST_P(CollectiveSuite, Subgroups) {
  if (std::get<1>(GetParam()) != 3) GTEST_SKIP() << "runs with 3 ranks only";
  Expect("subgroups", std::get<0>(GetParam()), 3);
}

TEST_P(CollectiveSuite, DebugFingerprintReportsMismatch) {
  if (std::get<1>(GetParam()) != 2) GTEST_SKIP() << "runs with 2 ranks only";
  Expect("fingerprint_mismatch", std::get<0>(GetParam()), 2, {{"BATON_COMM_DEBUG", "1"}});
}

TEST_P(CollectiveSuite, TimeoutNamesMissingRanks) {
  if (std::get<1>(GetParam()) != 3) GTEST_SKIP() << "runs with 3 ranks only";
  Expect("timeout_names_missing", std::get<0>(GetParam()), 3);
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveSuite,
                         ::testing::Combine(::testing::ValuesIn(CompiledBackends()),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "_world",
                                               std::get<1>(info.param));
                         });

#ifndef BATON_TEST_WITHOUT_GLOO
// Ranks on one host all-reduce through shared memory
// (comm/internal/shm_allreduce.h); the suite above runs that path. These run
// Gloo's TCP path for all-reduce too, and a group where one rank turned the
// shared-memory path off (every rank must then fall back together).
TEST(GlooTcpPath, AllOpsAndTimeoutsWithoutSharedMemory) {
  Expect("collectives", "gloo", 2, {{"BATON_COMM_SHM", "0"}});
  Expect("timeout_names_missing", "gloo", 3, {{"BATON_COMM_SHM", "0"}});
}

BATON_SCENARIO(shm_off_on_one_rank) {
  if (std::getenv("RANK") != nullptr && std::string(std::getenv("RANK")) == "1") {
    setenv("BATON_COMM_SHM", "0", 1);
  }
  Worker w = StartWorker();
  ProcessGroup pg = w.MakeGroup();
  at::Tensor t = at::full({1000}, w.rank + 1.0);
  WCHECK_OK(pg.AllReduce({t})->Wait(kWait));
  WCHECK(AllEqual(t, w.world * (w.world + 1) / 2.0));
  w.Finish();
  return 0;
}

TEST(GlooTcpPath, OneRankWithoutSharedMemoryMakesAllFallBack) {
  Expect("shm_off_on_one_rank", "gloo", 3);
}
#endif

// The CPU build compiles Gloo alone, and a case asking for NCCL is told it
// is not compiled; the CUDA build (comm/cuda, BATON_TEST_WITH_NCCL) has NCCL,
// which names the GPUs a world needs.
TEST(Backends, NcclIsBuiltOnlyInTheCudaBuild) {
  const std::vector<std::string> backends = CompiledBackends();
  const bool cuda = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
  if (!cuda) {
    EXPECT_EQ(backends, std::vector<std::string>{"gloo"});
    EXPECT_EQ(WhyUnavailable("nccl", 1), "backend nccl is not compiled in this build");
    EXPECT_EQ(WhyUnavailable("gloo", 4), "");
  } else {
    EXPECT_TRUE(absl::StartsWith(WhyUnavailable("nccl", 4096), "nccl needs 4096 GPUs"))
        << WhyUnavailable("nccl", 4096);
#ifdef BATON_TEST_WITHOUT_GLOO
    // The GPU build leaves Gloo out (the pip LibTorch brings its own).
    EXPECT_EQ(backends, std::vector<std::string>{"nccl"});
    EXPECT_EQ(WhyUnavailable("gloo", 2), "backend gloo is not compiled in this build");
#endif
  }
}

#ifdef BATON_TEST_WITH_NCCL
// NCCL's own description of an error travels in the status: a
// communicator asked for a rank outside its size is refused before any
// GPU work, and NCCL says which rank.
TEST(NcclErrors, CarryNcclsDescriptionOfTheLastError) {
  const std::string why = WhyUnavailable("nccl", 1);
  if (!why.empty()) GTEST_SKIP() << "skipped: " << why;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, 1, id, 5);
  ASSERT_NE(r, ncclSuccess);
  const absl::Status s = internal::NcclStatus(r, "ncclCommInitRank");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  const std::string head = absl::StrCat("ncclCommInitRank: NCCL error ", static_cast<int>(r), " (",
                                        ncclGetErrorString(r), "): ");
  EXPECT_TRUE(absl::StartsWith(s.message(), head)) << s;
  EXPECT_GT(s.message().size(), head.size()) << s;
  std::printf("NCCL's error, as a status: %s\n", s.ToString().c_str());
}
#endif

#ifndef BATON_TEST_WITHOUT_GLOO
// In-process checks that need no peers.
TEST(ProcessGroupLocal, SingleRankAndArgumentChecks) {
  auto store = std::make_shared<store::MemoryStore>();
  EXPECT_EQ(ProcessGroup::Create(store, 1, 1, GlooBackendFactory()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProcessGroup::Create(nullptr, 0, 1, GlooBackendFactory()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ProcessGroup> pg = ProcessGroup::Create(store, 0, 1, GlooBackendFactory());
  ASSERT_TRUE(pg.ok()) << pg.status();
  at::Tensor t = at::full({3}, 2.0);
  ASSERT_TRUE(pg->AllReduce({t}, ReduceOp::kProduct)->Wait(kWait).ok());
  EXPECT_TRUE(t.eq(2).all().item<bool>());
  EXPECT_TRUE(pg->Barrier()->Wait(kWait).ok());
  EXPECT_TRUE(pg->Destroy().ok());
}

TEST(ProcessGroupLocal, RendezvousTimeoutNamesMissingRanks) {
  auto store = std::make_shared<store::MemoryStore>();
  GroupOptions options;
  options.timeout = absl::Milliseconds(300);
  absl::StatusOr<ProcessGroup> pg =
      ProcessGroup::Create(store, 0, 3, GlooBackendFactory(), options);
  ASSERT_EQ(pg.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(pg.status().message(), "1")) << pg.status();
  EXPECT_TRUE(absl::StrContains(pg.status().message(), "default")) << pg.status();
}
#endif  // BATON_TEST_WITHOUT_GLOO

}  // namespace
}  // namespace baton::comm::testing
