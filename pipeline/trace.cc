#include "pipeline/trace.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace baton::pipeline {
namespace {

std::string Span(const std::string& name, const std::string& cat, int worker, double start,
                 double end, double scale, const std::string& args) {
  return absl::StrFormat(
      "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, "
      "\"ts\": %.3f, \"dur\": %.3f, \"args\": {%s}}",
      name, cat, worker, start * scale, (end - start) * scale, args);
}

}  // namespace

std::string ChromeTrace(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                        double us_per_unit) {
  const ScheduleSpec& spec = schedule.spec;
  std::vector<std::string> out;
  for (int w = 0; w < spec.workers; ++w) {
    std::vector<int> stages;
    for (int c = 0; c < spec.chunks; ++c) stages.push_back(c * spec.workers + w);
    out.push_back(
        absl::StrFormat("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                        "\"args\": {\"name\": \"worker %d (stage%s %s)\"}}",
                        w, w, stages.size() > 1 ? "s" : "", absl::StrJoin(stages, ", ")));
  }
  double end = 0;
  for (const auto& e : events) end = std::max(end, e.end);
  std::map<int, std::vector<const TimelineEvent*>> by_worker;
  for (const auto& e : events) by_worker[e.worker].push_back(&e);
  for (int w = 0; w < spec.workers; ++w) {
    auto& list = by_worker[w];
    std::stable_sort(list.begin(), list.end(), [](const TimelineEvent* a, const TimelineEvent* b) {
      return a->start < b->start;
    });
    double t = 0;
    for (const TimelineEvent* e : list) {
      if (e->start > t + 1e-12)
        out.push_back(Span("idle", "idle", w, t, e->start, us_per_unit, ""));
      const Action& a = e->action;
      const std::string args =
          absl::StrCat("\"microbatch\": ", a.microbatch, ", \"stage\": ", a.stage);
      switch (a.kind) {
        case ActionKind::kForward:
          out.push_back(Span(absl::StrCat("F", a.microbatch), "forward", w, e->start, e->end,
                             us_per_unit, args));
          break;
        case ActionKind::kBackward:
          out.push_back(Span(absl::StrCat("B", a.microbatch), "backward", w, e->start, e->end,
                             us_per_unit, args));
          break;
        case ActionKind::kSendActivation:
        case ActionKind::kSendGradient:
          out.push_back(Span(ToString(a), "send", w, e->start, e->end, us_per_unit, args));
          break;
        default:
          out.push_back(Span(ToString(a), "recv", w, e->start, e->end, us_per_unit, args));
          break;
      }
      t = std::max(t, e->end);
    }
    if (end > t + 1e-12) out.push_back(Span("idle", "idle", w, t, end, us_per_unit, ""));
  }
  return absl::StrCat("{\"displayTimeUnit\": \"ms\", \"otherData\": {\"schedule\": \"",
                      schedule.name, "\", \"workers\": ", spec.workers,
                      ", \"microbatches\": ", spec.microbatches, ", \"chunks\": ", spec.chunks,
                      "}, \"traceEvents\": [\n", absl::StrJoin(out, ",\n"), "\n]}\n");
}

std::string TimelineSvg(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                        int width) {
  const ScheduleSpec& spec = schedule.spec;
  const int label = 90, row = 28, top = 30, h = top + row * spec.workers + 24;
  double end = 0;
  for (const auto& e : events) end = std::max(end, e.end);
  const double scale = end > 0 ? (width - label - 10) / end : 0;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"4\" y=\"18\" font-size=\"13\">%s: %d workers, %d micro-batches%s</text>\n",
      width, h, schedule.name, spec.workers, spec.microbatches,
      spec.chunks > 1 ? absl::StrCat(", ", spec.chunks, " chunks") : std::string());
  for (int w = 0; w < spec.workers; ++w) {
    absl::StrAppendFormat(&svg, "<text x=\"4\" y=\"%d\">worker %d</text>\n", top + w * row + 17, w);
  }
  for (const auto& e : events) {
    const char* fill = e.action.kind == ActionKind::kForward    ? "#4a7fd4"
                       : e.action.kind == ActionKind::kBackward ? "#3aa55d"
                                                                : "#c8c8c8";
    const double x = label + e.start * scale, wpx = std::max(0.5, (e.end - e.start) * scale);
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
                          "fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\"/>\n",
                          x, top + e.worker * row + 3, wpx, row - 6, fill);
    if (e.action.kind == ActionKind::kForward || e.action.kind == ActionKind::kBackward) {
      if (wpx >= 14) {
        absl::StrAppendFormat(&svg,
                              "<text x=\"%.1f\" y=\"%d\" fill=\"white\" "
                              "text-anchor=\"middle\">%s%d</text>\n",
                              x + wpx / 2, top + e.worker * row + 18,
                              e.action.kind == ActionKind::kForward ? "F" : "B",
                              e.action.microbatch);
      }
    }
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%d\" y=\"%d\">forward (blue), backward (green), waiting "
                        "for a message (grey), idle (blank)</text>\n</svg>\n",
                        label, h - 8);
  return svg;
}

absl::Status WriteChromeTrace(const std::string& path, const Schedule& schedule,
                              const std::vector<TimelineEvent>& events, double us_per_unit) {
  const std::string json = ChromeTrace(schedule, events, us_per_unit);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot write the trace to ", path, ": ", std::strerror(errno)));
  }
  const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  if (std::fclose(f) != 0 || !ok) {
    return absl::UnavailableError(absl::StrCat("writing the trace to ", path, " failed"));
  }
  return absl::OkStatus();
}

}  // namespace baton::pipeline
