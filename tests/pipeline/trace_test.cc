// pipeline/trace.h: the Chrome trace of a simulated step has one named
// track per worker, a span per forward and backward, receive waits and idle
// gaps that fill each track to the step's end.
#include "pipeline/trace.h"

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton::pipeline {
namespace {

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

TEST(ChromeTrace, TracksSpansWaitsAndIdle) {
  auto s = *GPipe({2, 3, 1});
  auto sim = Simulate(s, {1.0, 2.0});
  ASSERT_TRUE(sim.ok()) << sim.status();
  const std::string json = ChromeTrace(s, sim->events, /*us_per_unit=*/1000);
  EXPECT_EQ(Count(json, "\"thread_name\""), 2);
  EXPECT_TRUE(absl::StrContains(json, "\"worker 1 (stage 1)\""));
  EXPECT_EQ(Count(json, "\"cat\": \"forward\""), 6);
  EXPECT_EQ(Count(json, "\"cat\": \"backward\""), 6);
  // Worker 1 waits one forward (1000 us) for micro-batch 0's activation.
  EXPECT_TRUE(absl::StrContains(
      json,
      "\"name\": \"receive activation of micro-batch 0 at stage 1\", \"cat\": \"recv\", "
      "\"ph\": \"X\", \"pid\": 0, \"tid\": 1, \"ts\": 0.000, \"dur\": 1000.000"))
      << json;
  // Worker 0 idles at the end while worker 1 runs its first backward
  // (GPipe: makespan (m + p - 1) * (1 + 2) = 12 units).
  EXPECT_NEAR(sim->makespan, 12.0, 1e-9);
  EXPECT_TRUE(absl::StrContains(json, "\"cat\": \"idle\""));
  EXPECT_EQ(Count(json, "{"), Count(json, "}"));
  EXPECT_EQ(Count(json, "["), Count(json, "]"));
  EXPECT_TRUE(absl::StrContains(json, "\"schedule\": \"gpipe\""));
}

TEST(ChromeTrace, SvgHasARowPerWorkerAndARectPerSpan) {
  auto s = *OneFOneB({3, 4, 1});
  auto sim = Simulate(s);
  const std::string svg = TimelineSvg(s, sim->events, 600);
  EXPECT_TRUE(absl::StartsWith(svg, "<svg "));
  EXPECT_EQ(Count(svg, ">worker "), 3);
  // A background rect plus one per event.
  EXPECT_EQ(Count(svg, "<rect "), 1 + static_cast<int>(sim->events.size()));
  EXPECT_EQ(Count(svg, "fill=\"#4a7fd4\""), 12);  // 3 stages x 4 micro-batches
}

TEST(ChromeTrace, WriteNamesThePathOnError) {
  auto s = *OneFOneB({2, 2, 1});
  auto sim = Simulate(s);
  const std::string bad = "/nonexistent-dir/trace.json";
  absl::Status st = WriteChromeTrace(bad, s, sim->events);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(st.message(), bad)) << st;
  const std::string good = absl::StrCat(::testing::TempDir(), "/trace.json");
  EXPECT_TRUE(WriteChromeTrace(good, s, sim->events).ok());
}

TEST(ChromeTrace, MeasuredSendsAndReceivesHaveTheirOwnCategories) {
  auto s = *OneFOneB({2, 1, 1});
  std::vector<TimelineEvent> events = {{0, {ActionKind::kForward, 0, 0}, 0, 10},
                                       {0, {ActionKind::kSendActivation, 0, 0}, 10, 11},
                                       {1, {ActionKind::kRecvActivation, 0, 1}, 0, 11},
                                       {1, {ActionKind::kForward, 0, 1}, 11, 20}};
  const std::string json = ChromeTrace(s, events);
  EXPECT_EQ(Count(json, "\"cat\": \"send\""), 1);
  EXPECT_EQ(Count(json, "\"cat\": \"recv\""), 1);
  EXPECT_EQ(Count(json, "\"cat\": \"forward\""), 2);
}

}  // namespace
}  // namespace baton::pipeline
