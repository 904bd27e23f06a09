// pipeline/stage_server.h and the pipeline's typed messages
// (pipeline/internal/functions.h) in one process: a driver "w0" and stage
// workers "w1", "w2" on the loopback transport (testing/rpc/loopback_job.h).
// Closing a server with a step in flight (PL5), the field checks of the
// configure and deliver messages, a stale peer's signature, and a reply the
// driver refuses (PL3).
#include "pipeline/stage_server.h"

#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <torch/utils.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "obs/state.h"
#include "obs/trace.h"
#include "pipeline/driver.h"
#include "pipeline/internal/functions.h"
#include "pipeline/trace.h"
#include "testing/eventually.h"
#include "testing/models.h"
#include "testing/rpc/loopback_job.h"
#include "testing/temp_dir.h"

namespace baton::pipeline {
namespace {

using internal::ConfigureRequest;
using internal::Delivery;
using internal::StepReply;
using internal::StepRequest;
using rpc::testing::Fate;
using rpc::testing::FrameInfo;
using rpc::testing::LoopbackJob;
using rpc::testing::LoopbackJobOptions;

constexpr int kIn = 8;

torch::nn::Sequential MakeModel() {
  baton::testing::MlpSpec spec;
  spec.inputs = kIn;
  spec.seed = 3;
  spec.dtype = torch::kFloat64;
  return baton::testing::MakeMlp(spec);
}

PipelineOptions Options(absl::Duration step_timeout) {
  PipelineOptions o;
  o.stage_workers = {"w1", "w2"};
  o.schedule = *OneFOneB({2, 4, 1});
  o.model = MakeModel;
  o.batch_size = 8;
  o.optimizer = dist_optim::OptimizerOptions::SGD(0.1);
  o.step_timeout = step_timeout;
  return o;
}

// Worker `rank`'s configure request for a 1F1B schedule of 2 workers and 4
// micro-batches, as the driver sends it.
ConfigureRequest ValidRequest(int rank) {
  const Schedule schedule = *OneFOneB({2, 4, 1});
  ConfigureRequest r;
  r.schedule = schedule.name;
  r.workers = 2;
  r.microbatches = 4;
  r.chunks = 1;
  r.rank = rank;
  for (const Action& a : schedule.per_worker[rank]) r.actions.push_back(internal::ToWire(a));
  const std::vector<int> cuts = *ComputeCuts(*MakeModel(), 2, Split::ByParameters());
  r.cuts.assign(cuts.begin(), cuts.end());
  r.optimizer = dist_optim::EncodeOptions(dist_optim::OptimizerOptions::SGD(0.1));
  r.batch_size = 8;
  r.stage_workers = {"w1", "w2"};
  return r;
}

class StageServerTest : public ::testing::Test {
 protected:
  // Starts the job; `install_w2` replaces w2's stage server when set.
  // `trace_dir`: the job's timeline goes there (AgentOptions::observability.trace_dir).
  void Start(std::function<void(rpc::FunctionRegistry&)> install_w2 = nullptr, bool metrics = false,
             const std::string& trace_dir = "") {
    LoopbackJobOptions o;
    o.world_size = 3;
    o.configure = [metrics, trace_dir](int, rpc::AgentOptions& a) {
      if (metrics) a.observability.metrics_address = "127.0.0.1:0";
      a.observability.trace_dir = trace_dir;
    };
    o.install = [this, install_w2](int rank, rpc::FunctionRegistry& r) {
      if (rank == 0) return;
      if (rank == 2 && install_w2) {
        install_w2(r);
        return;
      }
      auto s = StageServer::Create(r, {MakeModel});
      ASSERT_TRUE(s.ok()) << s.status();
      servers_[rank] = std::move(*s);
    };
    auto job = LoopbackJob::Start(o);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = std::move(*job);
  }

