// pipeline/stage.h: runners of every schedule, connected in one process by
// LocalStageLink and driven on threads, against single-process training.
// Tests are named after the guarantees PP1-PP8; the split helpers of
// pipeline/model.h are tested at the end.
#include "pipeline/stage.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <thread>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "pipeline/model.h"
#include "pipeline/schedule.h"
#include "testing/eventually.h"

namespace baton::pipeline {
namespace {

constexpr int kIn = 8, kHidden = 16, kClasses = 4;

// 9 layers: 4 x [Linear, ReLU] + Linear.
torch::nn::Sequential MakeModel(torch::Dtype dtype) {
  torch::manual_seed(7);
  torch::nn::Sequential m;
  int in = kIn;
  for (int i = 0; i < 4; ++i) {
    m->push_back(torch::nn::Linear(in, kHidden));
    m->push_back(torch::nn::ReLU());
    in = kHidden;
  }
  m->push_back(torch::nn::Linear(kHidden, kClasses));
  m->to(dtype);
  return m;
}

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> MakeBatches(int n, int64_t rows, torch::Dtype dtype) {
  torch::manual_seed(99);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({torch::randn({rows, kIn}).to(dtype), torch::randint(0, kClasses, {rows})});
  }
  return out;
}

using Builder = std::function<absl::StatusOr<Schedule>(ScheduleSpec)>;

dist_optim::OptimizerOptions Sgd() {
  auto o = dist_optim::OptimizerOptions::SGD(0.1);
  o.momentum = 0.9;
  return o;
}

// p runners of one schedule, each with its own copy of the model (as
// separate processes would have), driven step by step on p threads.
class LocalPipeline {
 public:
  LocalPipeline(const Schedule& schedule, torch::Dtype dtype, int64_t batch,
                dist_optim::OptimizerOptions opt = Sgd(), torch::Device device = torch::kCPU)
      : schedule_(schedule) {
    const ScheduleSpec& spec = schedule.spec;
    for (int w = 0; w < spec.workers; ++w) {
      torch::nn::Sequential model = MakeModel(dtype);
      auto cuts = ComputeCuts(*model, spec.stages(), Split::ByParameters());
      EXPECT_TRUE(cuts.ok()) << cuts.status();
      std::vector<torch::nn::Sequential> chunks;
      for (int c = 0; c < spec.chunks; ++c) {
        const int s = c * spec.workers + w;
        chunks.push_back(Slice(*model, (*cuts)[s], (*cuts)[s + 1]));
      }
      StageConfig config{spec, w, schedule.per_worker[w], batch, opt};
      config.device = device;
      auto r = StageRunner::Create(config, std::move(chunks));
      EXPECT_TRUE(r.ok()) << r.status();
      runners_.push_back(std::move(*r));
    }
    std::vector<StageRunner*> raw;
    for (auto& r : runners_) raw.push_back(r.get());
    link_ = std::make_unique<LocalStageLink>(raw);
  }

