// pipeline/trace.h: a step's timeline, simulated here, as a view in the
// job timeline's format: one named process per worker, a slice per forward
// and backward, receive waits, and idle gaps that fill each track to the
// step's end; written by obs/trace.h's JSON and SVG writers.
#include "pipeline/trace.h"

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "obs/state.h"

namespace baton::pipeline {
namespace {

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

int CountCat(const proto::TraceFile& t, const std::string& cat) {
  int n = 0;
  for (const auto& e : t.traceevents()) n += e.ph() == "X" && e.cat() == cat;
  return n;
}

const proto::TraceEvent* Named(const proto::TraceFile& t, const std::string& name) {
  for (const auto& e : t.traceevents()) {
    if (e.name() == name) return &e;
  }
  return nullptr;
}

TEST(StepTrace, ProcessesSlicesWaitsAndIdle) {
  auto s = *GPipe({2, 3, 1});
  auto sim = Simulate(s, {1.0, 2.0});
  ASSERT_TRUE(sim.ok()) << sim.status();
  const proto::TraceFile t = StepTrace(s, sim->events, /*us_per_unit=*/1000);
  int processes = 0;
  for (const auto& e : t.traceevents()) processes += e.name() == "process_name";
  EXPECT_EQ(processes, 2);
  EXPECT_EQ(CountCat(t, "forward"), 6);
  EXPECT_EQ(CountCat(t, "backward"), 6);
  // Worker 1 waits one forward (1000 us) for micro-batch 0's activation.
  const proto::TraceEvent* wait = Named(t, "receive activation of micro-batch 0 at stage 1");
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->cat(), "recv");
  EXPECT_EQ(wait->pid(), 1);
  EXPECT_EQ(wait->ts(), 0);
  EXPECT_EQ(wait->dur(), 1000);
  EXPECT_EQ(wait->args().at("microbatch"), "0");
  EXPECT_EQ(wait->args().at("stage"), "1");
  // Worker 0 idles at the end while worker 1 runs its first backward
  // (GPipe: makespan (m + p - 1) * (1 + 2) = 12 units).
  EXPECT_NEAR(sim->makespan, 12.0, 1e-9);
  EXPECT_GT(CountCat(t, "idle"), 0);
  EXPECT_EQ(t.otherdata().at("schedule"), "gpipe");
  // The JSON is the job timeline's (obs::TraceJson), and reads back.
  const std::string json = ChromeTrace(s, sim->events, 1000);
  EXPECT_TRUE(absl::StrContains(json, "\"worker 1 (stage 1)\"")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"schedule\":\"gpipe\"")) << json;
  proto::TraceFile back;
  ASSERT_TRUE(obs::FromJson(json, &back).ok());
  EXPECT_EQ(back.traceevents_size(), t.traceevents_size());
}

TEST(StepTrace, SvgHasALanePerWorkerAndABoxPerAction) {
  auto s = *OneFOneB({3, 4, 1});
  auto sim = Simulate(s);
  const std::string svg = TimelineSvg(s, sim->events, 600);
  EXPECT_TRUE(absl::StartsWith(svg, "<svg "));
  EXPECT_EQ(Count(svg, ">worker "), 3);
  // A background rect plus one per event (idle gaps stay blank).
  EXPECT_EQ(Count(svg, "<rect "), 1 + static_cast<int>(sim->events.size()));
  EXPECT_EQ(Count(svg, "fill=\"#4a7fd4\" stroke=\"#555\" stroke-width=\"0.5\"><title>"),
            12);  // 3 stages x 4 micro-batches
  EXPECT_TRUE(absl::StrContains(svg, "a pipeline forward"));
}

TEST(StepTrace, WriteNamesThePathOnError) {
  auto s = *OneFOneB({2, 2, 1});
  auto sim = Simulate(s);
  const std::string bad = "/nonexistent-dir/trace.json";
  absl::Status st = WriteChromeTrace(bad, s, sim->events);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(st.message(), bad)) << st;
  const std::string good = absl::StrCat(::testing::TempDir(), "/trace.json");
  EXPECT_TRUE(WriteChromeTrace(good, s, sim->events).ok());
}

TEST(StepTrace, MeasuredSendsAndReceivesHaveTheirOwnCategories) {
  auto s = *OneFOneB({2, 1, 1});
  std::vector<TimelineEvent> events = {{0, {ActionKind::kForward, 0, 0}, 0, 10},
                                       {0, {ActionKind::kSendActivation, 0, 0}, 10, 11},
                                       {1, {ActionKind::kRecvActivation, 0, 1}, 0, 11},
                                       {1, {ActionKind::kForward, 0, 1}, 11, 20}};
  const proto::TraceFile t = StepTrace(s, events);
  EXPECT_EQ(CountCat(t, "send"), 1);
  EXPECT_EQ(CountCat(t, "recv"), 1);
  EXPECT_EQ(CountCat(t, "forward"), 2);
  EXPECT_TRUE(IsActionCategory("recv"));
  EXPECT_FALSE(IsActionCategory("call"));
}

// StepView picks one step's actions out of a merged job timeline and
// leaves the rest (calls, other steps) out.
TEST(StepTrace, StepViewKeepsOneStepsActions) {
  proto::TraceFile merged;
  auto add = [&](const std::string& name, const std::string& cat, int pid, double ts,
                 const std::string& step) {
    proto::TraceEvent* e = merged.add_traceevents();
    e->set_name(name);
    e->set_cat(cat);
    e->set_ph("X");
    e->set_pid(pid);
    e->set_ts(ts);
    e->set_dur(5);
    if (!step.empty()) (*e->mutable_args())["step"] = step;
  };
  add("F0", "forward", 1, 100, "0");
  add("F0", "forward", 1, 200, "1");
  add("B0", "backward", 2, 250, "1");
  add("__baton.pp.deliver -> w2", "call", 1, 210, "");
  const proto::TraceFile v = StepView(merged, 1);
  ASSERT_EQ(v.traceevents_size(), 2);
  EXPECT_EQ(v.traceevents(0).name(), "F0");
  EXPECT_EQ(v.traceevents(0).ts(), 0);
  EXPECT_EQ(v.traceevents(1).name(), "B0");
  EXPECT_EQ(v.traceevents(1).ts(), 50);
}

}  // namespace
}  // namespace baton::pipeline
