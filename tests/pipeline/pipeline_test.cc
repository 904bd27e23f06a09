// pipeline/pipeline.h over real workers on loopback (a driver "w0" and stage
// workers "w1".."wP"), on both same-host transports: every schedule against
// single-process training (PL1, PL2), a stage killed mid-step (PL3),
// checkpoint and restore (PL4), and the trace.
#include "pipeline/pipeline.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "testing/models.h"
#include "testing/multiprocess.h"
#include "testing/multiprocess_gtest.h"

namespace baton::pipeline {
namespace {

using baton::testing::WorkerResult;

constexpr int kIn = 8, kHidden = 16, kClasses = 4;

torch::nn::Sequential MakeModel() {
  baton::testing::MlpSpec spec;
  spec.inputs = kIn;
  spec.width = kHidden;
  spec.blocks = 4;
  spec.outputs = kClasses;
  spec.seed = 3;
  spec.dtype = torch::kFloat64;
  return baton::testing::MakeMlp(spec);
}

std::pair<torch::Tensor, torch::Tensor> Batch(int k, int64_t rows) {
  torch::manual_seed(1000 + k);
  return {torch::randn({rows, kIn}, torch::kFloat64), torch::randint(0, kClasses, {rows})};
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 const std::vector<std::string>& fragments) {
  if (s.code() != code) {
    Fail(absl::StrCat("expected code ", absl::StatusCodeToString(code), ", got ", s.ToString()));
  }
  for (const auto& f : fragments) {
    if (!absl::StrContains(s.message(), f)) {
      Fail(absl::StrCat("error '", s.ToString(), "' lacks '", f, "'"));
    }
  }
}

double MaxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) Fail(absl::StrCat(a.size(), " vs ", b.size(), " parameters"));
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

std::vector<std::string> StageNames(int p) {
  std::vector<std::string> out;
  for (int w = 1; w <= p; ++w) out.push_back(absl::StrCat("w", w));
  return out;
}

// Stage workers serve until the driver finishes. `loss` may replace the default.
int ServeStage(std::unique_ptr<rpc::RpcAgent>& agent,
               std::shared_ptr<rpc::FunctionRegistry> registry, StageServerOptions so) {
  auto server = StageServer::Create(*registry, std::move(so));
  WCHECK_OK(server.status());
  auto opts = rpc::AgentOptions::FromEnv("w");
  WCHECK_OK(opts.status());
  auto a = rpc::RpcAgent::Create(*opts, registry);
  WCHECK_OK(a.status());
  agent = std::move(*a);
  WCHECK_OK((*server)->WaitForFinish(absl::Seconds(150)));
  WCHECK_OK(agent->Shutdown());
  return 0;
}

std::unique_ptr<rpc::RpcAgent> StartDriver() {
  auto opts = rpc::AgentOptions::FromEnv("w");
  WCHECK_OK(opts.status());
  auto a = rpc::RpcAgent::Create(*opts, std::make_shared<rpc::FunctionRegistry>());
  WCHECK_OK(a.status());
  return std::move(*a);
}

PipelineOptions Options(Schedule schedule, int64_t batch) {
  PipelineOptions o;
  o.stage_workers = StageNames(schedule.spec.workers);
  o.schedule = std::move(schedule);
  o.model = MakeModel;
  o.batch_size = batch;
  o.optimizer = dist_optim::OptimizerOptions::SGD(0.1);
  o.optimizer.momentum = 0.9;
  o.step_timeout = absl::Seconds(30);
  return o;
}

// ---------------------------------------------------------------------------
BATON_SCENARIO(every_schedule) {
  std::unique_ptr<rpc::RpcAgent> agent;
  if (std::getenv("RANK") != std::string("0")) {
    return ServeStage(agent, std::make_shared<rpc::FunctionRegistry>(), {MakeModel});
  }
  agent = StartDriver();
  const int64_t batch = 8;
  for (auto build : {GPipe, OneFOneB, Interleaved1F1B}) {
    auto schedule = build({2, 4, build == Interleaved1F1B ? 2 : 1});
    WCHECK_OK(schedule.status());
    const std::string name = schedule->name;
    auto pipe = Pipeline::Create(*agent, Options(*schedule, batch));
    WCHECK_OK(pipe.status());
    // Single-process reference: LibTorch's SGD on the whole batch.
    auto model = MakeModel();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int k = 0; k < 3; ++k) {
      auto [x, y] = Batch(k, batch);
      auto r = (*pipe)->Step(x, y);
      WCHECK_OK(r.status());
      sgd.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      sgd.step();
      if (std::abs(r->loss - loss.item<double>()) > 1e-12) {
        Fail(absl::StrCat(name, " step ", k, ": loss ", r->loss, " vs ", loss.item<double>()));
      }
      WCHECK(r->step == k);
      WCHECK(r->bubble >= 0 && r->bubble < 1);
      WCHECK(!r->events.empty());
      WCHECK(r->peak_stashed.size() == 2);
      if (name == "gpipe") WCHECK(r->peak_stashed[0] == 4 && r->peak_stashed[1] == 4);
      if (name == "1f1b") WCHECK(r->peak_stashed[0] <= 2 && r->peak_stashed[1] <= 1);
      std::printf("%s step %d: %s\n", name.c_str(), k, (*pipe)->Summary(*r).c_str());
      if (k == 2) {
        const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, ".json");
        WCHECK_OK((*pipe)->WriteTrace(path, *r));
        std::ifstream in(path);
        std::stringstream ss;
        ss << in.rdbuf();
        WCHECK(absl::StrContains(ss.str(), "\"traceEvents\""));
        WCHECK(absl::StrContains(ss.str(), "\"cat\":\"backward\""));
      }
    }
    auto params = (*pipe)->Parameters();
    WCHECK_OK(params.status());
    const double diff = MaxDiff(*params, model->parameters());
    if (diff > 1e-12) Fail(absl::StrCat(name, ": parameters differ by ", diff));
    std::printf("%s: parameters equal single-process training (max diff %g)\n", name.c_str(), diff);
  }
  // Bad input is refused by the driver before anything is sent.
  auto pipe = Pipeline::Create(*agent, Options(*OneFOneB({2, 4, 1}), batch));
  WCHECK_OK(pipe.status());
  ExpectError((*pipe)->Step(torch::zeros({5, kIn}), torch::zeros({5})).status(),
              absl::StatusCode::kInvalidArgument, {"inputs must have 8 rows"});
  // A split the model cannot take is refused by name.
  auto o = Options(*OneFOneB({2, 4, 1}), batch);
  o.split = Split::Layers({0, 4, 3});
  ExpectError(Pipeline::Create(*agent, o).status(), absl::StatusCode::kInvalidArgument,
              {"strictly increasing"});
  WCHECK_OK((*pipe)->Finish());
  WCHECK_OK(agent->Shutdown());
  return 0;
}