  // Runs one step on every worker not in `skip`; a worker that fails aborts
  // the others (as the driver does). Returns the loss, or, as the driver
  // reports a failed step, every failed worker's error, causes first: a
  // worker whose send was refused because its neighbour had already ended
  // the step (FAILED_PRECONDITION "already ended") failed because of that
  // neighbour's failure, whichever thread noticed first. The code is the
  // first cause's.
  absl::StatusOr<double> Step(int64_t step, const Batch& b, std::vector<int> skip = {},
                              absl::Duration timeout = absl::Seconds(20)) {
    const int p = schedule_.spec.workers;
    const int last = schedule_.spec.worker_of(schedule_.spec.stages() - 1);
    std::vector<absl::StatusOr<StepReport>> results(p, absl::UnknownError("not run"));
    absl::Mutex failed_mu;
    std::vector<int> failed;  // in the order the workers failed
    std::vector<std::thread> threads;
    const absl::Time deadline = absl::Now() + timeout;
    for (int w = 0; w < p; ++w) {
      if (std::find(skip.begin(), skip.end(), w) != skip.end()) continue;
      threads.emplace_back([&, w] {
        StepInputs in{step, w == 0 ? b.x : torch::Tensor(), w == last ? b.y : torch::Tensor(),
                      deadline};
        results[w] = runners_[w]->RunStep(in, *link_);
        if (!results[w].ok()) {
          {
            absl::MutexLock lock(&failed_mu);
            failed.push_back(w);
          }
          for (int o = 0; o < p; ++o) {
            if (o != w) runners_[o]->Abort(step, results[w].status());
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    reports_.clear();
    if (!failed.empty()) {
      std::stable_partition(failed.begin(), failed.end(), [&](int w) {
        const absl::Status& st = results[w].status();
        return !(absl::IsFailedPrecondition(st) &&
                 absl::StrContains(st.message(), "already ended on pipeline worker"));
      });
      std::vector<std::string> parts;
      for (int w : failed) {
        parts.push_back(absl::StrCat("pipeline worker ", w, ": ", results[w].status().ToString()));
      }
      return absl::Status(results[failed.front()].status().code(), absl::StrJoin(parts, "; "));
    }
    for (int w = 0; w < p; ++w) {
      if (std::find(skip.begin(), skip.end(), w) != skip.end()) continue;
      reports_.push_back(*results[w]);
    }
    double loss = 0;
    for (double l : results[last]->losses) loss += l;
    return loss;
  }

  std::vector<torch::Tensor> Parameters() const {  // in stage order
    std::vector<torch::Tensor> out;
    const ScheduleSpec& spec = schedule_.spec;
    for (int s = 0; s < spec.stages(); ++s) {
      auto p = runners_[spec.worker_of(s)]->StageParameters(s);
      out.insert(out.end(), p.begin(), p.end());
    }
    return out;
  }

  StageRunner& runner(int w) { return *runners_[w]; }
  LocalStageLink& link() { return *link_; }
  const std::vector<StepReport>& reports() const { return reports_; }

 private:
  Schedule schedule_;
  std::vector<std::unique_ptr<StageRunner>> runners_;
  std::unique_ptr<LocalStageLink> link_;
  std::vector<StepReport> reports_;
};

// Single-process training on the whole batch, LibTorch's own SGD.
struct Reference {
  explicit Reference(torch::Dtype dtype) : model(MakeModel(dtype)) {
    opt = std::make_unique<torch::optim::SGD>(model->parameters(),
                                              torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  double Step(const Batch& b) {
    opt->zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(b.x), b.y);
    loss.backward();
    opt->step();
    return loss.item<double>();
  }
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::SGD> opt;
};

void ExpectClose(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                 double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = (a[i].cpu() - b[i].cpu()).abs().max().item<double>();
    EXPECT_LE(diff, tol) << what << " parameter " << i;
  }
}

struct Case {
  std::string name;
  Builder build;
  int p, m, v;
};

std::vector<Case> Cases() {
  return {{"gpipe", GPipe, 1, 1, 1},
          {"gpipe", GPipe, 2, 4, 1},
          {"gpipe", GPipe, 3, 2, 1},
          {"gpipe", GPipe, 2, 4, 2},
          {"1f1b", OneFOneB, 2, 1, 1},
          {"1f1b", OneFOneB, 2, 4, 1},
          {"1f1b", OneFOneB, 4, 8, 1},
          {"1f1b", OneFOneB, 3, 2, 1},
          {"interleaved", Interleaved1F1B, 2, 4, 2},
          {"interleaved", Interleaved1F1B, 2, 2, 4},
          {"interleaved", Interleaved1F1B, 4, 4, 2}};
}

TEST(PP2_SameAsOneProcess, EverySchedulePTimesMTimesVFloat64And32) {
  for (const Case& c : Cases()) {
    for (torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) {
      const std::string what = absl::StrCat(c.name, " p=", c.p, " m=", c.m, " v=", c.v,
                                            dtype == torch::kFloat64 ? " float64" : " float32");
      auto s = c.build({c.p, c.m, c.v});
      ASSERT_TRUE(s.ok()) << what << ": " << s.status();
      const int64_t batch = 4 * c.m;
      LocalPipeline pipe(*s, dtype, batch);
      Reference ref(dtype);
      const auto batches = MakeBatches(3, batch, dtype);
      const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-6;
      for (int k = 0; k < 3; ++k) {
        auto loss = pipe.Step(k, batches[k]);
        ASSERT_TRUE(loss.ok()) << what << ": " << loss.status();
        const double ref_loss = ref.Step(batches[k]);
        EXPECT_NEAR(*loss, ref_loss, tol * std::max(1.0, std::abs(ref_loss))) << what;
      }
      ExpectClose(pipe.Parameters(), ref.model->parameters(), tol, what);
    }
  }
}

TEST(PP1_ScheduleAsData, EachWorkerRunsItsComputeActionsInListOrder) {
  for (const Case& c : Cases()) {
    auto s = c.build({c.p, c.m, c.v});
    ASSERT_TRUE(s.ok());
    LocalPipeline pipe(*s, torch::kFloat64, 2 * c.m);
    ASSERT_TRUE(pipe.Step(0, MakeBatches(1, 2 * c.m, torch::kFloat64)[0]).ok());
    for (const StepReport& r : pipe.reports()) {
      std::vector<Action> want, got;
      for (const Action& a : s->per_worker[r.worker]) {
        if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) want.push_back(a);
      }
      for (const TimelineEvent& e : r.events) {
        if (e.action.kind == ActionKind::kForward || e.action.kind == ActionKind::kBackward) {
          got.push_back(e.action);
          EXPECT_LE(e.start, e.end);
        }
      }
      EXPECT_EQ(got, want) << c.name << " worker " << r.worker;
    }
  }
}

TEST(PP3_ActivationMemory, GPipeStashesMTimesChunksOneFOneBAtMostPMinusW) {
  const int p = 4, m = 8;
  auto g = GPipe({p, m, 1});
  LocalPipeline gp(*g, torch::kFloat32, 2 * m);
  ASSERT_TRUE(gp.Step(0, MakeBatches(1, 2 * m, torch::kFloat32)[0]).ok());
  for (const StepReport& r : gp.reports()) EXPECT_EQ(r.peak_stashed, m) << r.worker;

  auto g2 = GPipe({2, 4, 2});
  LocalPipeline gp2(*g2, torch::kFloat32, 8);
  ASSERT_TRUE(gp2.Step(0, MakeBatches(1, 8, torch::kFloat32)[0]).ok());
  for (const StepReport& r : gp2.reports()) EXPECT_EQ(r.peak_stashed, 8) << r.worker;

  auto o = OneFOneB({p, m, 1});
  LocalPipeline op(*o, torch::kFloat32, 2 * m);
  ASSERT_TRUE(op.Step(0, MakeBatches(1, 2 * m, torch::kFloat32)[0]).ok());
  for (const StepReport& r : op.reports()) {
    EXPECT_LE(r.peak_stashed, p - r.worker) << r.worker;
    EXPECT_GE(r.peak_stashed, 1);
  }
}

TEST(PP4_DirectDataPath, OnlyStageZeroGetsInputsAndOnlyTheLastStageTargets) {
  auto s = OneFOneB({2, 2, 1});
  LocalPipeline pipe(*s, torch::kFloat32, 4);
  const Batch b = MakeBatches(1, 4, torch::kFloat32)[0];
  // The last worker without targets, or the first without inputs: refused by name.
  StepInputs in{0, torch::Tensor(), torch::Tensor(), absl::Now() + absl::Seconds(5)};
  auto r = pipe.runner(1).RunStep(in, pipe.link());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "targets must have 4 rows; got none"))
      << r.status();
  // Step 0 ended on worker 1, so a later step is needed; worker 0 is fresh.
  ASSERT_TRUE(pipe.Step(1, b).ok());
  double losses = 0;
  for (const StepReport& rep : pipe.reports()) {
    if (rep.worker == 0) {
      EXPECT_TRUE(rep.losses.empty());
    }
    for (double l : rep.losses) losses += l;
  }
  EXPECT_GT(losses, 0);
}

TEST(PP5_FailureIsContained, BadTargetNamesStageAndMicrobatchAndChangesNothing) {
  for (const Case& c : Cases()) {
    if (c.p < 2) continue;
    auto s = c.build({c.p, c.m, c.v});
    const int64_t batch = 2 * c.m;
    LocalPipeline pipe(*s, torch::kFloat64, batch);
    Reference ref(torch::kFloat64);
    auto batches = MakeBatches(2, batch, torch::kFloat64);
    ASSERT_TRUE(pipe.Step(0, batches[0]).ok());
    ref.Step(batches[0]);
    std::vector<torch::Tensor> before;
    for (const auto& t : pipe.Parameters()) before.push_back(t.clone());
    Batch bad = batches[1];
    bad.y = bad.y.clone();
    bad.y[batch - 1] = 17;  // a class that does not exist, in the last micro-batch
    auto r = pipe.Step(1, bad);
    ASSERT_FALSE(r.ok()) << c.name;
    const std::string msg(r.status().message());
    EXPECT_TRUE(absl::StrContains(msg, absl::StrCat("stage ", c.p * c.v - 1)) &&
                absl::StrContains(msg, absl::StrCat("micro-batch ", c.m - 1)) &&
                absl::StrContains(msg, "forward failed"))
        << c.name << ": " << msg;
    // No worker stepped: the parameters are still those after step 0.
    ExpectClose(pipe.Parameters(), before, 0, c.name + " after the failure");
    // The next step starts clean and matches the reference.
    ASSERT_TRUE(pipe.Step(2, batches[1]).ok()) << c.name;
    ref.Step(batches[1]);
    ExpectClose(pipe.Parameters(), ref.model->parameters(), 1e-12, c.name + " next step");
  }
}

TEST(PP5_FailureIsContained, DeadNeighbourIsNamedWithTheMicrobatchWithinTheDeadline) {
  auto s = OneFOneB({3, 4, 1});
  LocalPipeline pipe(*s, torch::kFloat32, 8);
  const Batch b = MakeBatches(1, 8, torch::kFloat32)[0];
  pipe.link().Kill(1);
  const absl::Time t0 = absl::Now();
  auto r = pipe.Step(0, b, /*skip=*/{1}, absl::Seconds(2));
  ASSERT_FALSE(r.ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  const std::string msg(r.status().message());
  // Worker 0's first send fails (UNAVAILABLE) or worker 2 times out waiting.
  EXPECT_TRUE(absl::StrContains(msg, "local worker 1")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "micro-batch 0")) << msg;
  EXPECT_TRUE(r.status().code() == absl::StatusCode::kUnavailable ||
              r.status().code() == absl::StatusCode::kDeadlineExceeded)
      << r.status();
}

TEST(PP5_FailureIsContained, AbortWakesAWaitingWorker) {
  auto s = OneFOneB({2, 2, 1});
  LocalPipeline pipe(*s, torch::kFloat32, 4);
  std::thread aborter([&] {
    // Once worker 1 waits for stage 0's activation (its activity says so
    // just before the wait; worker 0 never runs, so it stays there).
    const bool waiting = baton::testing::Eventually([&] {
      const StageRunner::Activity a = pipe.runner(1).CurrentActivity();
      return a.step == 0 && a.waits_for_stage == 0;
    });
    EXPECT_TRUE(waiting);
    pipe.runner(1).Abort(0, absl::CancelledError("the driver gave up"));
  });
  StepInputs in{0, torch::Tensor(), MakeBatches(1, 4, torch::kFloat32)[0].y,
                absl::Now() + absl::Seconds(20)};
  const absl::Time t0 = absl::Now();
  auto r = pipe.runner(1).RunStep(in, pipe.link());  // worker 0 never runs
  aborter.join();
  ASSERT_FALSE(r.ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                "stage 1 (pipeline worker 1), micro-batch 0: waiting for the "
                                "activation from stage 0 on local worker 0"))
      << r.status();
}

TEST(PP6_Checkpoint, RestoredRunnersContinueBitIdentically) {
  auto s = Interleaved1F1B({2, 4, 2});
  auto opt = dist_optim::OptimizerOptions::Adam(0.01);
  LocalPipeline a(*s, torch::kFloat32, 8, opt);
  const auto batches = MakeBatches(4, 8, torch::kFloat32);
  ASSERT_TRUE(a.Step(0, batches[0]).ok());
  ASSERT_TRUE(a.Step(1, batches[1]).ok());
  std::vector<std::string> saved;
  for (int w = 0; w < 2; ++w) saved.push_back(*a.runner(w).SaveState());
  ASSERT_TRUE(a.Step(2, batches[2]).ok());
  ASSERT_TRUE(a.Step(3, batches[3]).ok());

  LocalPipeline b(*s, torch::kFloat32, 8, opt);  // fresh init
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(b.runner(w).LoadState(saved[w]).ok());
    EXPECT_EQ(b.runner(w).steps_taken(), 2);
  }
  ASSERT_TRUE(b.Step(2, batches[2]).ok());
  ASSERT_TRUE(b.Step(3, batches[3]).ok());
  ExpectClose(b.Parameters(), a.Parameters(), 0, "restored");
}

TEST(PP6_Checkpoint, BadStatesAreRejectedAndChangeNothing) {
  auto s = OneFOneB({2, 2, 1});
  LocalPipeline a(*s, torch::kFloat32, 4);
  const std::string good = *a.runner(0).SaveState();
  const auto before = a.runner(0).Parameters()[0].clone();
  EXPECT_EQ(a.runner(0).LoadState("garbage").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a.runner(0).LoadState(good.substr(0, good.size() - 3)).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(a.runner(0).LoadState(good + "x").code(), absl::StatusCode::kDataLoss);
  // Worker 1's state on worker 0: another stage.
  absl::Status other = a.runner(0).LoadState(*a.runner(1).SaveState());
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_TRUE(absl::StrContains(other.message(), "is stage 1")) << other;
  EXPECT_TRUE(torch::equal(a.runner(0).Parameters()[0], before));
}

TEST(PP7_BadMessages, AreRejectedByName) {
  auto s = OneFOneB({2, 2, 1});
  LocalPipeline pipe(*s, torch::kFloat32, 4);
  StageRunner& w1 = pipe.runner(1);  // owns stage 1, the last
  const torch::Tensor t = torch::ones({2, kHidden});
  auto deliver = [&](int64_t step, MessageKind k, int stage, int mb, torch::Tensor x) {
    return w1.Deliver({step, k, stage, mb, std::move(x)});
  };
  absl::Status s1 = deliver(0, MessageKind::kActivation, 0, 0, t);
  EXPECT_EQ(s1.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s1.message(), "does not own that stage")) << s1;
  absl::Status s2 = deliver(0, MessageKind::kActivation, 1, 5, t);
  EXPECT_TRUE(absl::StrContains(s2.message(), "the step has 2 micro-batches")) << s2;
  absl::Status s3 = deliver(0, MessageKind::kGradient, 1, 0, t);
  EXPECT_TRUE(absl::StrContains(s3.message(), "stage 1 never receives a gradient")) << s3;
  absl::Status s4 = deliver(0, MessageKind::kActivation, 1, 0, torch::Tensor());
  EXPECT_TRUE(absl::StrContains(s4.message(), "no tensor")) << s4;
  absl::Status s5 = deliver(0, static_cast<MessageKind>(7), 1, 0, t);
  EXPECT_TRUE(absl::StrContains(s5.message(), "unknown kind 7")) << s5;
  EXPECT_TRUE(deliver(0, MessageKind::kActivation, 1, 0, t).ok());
  EXPECT_EQ(deliver(0, MessageKind::kActivation, 1, 0, t).code(), absl::StatusCode::kAlreadyExists);
  // Flooding with future steps stops at 2 x stages x microbatches pending.
  int accepted = 1;
  absl::Status last;
  for (int step = 1; step < 100 && last.ok(); ++step) {
    last = deliver(step, MessageKind::kActivation, 1, 0, t);
    if (last.ok()) ++accepted;
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(accepted, 8);
  // A wrong-shaped activation fails the step by name, not the process.
  auto bad = torch::ones({2, kHidden + 1});
  LocalPipeline p2(*s, torch::kFloat32, 4);
  ASSERT_TRUE(p2.runner(1).Deliver({0, MessageKind::kActivation, 1, 0, bad}).ok());
  StepInputs in{0, torch::Tensor(), MakeBatches(1, 4, torch::kFloat32)[0].y,
                absl::Now() + absl::Seconds(5)};
  auto r = p2.runner(1).RunStep(in, p2.link());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                "stage 1 (pipeline worker 1), micro-batch 0: forward failed"))
      << r.status();
  // Step 0 has ended on worker 1: its late messages are stale.
  EXPECT_EQ(p2.runner(1).Deliver({0, MessageKind::kActivation, 1, 1, t}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(PP8_Timeline, EventsCoverTheStepAndComputeTimeIsCounted) {
  auto s = OneFOneB({2, 4, 1});
  LocalPipeline pipe(*s, torch::kFloat32, 8);
  ASSERT_TRUE(pipe.Step(0, MakeBatches(1, 8, torch::kFloat32)[0]).ok());
  for (const StepReport& r : pipe.reports()) {
    double compute = 0;
    int sends = 0;
    for (const TimelineEvent& e : r.events) {
      EXPECT_EQ(e.worker, r.worker);
      if (e.action.kind == ActionKind::kForward || e.action.kind == ActionKind::kBackward) {
        compute += e.end - e.start;
      }
      if (e.action.kind == ActionKind::kSendActivation ||
          e.action.kind == ActionKind::kSendGradient) {
        ++sends;
      }
    }
    EXPECT_DOUBLE_EQ(compute, r.compute_us);
    EXPECT_EQ(sends, 4) << r.worker;  // four activations out of 0, four gradients out of 1
    EXPECT_GT(r.compute_us, 0);
  }
}

// The part of PP9 that runs without a GPU: a device this process cannot use
// is refused by name (the GPU run: bench/pipeline_bench --device cuda).
TEST(PP9_Device, ADeviceThisProcessCannotUseIsRefusedByName) {
  auto s = OneFOneB({2, 4, 1});
  auto model = MakeModel(torch::kFloat32);
  const int64_t gpus = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  StageConfig config{s->spec, 0, s->per_worker[0], 8, Sgd()};
  config.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(gpus));
  absl::Status st = StageRunner::Create(config, {Slice(*model, 0, 2)}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(
      st.message(), absl::StrCat("stage config: device is cuda:", gpus, ", but this process sees ",
                                 gpus, " CUDA device(s)")))
      << st;
  config.device = torch::kCPU;
  EXPECT_TRUE(StageRunner::Create(config, {Slice(*model, 0, 2)}).ok());
}

// PP9 with PP6, on a GPU: a checkpoint taken on the host restores onto a
// GPU, whose runners then train on as the host's do, and one taken on the
// GPU restores onto the host (checkpoints are host bytes).
TEST(PP9_Device, CheckpointsMoveBetweenTheHostAndAGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto s = OneFOneB({2, 4, 1});
  const torch::Device gpu(torch::kCUDA, 0);
  const auto batches = MakeBatches(3, 8, torch::kFloat32);
  LocalPipeline host(*s, torch::kFloat32, 8);
  ASSERT_TRUE(host.Step(0, batches[0]).ok());
  std::vector<std::string> saved;
  for (int w = 0; w < 2; ++w) saved.push_back(*host.runner(w).SaveState());

  LocalPipeline device(*s, torch::kFloat32, 8, Sgd(), gpu);  // fresh init
  for (int w = 0; w < 2; ++w) {
    absl::Status loaded = device.runner(w).LoadState(saved[w]);
    ASSERT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ(device.runner(w).steps_taken(), 1);
  }
  for (const torch::Tensor& p : device.Parameters()) EXPECT_TRUE(p.is_cuda());
  ExpectClose(device.Parameters(), host.Parameters(), 0, "restored onto the GPU");
  for (int step = 1; step < 3; ++step) {
    absl::StatusOr<double> on_host = host.Step(step, batches[step]);
    absl::StatusOr<double> on_device = device.Step(step, batches[step]);
    ASSERT_TRUE(on_host.ok()) << on_host.status();
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    EXPECT_NEAR(*on_device, *on_host, 1e-4 * std::max(1.0, std::abs(*on_host))) << step;
  }
  ExpectClose(device.Parameters(), host.Parameters(), 1e-4, "trained on after the restore");

  LocalPipeline back(*s, torch::kFloat32, 8);
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<std::string> state = device.runner(w).SaveState();
    ASSERT_TRUE(state.ok()) << state.status();
    ASSERT_TRUE(back.runner(w).LoadState(*state).ok());
  }
  ExpectClose(back.Parameters(), device.Parameters(), 0, "restored onto the host");
}

TEST(StageConfig, MismatchesAreInvalidArgument) {
  auto s = OneFOneB({2, 4, 1});
  auto model = MakeModel(torch::kFloat32);
  auto make = [&](int worker, int64_t batch, int chunks) {
    std::vector<torch::nn::Sequential> mods;
    for (int c = 0; c < chunks; ++c) mods.push_back(Slice(*model, 0, 2));
    return StageRunner::Create({s->spec, worker, s->per_worker[0], batch, Sgd()}, mods).status();
  };
  EXPECT_TRUE(
      absl::StrContains(make(0, 6, 1).message(), "batch 6 is not a positive multiple of 4"));
  EXPECT_TRUE(absl::StrContains(make(0, 8, 2).message(), "got 2 modules for 1 chunks"));
  EXPECT_TRUE(absl::StrContains(make(1, 8, 1).message(), "is not for worker 1"));
  auto bad_opt = Sgd();
  bad_opt.lr = -1;
  absl::Status o =
      StageRunner::Create({s->spec, 0, s->per_worker[0], 8, bad_opt}, {Slice(*model, 0, 2)})
          .status();
  EXPECT_TRUE(absl::StrContains(o.message(), "the optimizer of stage 0")) << o;
}

TEST(Split, BalancedCutsMinimiseTheLargestSlice) {
  EXPECT_EQ(BalancedCuts({1, 1, 1, 1}, 2), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(BalancedCuts({4, 1, 1, 1, 1}, 2), (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(BalancedCuts({1, 2, 3, 4, 5}, 3), (std::vector<int>{0, 3, 4, 5}));
  EXPECT_EQ(BalancedCuts({0, 0, 0}, 3), (std::vector<int>{0, 1, 2, 3}));
}

TEST(Split, ByParametersEachLayerLayersAndForwardTime) {
  auto model = MakeModel(torch::kFloat32);  // Linear(8,16)=144, Linear(16,16)=272 x3, head 68
  EXPECT_EQ(*ComputeCuts(*model, 2, Split::ByParameters()), (std::vector<int>{0, 3, 9}));
  EXPECT_EQ(ComputeCuts(*model, 2, Split::EachLayer()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ComputeCuts(*model, 3, Split::Layers({0, 2, 6, 9})), (std::vector<int>{0, 2, 6, 9}));
  absl::Status bad = ComputeCuts(*model, 3, Split::Layers({0, 6, 2, 9})).status();
  EXPECT_TRUE(absl::StrContains(bad.message(), "strictly increasing")) << bad;
  absl::Status few = ComputeCuts(*model, 10, Split::ByParameters()).status();
  EXPECT_TRUE(absl::StrContains(few.message(), "the model has 9")) << few;
  auto timed = ComputeCuts(*model, 3, Split::ByForwardTime(torch::randn({4, kIn})));
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ(timed->size(), 4u);
  absl::Status wrong = ComputeCuts(*model, 3, Split::ByForwardTime(torch::randn({4, 3}))).status();
  EXPECT_TRUE(absl::StrContains(wrong.message(), "layer 0 fails on the sample")) << wrong;
  // Slices share the model's parameters.
  auto slice = Slice(*model, 2, 4);
  EXPECT_TRUE(slice->parameters()[0].is_same(model->parameters()[2]));
}

}  // namespace
}  // namespace baton::pipeline