  void TearDown() override {
    for (auto& s : servers_) s.reset();
    if (job_ != nullptr) {
      job_->network().SetRule(nullptr);
      EXPECT_TRUE(job_->ShutdownAll().ok());
    }
  }

  rpc::RpcAgent& driver() { return job_->agent(0); }

  std::unique_ptr<StageServer> servers_[3];
  std::unique_ptr<LoopbackJob> job_;
};

TEST_F(StageServerTest, PL5_DestroyingTheServerFailsItsRunningStepPromptly) {
  Start();
  auto pipe = Pipeline::Create(driver(), Options(absl::Seconds(60)));
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  // Only w1 (stage 0) is asked to run step 0: it sends its first activation
  // to w2, then waits for a gradient that never comes, until the step's
  // deadline (60 s) unless closing the server ends the wait.
  auto sending = std::make_shared<absl::Notification>();
  auto seen = std::make_shared<std::atomic<bool>>(false);
  job_->network().SetRule([sending, seen](const FrameInfo& f) {
    if (f.request && f.from == 1 && f.function == "baton.pipeline.deliver" &&
        !seen->exchange(true)) {
      sending->Notify();
    }
    return Fate::Deliver();
  });
  rpc::CallOptions opts;
  opts.timeout = absl::Seconds(60);
  torch::manual_seed(0);
  auto step = driver().rpc_async(opts, "w1", internal::kRunStepFn,
                                 StepRequest{0, torch::randn({8, kIn}, torch::kFloat64), {}});
  ASSERT_TRUE(sending->WaitForNotificationWithTimeout(absl::Seconds(30)));

  const absl::Time t0 = absl::Now();
  servers_[1].reset();  // the step is running on w1's stage thread
  const absl::Duration destroy = absl::Now() - t0;
  const absl::StatusOr<StepReply>& r = step.result();
  const absl::Duration answered = absl::Now() - t0;
  EXPECT_LT(destroy, absl::Seconds(10)) << "the step's deadline is 60 s";
  EXPECT_LT(answered, absl::Seconds(10)) << "the step's deadline is 60 s";
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "pipeline stage server closed during step 0"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "stage 0 (pipeline worker 0)")) << r.status();

  // Calls that reach the closed server are refused.
  auto later = driver()
                   .rpc_async(opts, "w1", internal::kRunStepFn,
                              StepRequest{1, torch::zeros({8, kIn}, torch::kFloat64), {}})
                   .result();
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable) << later.status();
  EXPECT_TRUE(absl::StrContains(later.status().message(), "pipeline stage server: closed"))
      << later.status();
  auto configure = driver().rpc_async("w1", internal::kConfigureFn, ValidRequest(0)).result();
  EXPECT_EQ(configure.status().code(), absl::StatusCode::kUnavailable) << configure.status();
}

// The hang report (obs/state.h): a stage that never sends is at the end of
// the chain of waits, and the waiting stage's section says what it waits for.
TEST_F(StageServerTest, HangReportNamesAStageThatNeverSends) {
  Start();
  auto pipe = Pipeline::Create(driver(), Options(absl::Seconds(60)));
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  // Only w1 (stage 0) runs step 0: it sends its activations to w2, which
  // never runs the step, so the gradient w1 waits for never comes.
  rpc::CallOptions opts;
  opts.timeout = absl::Seconds(60);
  torch::manual_seed(0);
  auto step = driver().rpc_async(opts, "w1", internal::kRunStepFn,
                                 StepRequest{0, torch::randn({8, kIn}, torch::kFloat64), {}});
  auto report = [&] {
    std::vector<proto::WorkerState> ws(3);
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(obs::FromJson(job_->agent(r).StateJson(), &ws[r]).ok());
    return obs::BuildReport("loopback", "test", ws, {}, absl::Now());
  };
  auto waits_on_w2 = [](const proto::StateReport& r) {
    for (const auto& e : r.edges()) {
      if (e.from() == 1 && e.to() == 2 && e.kind() == "pipeline") return true;
    }
    return false;
  };
  ASSERT_TRUE(baton::testing::Eventually([&] { return waits_on_w2(report()); }, absl::Seconds(30)));
  const proto::StateReport r = report();
  for (const auto& f : r.chain_ends()) {
    if (f.key() == "0") {
      EXPECT_EQ(f.value(), "2") << r.summary();  // driver -> w1 -> w2
    }
  }
  bool described = false;
  for (const auto& s : r.workers(1).sections()) {
    if (s.name() != "pipeline") continue;
    for (const auto& line : s.lines()) {
      described |= absl::StrContains(line, "waits for step 0, receive gradient of micro-batch 0") &&
                   absl::StrContains(line, "the message of stage 1 (stage worker 1)");
    }
  }
  EXPECT_TRUE(described) << r.summary() << obs::ReportText(r);
  servers_[1].reset();  // ends the step
  EXPECT_FALSE(step.result().ok());
}