class PipelineMultiProcess : public baton::testing::TransportTest {};
BATON_INSTANTIATE_TRANSPORTS(PipelineMultiProcess);

TEST_P(PipelineMultiProcess, PL1_PL2_EveryScheduleEqualsSingleProcessTraining) {
  auto results = Run("every_schedule", 3, absl::Seconds(180));
  baton::testing::ExpectAllSucceeded(results);
}

// ---------------------------------------------------------------------------
// The last stage's worker SIGKILLs itself in the forward of micro-batch 1 of
// the second step (its 6th loss evaluation).
BATON_SCENARIO(stage_dies) {
  std::unique_ptr<rpc::RpcAgent> agent;
  if (std::getenv("RANK") != std::string("0")) {
    StageServerOptions so{MakeModel};
    auto calls = std::make_shared<std::atomic<int>>(0);
    if (std::getenv("RANK") == std::string("2")) {
      so.loss = [calls](const torch::Tensor& out, const torch::Tensor& y) {
        if (++*calls == 6) raise(SIGKILL);
        return SumCrossEntropy(out, y);
      };
    }
    auto registry = std::make_shared<rpc::FunctionRegistry>();
    auto server = StageServer::Create(*registry, std::move(so));
    WCHECK_OK(server.status());
    auto opts = rpc::AgentOptions::FromEnv("w");
    WCHECK_OK(opts.status());
    opts->timeouts.shutdown = absl::Seconds(3);
    auto a = rpc::RpcAgent::Create(*opts, registry);
    WCHECK_OK(a.status());
    WCHECK_OK((*server)->WaitForFinish(absl::Seconds(100)));
    (void)(*a)->Shutdown();  // w2 is dead: bounded, and an error
    return 0;
  }
  auto opts = rpc::AgentOptions::FromEnv("w");
  WCHECK_OK(opts.status());
  opts->timeouts.shutdown = absl::Seconds(3);
  auto a = rpc::RpcAgent::Create(*opts, std::make_shared<rpc::FunctionRegistry>());
  WCHECK_OK(a.status());
  agent = std::move(*a);
  auto o = Options(*OneFOneB({2, 4, 1}), 8);
  o.step_timeout = absl::Seconds(20);
  auto pipe = Pipeline::Create(*agent, o);
  WCHECK_OK(pipe.status());
  auto [x, y] = Batch(0, 8);
  WCHECK_OK((*pipe)->Step(x, y).status());
  const absl::Time t0 = absl::Now();
  absl::Status s = (*pipe)->Step(x, y).status();
  const absl::Duration took = absl::Now() - t0;
  std::printf("the step failed after %s: %s\n", absl::FormatDuration(took).c_str(),
              s.ToString().c_str());
  WCHECK(took < absl::Seconds(10));
  // The dead worker and its stage, and the survivor's stage and micro-batch.
  ExpectError(s, absl::StatusCode::kUnavailable,
              {"pipeline step 1 failed", "pipeline worker 1 ('w2', stage 1)", "UNAVAILABLE",
               "pipeline worker 0 ('w1', stage 0)", "stage 0 (pipeline worker 0), micro-batch ",
               "stage 1 on worker 'w2'"});
  // The survivor is clean: a pipeline over it alone still works.
  auto solo_schedule = OneFOneB({1, 4, 1});
  auto so = Options(*solo_schedule, 8);
  so.stage_workers = {"w1"};
  auto solo = Pipeline::Create(*agent, so);
  WCHECK_OK(solo.status());
  WCHECK_OK((*solo)->Step(x, y).status());
  WCHECK_OK((*solo)->Finish());
  (void)agent->Shutdown();
  return 0;
}

