// Chrome trace JSON (chrome://tracing, Perfetto) of a pipeline step: one
// track per worker, a span per forward and backward of a micro-batch on a
// stage, a span per receive that waited, and the idle gaps in between.
//
//   auto sim = pipeline::Simulate(schedule);
//   std::string json = pipeline::ChromeTrace(schedule, sim->events, /*us_per_unit=*/1000);
//
// Contract: events are complete ("ph": "X") with "ts" and "dur" in
// microseconds (event times times `us_per_unit`); tracks are named
// "worker W (stages ...)" through thread_name metadata; categories are
// forward, backward, send, recv and idle. Idle spans fill every gap on a worker's
// track between 0 and the step's end. Output is deterministic.
//
// Thread-safety: pure functions.
#ifndef BATON_PIPELINE_TRACE_H_
#define BATON_PIPELINE_TRACE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pipeline/schedule.h"

namespace baton::pipeline {

std::string ChromeTrace(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                        double us_per_unit = 1.0);

// The same timeline as an SVG image (one row per worker, forwards blue,
// backwards green, receive waits grey, idle blank), `width` pixels wide, for
// documents that show a picture rather than a trace viewer.
std::string TimelineSvg(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                        int width = 900);

// Writes ChromeTrace() to `path` (replacing it); errors name the path.
absl::Status WriteChromeTrace(const std::string& path, const Schedule& schedule,
                              const std::vector<TimelineEvent>& events, double us_per_unit = 1.0);

}  // namespace baton::pipeline

#endif  // BATON_PIPELINE_TRACE_H_
