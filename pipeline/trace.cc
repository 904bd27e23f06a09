#include "pipeline/trace.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "obs/trace.h"

namespace baton::pipeline {

ActionSlice SliceOf(const Action& a) {
  ActionSlice s;
  switch (a.kind) {
    case ActionKind::kForward:
      s.name = absl::StrCat("F", a.microbatch);
      s.cat = "forward";
      break;
    case ActionKind::kBackward:
      s.name = absl::StrCat("B", a.microbatch);
      s.cat = "backward";
      break;
    case ActionKind::kSendActivation:
    case ActionKind::kSendGradient:
      s.name = ToString(a);
      s.cat = "send";
      break;
    default:
      s.name = ToString(a);
      s.cat = "recv";
      break;
  }
  s.args = {{"microbatch", absl::StrCat(a.microbatch)}, {"stage", absl::StrCat(a.stage)}};
  return s;
}

bool IsActionCategory(absl::string_view cat) {
  return cat == "forward" || cat == "backward" || cat == "send" || cat == "recv";
}

namespace {

proto::TraceEvent Slice(std::string name, std::string cat, int worker, double start, double end,
                        double scale) {
  proto::TraceEvent e;
  e.set_name(std::move(name));
  e.set_cat(std::move(cat));
  e.set_ph("X");
  e.set_pid(worker);
  e.set_ts(start * scale);
  e.set_dur((end - start) * scale);
  return e;
}

}  // namespace

proto::TraceFile StepTrace(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                           double us_per_unit) {
  const ScheduleSpec& spec = schedule.spec;
  proto::TraceFile out;
  out.set_displaytimeunit("ms");
  (*out.mutable_otherdata())["schedule"] = schedule.name;
  (*out.mutable_otherdata())["workers"] = absl::StrCat(spec.workers);
  (*out.mutable_otherdata())["microbatches"] = absl::StrCat(spec.microbatches);
  (*out.mutable_otherdata())["chunks"] = absl::StrCat(spec.chunks);
  for (int w = 0; w < spec.workers; ++w) {
    std::vector<int> stages;
    for (int c = 0; c < spec.chunks; ++c) stages.push_back(c * spec.workers + w);
    proto::TraceEvent name;
    name.set_name("process_name");
    name.set_ph("M");
    name.set_pid(w);
    (*name.mutable_args())["name"] = absl::StrCat(
        "worker ", w, " (stage", stages.size() > 1 ? "s " : " ", absl::StrJoin(stages, ", "), ")");
    *out.add_traceevents() = std::move(name);
  }
  double end = 0;
  for (const auto& e : events) end = std::max(end, e.end);
  for (int w = 0; w < spec.workers; ++w) {
    std::vector<const TimelineEvent*> list;
    for (const auto& e : events) {
      if (e.worker == w) list.push_back(&e);
    }
    std::stable_sort(list.begin(), list.end(), [](const TimelineEvent* a, const TimelineEvent* b) {
      return a->start < b->start;
    });
    double t = 0;
    for (const TimelineEvent* e : list) {
      if (e->start > t + 1e-12) {
        *out.add_traceevents() = Slice("idle", "idle", w, t, e->start, us_per_unit);
      }
      ActionSlice a = SliceOf(e->action);
      proto::TraceEvent s =
          Slice(std::move(a.name), std::move(a.cat), w, e->start, e->end, us_per_unit);
      s.mutable_args()->insert(a.args.begin(), a.args.end());
      *out.add_traceevents() = std::move(s);
      t = std::max(t, e->end);
    }
    if (end > t + 1e-12) *out.add_traceevents() = Slice("idle", "idle", w, t, end, us_per_unit);
  }
  return out;
}

proto::TraceFile StepView(const proto::TraceFile& merged, int64_t step) {
  const std::string want = absl::StrCat(step);
  return obs::SelectTrace(merged, [&want](const proto::TraceEvent& e) {
    const auto it = e.args().find("step");
    return IsActionCategory(e.cat()) && it != e.args().end() && it->second == want;
  });
}

std::string ChromeTrace(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                        double us_per_unit) {
  return obs::TraceJson(StepTrace(schedule, events, us_per_unit));
}

std::string TimelineSvg(const Schedule& schedule, const std::vector<TimelineEvent>& events,
                        int width) {
  return obs::TraceSvg(StepTrace(schedule, events, 1.0), width);
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
