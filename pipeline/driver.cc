#include "pipeline/driver.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "pipeline/internal/functions.h"
#include "pipeline/trace.h"
#include "rpc/executor.h"

namespace baton::pipeline {
namespace {

namespace fs = std::filesystem;
using internal::StepReply;
using internal::StepRequest;

std::string StateFile(const std::string& dir, int worker) {
  return (fs::path(dir) / absl::StrCat("worker-", worker, ".state")).string();
}

std::string StepDir(const std::string& checkpoint_dir, int64_t step) {
  return (fs::path(checkpoint_dir) / absl::StrCat("step-", step)).string();
}

std::string StagesOf(const ScheduleSpec& spec, int worker) {
  std::vector<int> stages;
  for (int c = 0; c < spec.chunks; ++c) stages.push_back(c * spec.workers + worker);
  return absl::StrCat(stages.size() > 1 ? "stages " : "stage ", absl::StrJoin(stages, ", "));
}

// The values of a step reply that the driver relies on;
// DATA_LOSS naming the field (PL3: the reply counts as the worker's failure).
absl::Status CheckReply(const ScheduleSpec& spec, const StepReply& r) {
  auto bad = [](const std::string& what) {
    return absl::DataLossError(absl::StrCat("bad step reply: StepReply.", what));
  };
  if (r.peak_stashed < 0) return bad(absl::StrCat("peak_stashed is ", r.peak_stashed));
  for (size_t i = 0; i < r.events.size(); ++i) {
    const internal::WireAction& a = r.events[i].action;
    if (!internal::IsActionKind(a.kind)) {
      return bad(absl::StrCat("events[", i, "].action.kind is ", a.kind, ", not an action kind"));
    }
    if (a.stage < 0 || a.stage >= spec.stages() || a.microbatch < 0 ||
        a.microbatch >= spec.microbatches) {
      return bad(absl::StrCat("events[", i, "].action (stage ", a.stage, ", micro-batch ",
                              a.microbatch, ") is outside the schedule"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Create(rpc::RpcAgent& agent,
                                                           PipelineOptions options) {
  const ScheduleSpec& spec = options.schedule.spec;
  if (static_cast<int>(options.stage_workers.size()) != spec.workers) {
    return absl::InvalidArgumentError(absl::StrCat("Pipeline: ", options.stage_workers.size(),
                                                   " stage workers for a schedule of ",
                                                   spec.workers, " workers"));
  }
  if (absl::Status s = Validate(options.schedule); !s.ok()) return Annotate(s, "Pipeline");
  if (options.batch_size < 1 || options.batch_size % spec.microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Pipeline: batch ", options.batch_size,
                                                   " is not a positive multiple of ",
                                                   spec.microbatches, " micro-batches"));
  }
  if (absl::Status s = dist_optim::ValidateOptions(options.optimizer); !s.ok()) {
    return Annotate(s, "Pipeline: optimizer");
  }
  if (!options.model) return absl::InvalidArgumentError("Pipeline: no model factory");
  if (options.step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("Pipeline: step_timeout must be positive");
  }
  torch::nn::Sequential model = options.model();
  auto cuts = ComputeCuts(*model, spec.stages(), options.split);
  if (!cuts.ok()) return Annotate(cuts.status(), "Pipeline");
  std::unique_ptr<Pipeline> p(new Pipeline(agent, std::move(options), std::move(*cuts)));
  std::string restore;
  const std::string& dir = p->options_.checkpoint_dir;
  if (!dir.empty()) {
    auto latest = ReadFile((fs::path(dir) / "LATEST").string());
    if (latest.ok()) {
      int64_t step = -1;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*latest), &step) || step < 0) {
        return absl::DataLossError(
            absl::StrCat("Pipeline: ", dir, "/LATEST does not hold a step number"));
      }
      p->restored_step_ = step;
      restore = StepDir(dir, step);
    }
  }
  RETURN_IF_ERROR(p->Configure(restore));
  return p;
}

absl::Status Pipeline::Configure(const std::string& restore_dir) {
  const Schedule& sch = options_.schedule;
  const ScheduleSpec& spec = sch.spec;
  std::vector<rpc::Future<int64_t>> futures;
  for (int w = 0; w < spec.workers; ++w) {
    internal::ConfigureRequest r;
    r.schedule = sch.name;
    r.workers = spec.workers;
    r.microbatches = spec.microbatches;
    r.chunks = spec.chunks;
    r.rank = w;
    for (const Action& a : sch.per_worker[w]) r.actions.push_back(internal::ToWire(a));
    r.cuts.assign(cuts_.begin(), cuts_.end());
    r.optimizer = dist_optim::EncodeOptions(options_.optimizer);
    r.batch_size = options_.batch_size;
    r.stage_workers = options_.stage_workers;
    if (!restore_dir.empty()) r.restore_file = StateFile(restore_dir, w);
    futures.push_back(
        agent_.rpc_async(options_.stage_workers[w], internal::kConfigureFn, std::move(r)));
  }
  std::vector<std::string> errors;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::set<int64_t> steps;
  for (int w = 0; w < spec.workers; ++w) {
    const auto& r = futures[w].result();
    if (!r.ok()) {
      if (errors.empty()) code = r.status().code();
      errors.push_back(absl::StrCat("pipeline worker ", w, " ('", options_.stage_workers[w], "', ",
                                    StagesOf(spec, w), "): ", r.status().ToString()));
    } else {
      steps.insert(*r);
    }
  }
  if (!errors.empty()) {
    return absl::Status(
        code, absl::StrCat("configuring the pipeline failed: ", absl::StrJoin(errors, "; ")));
  }
  if (steps.size() != 1) {
    return absl::DataLossError(absl::StrCat("the stage workers restored different step counts: ",
                                            absl::StrJoin(steps, ", ")));
  }
  steps_done_ = *steps.begin();
  if (restored_step_ >= 0 && steps_done_ != restored_step_) {
    return absl::DataLossError(absl::StrCat("checkpoint step-", restored_step_, " holds states of ",
                                            steps_done_, " steps"));
  }
  next_step_id_ = steps_done_;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Pipeline::Step(const torch::Tensor& inputs,
                                          const torch::Tensor& targets) {
  const ScheduleSpec& spec = options_.schedule.spec;
  for (const auto& [t, what] : {std::pair{&inputs, "inputs"}, std::pair{&targets, "targets"}}) {
    if (!t->defined() || t->dim() < 1 || t->size(0) != options_.batch_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pipeline::Step: the ", what, " must have ", options_.batch_size, " rows"));
    }
  }
  const int p = spec.workers;
  const int first = spec.worker_of(0), last = spec.worker_of(spec.stages() - 1);
  const int64_t id = next_step_id_++;
  const absl::Time t0 = absl::Now();
  rpc::CallOptions opts;
  opts.timeout = options_.step_timeout;

  struct Gather {
    absl::Mutex mu;
    int workers = 0;
    int done ABSL_GUARDED_BY(mu) = 0;
    bool aborted ABSL_GUARDED_BY(mu) = false;
    std::vector<int> failed ABSL_GUARDED_BY(mu);  // in the order seen
    bool Progress() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return done == workers || (!aborted && !failed.empty());
    }
  };
  auto gather = std::make_shared<Gather>();
  gather->workers = p;
  std::vector<rpc::Future<StepReply>> futures;
  for (int w = 0; w < p; ++w) {
    StepRequest request{id, w == first ? std::optional<torch::Tensor>(inputs) : std::nullopt,
                        w == last ? std::optional<torch::Tensor>(targets) : std::nullopt};
    futures.push_back(agent_.rpc_async(opts, options_.stage_workers[w], internal::kRunStepFn,
                                       std::move(request)));
    futures.back().OnReady([gather, w, spec](const absl::StatusOr<StepReply>& r) {
      const bool ok = r.ok() && CheckReply(spec, *r).ok();
      absl::MutexLock lock(&gather->mu);
      ++gather->done;
      if (!ok) gather->failed.push_back(w);
    });
  }
  // Wait; on the first failure, abort the step everywhere else (PL3). The
  // wait is bounded: every call has the step's deadline.
  std::vector<int> failed;
  while (true) {
    int abort_after = -1;
    {
      rpc::Executor::BlockingScope blocking;  // on a pool thread: lends its place
      absl::MutexLock lock(&gather->mu);
      gather->mu.Await(absl::Condition(gather.get(), &Gather::Progress));
      if (gather->done == p) {
        failed = gather->failed;
        break;
      }
      gather->aborted = true;
      abort_after = gather->failed.front();
    }
    const std::string why =
        absl::StrCat("the driver aborted step ", id, " after pipeline worker ", abort_after, " ('",
                     options_.stage_workers[abort_after], "') failed");
    rpc::CallOptions short_opts;
    short_opts.timeout = absl::Seconds(5);
    for (int o = 0; o < p; ++o) {
      if (o == abort_after) continue;
      agent_.rpc_async(
          short_opts, options_.stage_workers[o], internal::kAbortFn,
          internal::AbortRequest{id, static_cast<int32_t>(absl::StatusCode::kAborted), why});
    }
  }
  if (!failed.empty()) {
    std::vector<std::string> parts;
    absl::StatusCode code = absl::StatusCode::kOk;
    for (int w : failed) {
      const auto& r = futures[w].result();
      const absl::Status s = r.ok() ? CheckReply(spec, *r) : r.status();
      if (code == absl::StatusCode::kOk) code = s.code();
      parts.push_back(absl::StrCat("pipeline worker ", w, " ('", options_.stage_workers[w], "', ",
                                   StagesOf(spec, w), "): ", s.ToString()));
    }
    return absl::Status(
        code, absl::StrCat("pipeline step ", steps_done_, " failed: ", absl::StrJoin(parts, "; ")));
  }
  StepResult out;
  out.step = steps_done_;
  out.wall_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  out.theoretical_bubble = TheoreticalBubble(options_.schedule);
  out.peak_stashed.assign(p, 0);
  double start = std::numeric_limits<double>::infinity(), end = 0, busy = 0;
  for (int w = 0; w < p; ++w) {
    const StepReply& r = *futures[w].result();  // checked by CheckReply
    if (w == last) {
      for (double l : r.losses) out.loss += l;
    }
    out.peak_stashed[w] = r.peak_stashed;
    busy += r.compute_us;
    for (const internal::WireEvent& we : r.events) {
      TimelineEvent e;
      e.worker = w;
      e.action = internal::FromWire(we.action);
      e.start = we.start_us;
      e.end = we.end_us;
      start = std::min(start, e.start);
      end = std::max(end, e.end);
      out.events.push_back(e);
    }
  }
  for (TimelineEvent& e : out.events) {
    e.start -= start;
    e.end -= start;
  }
  const double span = end - start;
  out.bubble = span > 0 ? std::max(0.0, 1.0 - busy / (p * span)) : 0.0;
  ++steps_done_;
  return out;
}

absl::Status Pipeline::SaveCheckpoint() {
  const std::string& dir = options_.checkpoint_dir;
  if (dir.empty()) {
    return absl::FailedPreconditionError("Pipeline::SaveCheckpoint: no checkpoint_dir");
  }
  const std::string step_dir = StepDir(dir, steps_done_);
  const int p = options_.schedule.spec.workers;
  std::vector<rpc::Future<void>> futures;
  for (int w = 0; w < p; ++w) {
    futures.push_back(
        agent_.rpc_async(options_.stage_workers[w], internal::kSaveFn, StateFile(step_dir, w)));
  }
  for (int w = 0; w < p; ++w) {
    if (absl::Status s = futures[w].status(); !s.ok()) {
      return Annotate(s, absl::StrCat("checkpoint of pipeline worker ", w, " ('",
                                      options_.stage_workers[w], "')"));
    }
  }
  RETURN_IF_ERROR(
      WriteFileAtomically((fs::path(dir) / "LATEST").string(), {absl::StrCat(steps_done_, "\n")}));
  // Older checkpoints are no longer needed.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "step-") && entry.path().string() != step_dir) {
      fs::remove_all(entry.path(), ec);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<torch::Tensor>> Pipeline::Parameters() {
  const ScheduleSpec& spec = options_.schedule.spec;
  std::vector<torch::Tensor> out;
  for (int s = 0; s < spec.stages(); ++s) {
    auto r = agent_
                 .rpc_async(options_.stage_workers[spec.worker_of(s)], internal::kParametersFn,
                            static_cast<int64_t>(s))
                 .result();
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("parameters of stage ", s));
    out.insert(out.end(), r->begin(), r->end());
  }
  return out;
}

std::string Pipeline::Summary(const StepResult& r) const {
  const ScheduleSpec& spec = options_.schedule.spec;
  return absl::StrFormat(
      "loss %.4f, %.1f ms, bubble %.3f measured / %.3f theoretical (%s, %d workers, %d "
      "micro-batches%s), peak stash %s",
      r.loss, r.wall_ms, r.bubble, r.theoretical_bubble, options_.schedule.name, spec.workers,
      spec.microbatches, spec.chunks > 1 ? absl::StrCat(", ", spec.chunks, " chunks") : "",
      absl::StrJoin(r.peak_stashed, "/"));
}

absl::Status Pipeline::WriteTrace(const std::string& path, const StepResult& r) const {
  return WriteChromeTrace(path, options_.schedule, r.events, 1.0);
}

absl::Status Pipeline::Finish() {
  std::vector<rpc::Future<void>> futures;
  for (const auto& name : options_.stage_workers) {
    futures.push_back(agent_.rpc_async(name, internal::kFinishFn));
  }
  absl::Status first;
  for (auto& f : futures) first.Update(f.status());
  return first;
}

}  // namespace baton::pipeline
