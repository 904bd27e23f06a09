// A pipeline step's timeline as a view of the job's timeline (obs/trace.h):
// the same slices, named and categorised alike, written by the same Chrome
// trace and SVG writers. One source, three ways to see it:
// - a simulated step (Simulate) or a measured one (StepResult::events, the
//   driver's copy of what each stage worker timed): StepTrace;
// - the job's merged timeline (BATON_TRACE, baton-trace), where every stage
//   worker recorded the same actions with SliceOf: StepView picks one step,
//   as `baton-trace DIR --cat forward,backward,send,recv --arg step=N` does.
//
//   auto sim = pipeline::Simulate(schedule);
//   std::string json = pipeline::ChromeTrace(schedule, sim->events, /*us_per_unit=*/1000);
//
// Contract: one process per schedule worker, named "worker W (stage S...)";
// an action's slice is named F<m> or B<m> for a forward or backward of
// micro-batch m and after the action (ToString) for sends and receives,
// with category forward, backward, send or recv and arguments microbatch
// and stage; StepTrace fills every gap on a worker's track between 0 and
// the step's end with an "idle" slice. Output is deterministic.
//
// Thread-safety: pure functions.
#ifndef BATON_PIPELINE_TRACE_H_
#define BATON_PIPELINE_TRACE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "pipeline/schedule.h"
#include "proto/trace.pb.h"

namespace baton::pipeline {

// An executed action's slice, in the job's timeline and in every view.
struct ActionSlice {
  std::string name;
  std::string cat;  // forward, backward, send or recv
  std::map<std::string, std::string> args;
};
ActionSlice SliceOf(const Action& action);
bool IsActionCategory(absl::string_view cat);

// A step's timeline: `events` times `us_per_unit` microseconds.
proto::TraceFile StepTrace(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                           double us_per_unit = 1.0);

// The actions the stage workers recorded for step `step` in the job's merged
// timeline (obs::MergeTraces), shifted to start at 0.
proto::TraceFile StepView(const proto::TraceFile& merged, int64_t step);

// StepTrace as Chrome trace JSON, and as an SVG `width` pixels wide.
std::string ChromeTrace(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                        double us_per_unit = 1.0);
std::string TimelineSvg(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                        int width = 900);

// Writes ChromeTrace() to `path` (replacing it); errors name the path.
absl::Status WriteChromeTrace(const std::string& path, const Schedule& schedule,
                              const std::vector<TimelineEvent>& events, double us_per_unit = 1.0);

}  // namespace baton::pipeline

#endif  // BATON_PIPELINE_TRACE_H_
