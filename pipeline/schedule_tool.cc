// Prints a schedule's simulated step and writes its timeline:
//
//   bazel-bin/pipeline/schedule_tool --schedule gpipe|1f1b|interleaved
//       --workers P --microbatches M [--chunks V] [--forward 1 --backward 2]
//       [--trace FILE.json] [--svg FILE.svg]
//
// The summary line gives the simulated bubble beside the schedule's
// theoretical one and the peak number of stashed micro-batches per worker.
// Costs are per micro-batch of one worker's share of the model.
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipeline/schedule.h"
#include "pipeline/trace.h"

int main(int argc, char** argv) {
  using namespace baton::pipeline;  // NOLINT: a small tool
  std::map<std::string, std::string> flags = {
      {"schedule", "1f1b"}, {"workers", "4"},  {"microbatches", "8"}, {"chunks", "1"},
      {"forward", "1"},     {"backward", "2"}, {"trace", ""},         {"svg", ""}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const size_t eq = a.find('=');
    std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2), value;
    if (a.rfind("--", 0) != 0 || flags.count(name) == 0) {
      std::fprintf(stderr, "unknown argument %s (see the top of pipeline/schedule_tool.cc)\n",
                   a.c_str());
      return 2;
    }
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    }
    flags[name] = value;
  }
  ScheduleSpec spec;
  Costs costs;
  if (!absl::SimpleAtoi(flags["workers"], &spec.workers) ||
      !absl::SimpleAtoi(flags["microbatches"], &spec.microbatches) ||
      !absl::SimpleAtoi(flags["chunks"], &spec.chunks) ||
      !absl::SimpleAtod(flags["forward"], &costs.forward) ||
      !absl::SimpleAtod(flags["backward"], &costs.backward)) {
    std::fprintf(stderr, "--workers, --microbatches, --chunks, --forward, --backward: numbers\n");
    return 2;
  }
  const std::string& kind = flags["schedule"];
  absl::StatusOr<Schedule> s = kind == "gpipe"  ? GPipe(spec)
                               : kind == "1f1b" ? OneFOneB(spec)
                               : kind == "interleaved"
                                   ? Interleaved1F1B(spec)
                                   : absl::InvalidArgumentError(absl::StrCat(
                                         "--schedule '", kind, "': gpipe, 1f1b or interleaved"));
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
    return 2;
  }
  auto sim = Simulate(*s, costs);
  if (!sim.ok()) {
    std::fprintf(stderr, "%s\n", sim.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "schedule %s p=%d m=%d v=%d: step %.2f, bubble %.4f (theoretical %.4f), "
      "peak stashed micro-batches per worker [%s]\n",
      s->name.c_str(), spec.workers, spec.microbatches, spec.chunks, sim->makespan,
      sim->bubble_fraction, TheoreticalBubble(*s), absl::StrJoin(sim->peak_stashed, ", ").c_str());
  if (!flags["trace"].empty()) {
    if (auto st = WriteChromeTrace(flags["trace"], *s, sim->events, 1000); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  if (!flags["svg"].empty()) {
    std::FILE* f = std::fopen(flags["svg"].c_str(), "w");
    const std::string svg = TimelineSvg(*s, sim->events);
    if (f == nullptr || std::fwrite(svg.data(), 1, svg.size(), f) != svg.size()) {
      std::fprintf(stderr, "cannot write %s\n", flags["svg"].c_str());
      if (f != nullptr) std::fclose(f);
      return 1;
    }
    std::fclose(f);
  }
  return 0;
}