// Metrics: each stage worker counts its steps and where their time went;
// the rest is the bubble.
TEST_F(StageServerTest, MetricsCountStepsAndTheBubble) {
  Start(nullptr, /*metrics=*/true);
  auto pipe = Pipeline::Create(driver(), Options(absl::Seconds(60)));
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({8, kIn}, torch::kFloat64);
  const torch::Tensor y = torch::randint(0, 4, {8});
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*pipe)->Step(x, y).ok());
  for (int rank : {1, 2}) {
    ASSERT_NE(job_->agent(rank).runtime().metrics(), nullptr);
    const std::string text = job_->agent(rank).runtime().metrics()->Render();
    EXPECT_TRUE(absl::StrContains(text, "baton_pipeline_steps_total 2")) << text;
    EXPECT_TRUE(absl::StrContains(text, "# TYPE baton_pipeline_bubble_ratio gauge")) << text;
    // Two stages and 4 micro-batches under 1F1B: each stage idles part of
    // the step.
    const size_t at = text.find("\nbaton_pipeline_bubble_ratio ");
    ASSERT_NE(at, std::string::npos) << text;
    const double bubble = std::stod(text.substr(at + 29));
    EXPECT_GT(bubble, 0.0) << text;
    EXPECT_LT(bubble, 1.0) << text;
  }
}

// The pipeline's trace is a view of the job's timeline (pipeline/trace.h):
// with tracing on, the actions the stage workers recorded for a step, taken
// out of the merged timeline by StepView, are the driver's trace of that
// step (StepResult::events), slice for slice, named and timed alike.
TEST_F(StageServerTest, TheDriversStepTraceIsAViewOfTheJobTimeline) {
  const std::string dir = baton::testing::MakeTempDir("pipeline_timeline");
  Start(nullptr, /*metrics=*/false, dir);
  auto pipe = Pipeline::Create(driver(), Options(absl::Seconds(60)));
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({8, kIn}, torch::kFloat64);
  const torch::Tensor y = torch::randint(0, 4, {8});
  StepResult last;
  for (int i = 0; i < 2; ++i) {
    auto r = (*pipe)->Step(x, y);
    ASSERT_TRUE(r.ok()) << r.status();
    last = *std::move(r);
  }
  for (int rank : {1, 2}) {
    ASSERT_NE(job_->agent(rank).runtime().trace(), nullptr);
    job_->agent(rank).runtime().trace()->Flush();
  }
  auto merged = obs::MergeTraces(dir);
  ASSERT_TRUE(merged.ok()) << merged.status();
  const proto::TraceFile view = StepView(*merged, 1);
  const proto::TraceFile own = StepTrace((*pipe)->options().schedule, last.events);
  // (schedule worker, name, category, rounded duration): ranks 1 and 2 run
  // the schedule's workers 0 and 1.
  using Key = std::tuple<int, std::string, std::string, int64_t>;
  std::multiset<Key> from_timeline, from_driver;
  for (const auto& e : view.traceevents()) {
    if (e.ph() != "X") continue;
    from_timeline.insert({e.pid() - 1, e.name(), e.cat(), std::llround(e.dur())});
  }
  for (const auto& e : own.traceevents()) {
    if (e.ph() != "X" || e.cat() == "idle") continue;
    from_driver.insert({e.pid(), e.name(), e.cat(), std::llround(e.dur())});
  }
  EXPECT_EQ(from_timeline.size(), last.events.size());
  // Durations: whole microseconds in the timeline, so within one.
  ASSERT_EQ(from_timeline.size(), from_driver.size());
  auto a = from_timeline.begin();
  for (auto b = from_driver.begin(); b != from_driver.end(); ++a, ++b) {
    EXPECT_EQ(std::get<0>(*a), std::get<0>(*b));
    EXPECT_EQ(std::get<1>(*a), std::get<1>(*b));
    EXPECT_EQ(std::get<2>(*a), std::get<2>(*b));
    EXPECT_LE(std::abs(std::get<3>(*a) - std::get<3>(*b)), 1) << std::get<1>(*a);
  }
  EXPECT_EQ(StepView(*merged, 7).traceevents_size(), 0);  // no such step
}

