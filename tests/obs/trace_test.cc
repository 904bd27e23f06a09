// The job's timeline (obs/trace.h, TL1-TL4): a 3-worker distributed-autograd
// step on a loopback job with tracing on, merged into one Chrome trace that
// shows the calls on both sides, in order, with their arrows.
#include "obs/trace.h"

#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "dist_autograd/dist_autograd.h"
#include "obs/state.h"
#include "rpc/agent.h"
#include "testing/rpc/loopback_job.h"
#include "testing/temp_dir.h"

namespace baton::obs {
namespace {

using ::testing::HasSubstr;

const proto::TraceEvent* Find(const proto::TraceFile& t, const std::string& ph, int pid,
                              const std::string& name_prefix) {
  for (const auto& e : t.traceevents()) {
    if (e.ph() == ph && e.pid() == pid && absl::StartsWith(e.name(), name_prefix)) return &e;
  }
  return nullptr;
}

const proto::TraceEvent* Flow(const proto::TraceFile& t, const std::string& ph,
                              const std::string& id) {
  for (const auto& e : t.traceevents()) {
    if (e.ph() == ph && e.id() == id) return &e;
  }
  return nullptr;
}

TEST(Trace, TL1_TL2_TL3_TL4_ADistributedAutogradStepOnThreeWorkers) {
  static const rpc::Function<at::Tensor(at::Tensor)> mul_fn("mul");
  const std::string dir = baton::testing::MakeTempDir("trace");
  rpc::testing::LoopbackJobOptions o;
  o.world_size = 3;
  o.configure = [&](int, rpc::AgentOptions& a) { a.observability.trace_dir = dir; };
  o.install = [](int, rpc::FunctionRegistry& r) {
    ASSERT_TRUE(dist_autograd::Install(r).ok());
    ASSERT_TRUE(r.Register(mul_fn, [](at::Tensor x) { return x * 3; }).ok());
  };
  auto job = rpc::testing::LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  rpc::RpcAgent& w0 = (*job)->agent(0);
  at::Tensor x = at::ones({4}).set_requires_grad(true);
  {
    dist_autograd::Context ctx(w0);
    at::Tensor y1 = w0.rpc_sync(1, mul_fn, x);   // forward on w1
    at::Tensor y2 = w0.rpc_sync(2, mul_fn, y1);  // then on w2
    absl::Status b = dist_autograd::Backward(w0, ctx.id(), {y2.sum()});
    ASSERT_TRUE(b.ok()) << b;
    auto g = dist_autograd::GetGradients(w0, ctx.id());
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_TRUE(at::allclose(g->Get(x), at::full({4}, 9.0f)));
  }
  ASSERT_TRUE((*job)->ShutdownAll().ok());  // flushes every recorder

  auto merged = MergeTraces(dir);
  ASSERT_TRUE(merged.ok()) << merged.status();
  const proto::TraceFile& t = *merged;
  // TL3/TL4: three workers, by rank, each with its clock's method.
  ASSERT_EQ(t.workers_size(), 3);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(t.workers(r).rank(), r);
    EXPECT_EQ(t.workers(r).worker(), absl::StrCat("w", r));
  }
  EXPECT_EQ(t.workers(0).clock_method(), "rank 0's own clock");
  EXPECT_THAT(t.workers(1).clock_method(), HasSubstr("least round trip of 8 calls to rank 0"));
  EXPECT_GE(t.workers(2).clock_error_us(), 0);
  const double slack = std::max(t.workers(1).clock_error_us(), t.workers(2).clock_error_us()) + 1;
  // TL1: both sides of each forward call.
  const proto::TraceEvent* call1 = Find(t, "X", 0, "mul -> w1");
  const proto::TraceEvent* serve1 = Find(t, "X", 1, "mul <- w0");
  const proto::TraceEvent* call2 = Find(t, "X", 0, "mul -> w2");
  const proto::TraceEvent* serve2 = Find(t, "X", 2, "mul <- w0");
  ASSERT_TRUE(call1 && serve1 && call2 && serve2) << TraceJson(t);
  EXPECT_LE(call1->ts(), serve1->ts() + slack);
  EXPECT_LE(serve1->ts() + serve1->dur(), call1->ts() + call1->dur() + slack);
  EXPECT_LE(call1->ts() + call1->dur(), call2->ts());  // the forwards in order
  // The backward: w0 sends its gradient to w2 after both forwards, and the
  // chain reaches w1 through w0.
  const proto::TraceEvent* back2 = Find(t, "X", 0, "__dist_autograd.propagate -> w2");
  const proto::TraceEvent* back1 = Find(t, "X", 0, "__dist_autograd.propagate -> w1");
  ASSERT_TRUE(back2 && back1) << TraceJson(t);
  EXPECT_LE(call2->ts() + call2->dur(), back2->ts());
  EXPECT_NE(Find(t, "X", 2, "__dist_autograd.propagate <- w0"), nullptr);
  EXPECT_NE(Find(t, "X", 1, "__dist_autograd.propagate <- w0"), nullptr);
  // The pass as one slice on w0, holding its gradient messages, and each
  // worker's local part.
  const proto::TraceEvent* pass = Find(t, "X", 0, "backward pass, context ");
  ASSERT_NE(pass, nullptr) << TraceJson(t);
  EXPECT_EQ(pass->cat(), "autograd");
  EXPECT_EQ(pass->args().at("status"), "OK");
  EXPECT_LE(pass->ts(), back2->ts());
  EXPECT_GE(pass->ts() + pass->dur(), back1->ts() + back1->dur());
  for (int pid : {0, 1, 2}) {
    const proto::TraceEvent* local = Find(t, "X", pid, "local backward, context ");
    ASSERT_NE(local, nullptr) << "worker " << pid;
    EXPECT_EQ(local->args().at("context"), pass->args().at("context"));
  }
  // TL2: the arrows forward's arrows, caller to callee and back.
  std::map<std::string, std::pair<const proto::TraceEvent*, const proto::TraceEvent*>> flows;
  for (const auto& e : t.traceevents()) {
    if (e.ph() == "s") flows[e.id()].first = &e;
    if (e.ph() == "f") flows[e.id()].second = &e;
  }
  int request_arrows = 0, reply_arrows = 0;
  for (const auto& [id, ends] : flows) {
    // Merge keeps only the flows whose two ends it has (TL4).
    ASSERT_TRUE(ends.first && ends.second) << "a flow with one end: " << id;
    EXPECT_LE(ends.first->ts(), ends.second->ts() + slack) << id;
    EXPECT_EQ(ends.second->bp(), "e");
    (id[0] == 'q' ? request_arrows : reply_arrows)++;
  }
  EXPECT_GE(request_arrows, 4);  // two forwards, two backward messages at least
  EXPECT_EQ(request_arrows, reply_arrows);
  // Every request arrow leaves the caller's process and reaches another.
  for (const auto& [id, ends] : flows) {
    EXPECT_NE(ends.first->pid(), ends.second->pid()) << id;
    EXPECT_EQ(Flow(t, "s", id), ends.first);
  }
  // The JSON Chrome reads: traceEvents with every pid, process names.
  const std::string json = TraceJson(t);
  EXPECT_THAT(json, HasSubstr("\"traceEvents\""));
  EXPECT_THAT(json, HasSubstr("\"process_name\""));
  EXPECT_THAT(json, HasSubstr("\"w1 (rank 1)\""));
  proto::TraceFile back;
  EXPECT_TRUE(FromJson(json, &back).ok());
  EXPECT_EQ(back.traceevents_size(), t.traceevents_size());
  // The picture: a box per slice (and the background), a line per arrow,
  // the workers' lanes named.
  const std::string svg = TraceSvg(t);
  int slices = 0;
  for (const auto& e : t.traceevents()) slices += e.ph() == "X";
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<rect "), slices + 1);
  EXPECT_EQ(count("stroke=\"#c0392b\""), static_cast<int>(flows.size()));
  EXPECT_THAT(svg, HasSubstr(">w2 (rank 2) t"));
  // A window of it: the second forward only, shifted to start at 0, its
  // arrows kept only with both ends inside.
  const double from = call2->ts(), to = call2->ts() + call2->dur();
  const proto::TraceFile window = CropTrace(t, from, to);
  EXPECT_NE(Find(window, "X", 0, "mul -> w2"), nullptr);
  EXPECT_EQ(Find(window, "X", 0, "mul -> w1"), nullptr);
  EXPECT_EQ(Find(window, "X", 0, "mul -> w2")->ts(), 0);
  std::map<std::string, int> window_ends;
  for (const auto& e : window.traceevents()) {
    if (e.ph() == "s" || e.ph() == "f") window_ends[e.id()] += 1;
    if (e.ph() == "X") {
      EXPECT_LE(e.ts() + e.dur(), to - from + 0.001) << e.name();
    }
  }
  for (const auto& [id, n] : window_ends) EXPECT_EQ(n, 2) << id;
}

TEST(Trace, MergeSaysWhatIsWrong) {
  const std::string dir = baton::testing::MakeTempDir("trace_bad");
  EXPECT_EQ(MergeTraces(dir).status().code(), absl::StatusCode::kInvalidArgument);
  std::FILE* f = std::fopen((dir + "/trace_pid1_0.jsonl").c_str(), "w");
  std::fputs("{\"header\":{\"rank\":0}}\n{not json\n", f);
  std::fclose(f);
  auto r = MergeTraces(dir);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("trace_pid1_0.jsonl:2"));
}

}  // namespace
}  // namespace baton::obs