TEST_P(PipelineMultiProcess, PL3_AKilledStageFailsTheStepNamingStageWorkerAndMicrobatch) {
  auto results = Run("stage_dies", 3, absl::Seconds(120));
  EXPECT_EQ(results[0].exit_code, 0) << baton::testing::Describe(results);
  EXPECT_EQ(results[1].exit_code, 0) << baton::testing::Describe(results);
  EXPECT_EQ(results[2].signal, SIGKILL) << baton::testing::Describe(results);
}

// ---------------------------------------------------------------------------
BATON_SCENARIO(checkpoint_restore) {
  std::unique_ptr<rpc::RpcAgent> agent;
  if (std::getenv("RANK") != std::string("0")) {
    return ServeStage(agent, std::make_shared<rpc::FunctionRegistry>(), {MakeModel});
  }
  agent = StartDriver();
  const std::string dir =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/ckpt-", std::getenv("BATON_TRANSPORT"));
  std::filesystem::remove_all(dir);
  auto o = Options(*Interleaved1F1B({2, 4, 2}), 8);
  o.optimizer = dist_optim::OptimizerOptions::Adam(0.01);
  o.checkpoint_dir = dir;
  auto a = Pipeline::Create(*agent, o);
  WCHECK_OK(a.status());
  WCHECK((*a)->restored_step() == -1);
  for (int k = 0; k < 2; ++k) {
    auto [x, y] = Batch(k, 8);
    WCHECK_OK((*a)->Step(x, y).status());
  }
  WCHECK_OK((*a)->SaveCheckpoint());
  WCHECK(std::filesystem::exists(dir + "/LATEST"));
  WCHECK(std::filesystem::exists(dir + "/step-2/worker-0.state"));
  for (int k = 2; k < 4; ++k) {
    auto [x, y] = Batch(k, 8);
    WCHECK_OK((*a)->Step(x, y).status());
  }
  auto want = (*a)->Parameters();
  WCHECK_OK(want.status());
  // A new driver (as after a restart) resumes from step 2 and reproduces steps 2-3.
  auto b = Pipeline::Create(*agent, o);
  WCHECK_OK(b.status());
  WCHECK((*b)->restored_step() == 2);
  WCHECK((*b)->steps_done() == 2);
  for (int k = 2; k < 4; ++k) {
    auto [x, y] = Batch(k, 8);
    WCHECK_OK((*b)->Step(x, y).status());
  }
  auto got = (*b)->Parameters();
  WCHECK_OK(got.status());
  const double diff = MaxDiff(*got, *want);
  if (diff != 0) Fail(absl::StrCat("restored training differs by ", diff));
  // A checkpoint of another split is refused by name.
  auto other = o;
  other.schedule = *OneFOneB({2, 4, 1});
  ExpectError(Pipeline::Create(*agent, other).status(), absl::StatusCode::kInvalidArgument,
              {"configuring the pipeline failed", "pipeline worker 0 ('w1'", "chunks"});
  WCHECK_OK((*b)->Finish());
  WCHECK_OK(agent->Shutdown());
  return 0;
}

TEST_P(PipelineMultiProcess, PL4_ARestoredPipelineContinuesBitIdentically) {
  baton::testing::ExpectAllSucceeded(Run("checkpoint_restore", 3, absl::Seconds(120)));
}

}  // namespace
}  // namespace baton::pipeline