TEST_F(StageServerTest, PL5_ADestroyedServerFailsTheNextStepNamingItsWorker) {
  Start();
  auto pipe = Pipeline::Create(driver(), Options(absl::Seconds(60)));
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({8, kIn}, torch::kFloat64);
  const torch::Tensor y = torch::randint(0, 4, {8});
  ASSERT_TRUE((*pipe)->Step(x, y).ok());
  servers_[2].reset();
  absl::Status s = (*pipe)->Step(x, y).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "pipeline worker 1 ('w2', stage 1)")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "pipeline stage server: closed")) << s;
}

TEST_F(StageServerTest, AConfigureRequestIsCheckedFieldByField) {
  Start();
  const int64_t layers = static_cast<int64_t>(MakeModel()->size());
  struct Case {
    std::function<void(ConfigureRequest&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](ConfigureRequest& r) { r.workers = 0; },
       "ConfigureRequest.workers is 0, not in [1, 65536]"},
      {[](ConfigureRequest& r) { r.microbatches = 1 << 20; },
       "ConfigureRequest.microbatches is 1048576, not in [1, 65536]"},
      {[](ConfigureRequest& r) { r.chunks = 40000; },
       "ConfigureRequest.chunks is 40000, not in [1, 32768]"},
      {[](ConfigureRequest& r) { r.rank = 2; }, "ConfigureRequest.rank is 2, not in [0, 1]"},
      {[](ConfigureRequest& r) { r.stage_workers.pop_back(); },
       "ConfigureRequest.stage_workers has 1 names for 2 workers"},
      {[](ConfigureRequest& r) { r.batch_size = 6; },
       "ConfigureRequest.batch_size is 6, not a positive multiple of the 4 micro-batches"},
      {[](ConfigureRequest& r) { r.actions[1].kind = 9; },
       "ConfigureRequest.actions[1].kind is 9, not an action kind"},
      {[](ConfigureRequest& r) { r.actions[0].microbatch = 4; },
       "ConfigureRequest.actions[0].microbatch is 4, not in [0, 3]"},
      {[](ConfigureRequest& r) { r.actions[0].stage = -1; },
       "ConfigureRequest.actions[0].stage is -1, not in [0, 1]"},
      {[](ConfigureRequest& r) { r.cuts.pop_back(); },
       "ConfigureRequest.cuts has 2 cut points for 2 stages (needs 3)"},
      {[](ConfigureRequest& r) { r.cuts[0] = 1; }, "ConfigureRequest.cuts starts at 1, not 0"},
      {[](ConfigureRequest& r) { r.cuts[1] = 0; },
       "ConfigureRequest.cuts must increase: [1] is 0 after 0"},
      {[layers](ConfigureRequest& r) { r.cuts[2] = static_cast<int32_t>(layers + 1); },
       absl::StrCat("ConfigureRequest.cuts end at ", layers + 1, ", but the model has ", layers,
                    " layers")},
  };
  for (const Case& c : cases) {
    ConfigureRequest r = ValidRequest(0);
    c.edit(r);
    auto got = driver().rpc_async("w1", internal::kConfigureFn, r).result();
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), "pipeline configure (1f1b): " + c.want))
        << got.status() << "\nwanted: " << c.want;
  }
  auto ok = driver().rpc_async("w1", internal::kConfigureFn, ValidRequest(0)).result();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 0);
}

TEST_F(StageServerTest, ADeliveryIsCheckedByFieldThenByTheRunner) {
  Start();
  ASSERT_TRUE(driver().rpc_async("w1", internal::kConfigureFn, ValidRequest(0)).result().ok());
  absl::Status s =
      driver()
          .rpc_async("w1", internal::kDeliverFn, Delivery{0, 7, 0, 0, torch::ones({2})})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(
      s.message(), "pipeline deliver: Delivery.kind is 7, neither 0 (activation) nor 1 (gradient)"))
      << s;
  // Stage 1 is w2's (PP7).
  s = driver()
          .rpc_async("w1", internal::kDeliverFn, Delivery{0, 0, 1, 0, torch::ones({2})})
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "does not own that stage")) << s;
}

TEST_F(StageServerTest, APeerWithThePositionalMessagesIsRefusedAsATypeMismatch) {
  Start();
  // The configure signature before the typed messages.
  const rpc::Function<int64_t(std::string, std::vector<int64_t>, std::vector<int64_t>,
                              std::vector<int64_t>, std::string, int64_t, std::vector<std::string>,
                              std::string)>
      old_configure("baton.pipeline.configure");
  auto r =
      driver()
          .rpc_async("w1", old_configure, std::string("1f1b"), std::vector<int64_t>{2, 4, 1, 0},
                     std::vector<int64_t>{}, std::vector<int64_t>{0, 3, 6}, std::string(),
                     int64_t{8}, std::vector<std::string>{"w1", "w2"}, std::string())
          .result();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "argument type mismatch")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(),
                                "ConfigureRequest{string,int32,int32,int32,int32,vector<WireAction{"
                                "int32,int32,int32}>"))
      << r.status();
}

TEST_F(StageServerTest, PL3_AReplyOutsideTheScheduleFailsTheStepNamingTheField) {
  // w2 answers configure and deliver like a stage server, and every step
  // with an event of an action kind that does not exist.
  Start([](rpc::FunctionRegistry& r) {
    ASSERT_TRUE(
        r.Register(internal::kConfigureFn, [](ConfigureRequest) { return int64_t{0}; }).ok());
    ASSERT_TRUE(r.Register(internal::kRunStepFn, [](StepRequest) {
                   StepReply reply;
                   reply.events.push_back({{9, 0, 1}, 1.0, 2.0});
                   return reply;
                 }).ok());
    ASSERT_TRUE(r.Register(internal::kDeliverFn, [](Delivery) {}).ok());
    ASSERT_TRUE(r.Register(internal::kAbortFn, [](internal::AbortRequest) {}).ok());
  });
  auto pipe = Pipeline::Create(driver(), Options(absl::Seconds(60)));
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  torch::manual_seed(0);
  const absl::Time t0 = absl::Now();
  absl::Status s =
      (*pipe)->Step(torch::randn({8, kIn}, torch::kFloat64), torch::randint(0, 4, {8})).status();
  // w1 waited for w2's gradients; the driver's abort ended its step.
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10)) << "the step's deadline is 60 s";
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "pipeline worker 1 ('w2', stage 1): DATA_LOSS: bad step reply: "
                                "StepReply.events[0].action.kind is 9, not an action kind"))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "pipeline worker 0 ('w1', stage 0): ABORTED")) << s;
}

}  // namespace
}  // namespace baton::pipeline
