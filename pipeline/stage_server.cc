#include "pipeline/stage_server.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/file_io.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "dist_optim/optimizer_options.h"
#include "obs/state.h"
#include "obs/trace.h"
#include "pipeline/internal/functions.h"
#include "pipeline/trace.h"
#include "rpc/agent.h"

namespace baton::pipeline {
namespace {

using internal::ConfigureRequest;
using internal::Delivery;
using internal::kMaxCount;
using internal::StepReply;
using internal::StepRequest;

// Sends stage messages as baton.pipeline.deliver calls.
class RpcStageLink : public StageLink {
 public:
  RpcStageLink(rpc::Runtime* agent, std::vector<std::string> names)
      : agent_(agent), names_(std::move(names)) {}

  void set_deadline(absl::Time deadline) { deadline_.store(absl::ToUnixNanos(deadline)); }

  void Send(int to, StageMessage m, absl::AnyInvocable<void(absl::Status)> done) override {
    const absl::Time deadline = absl::FromUnixNanos(deadline_.load());
    rpc::CallOptions opts;
    opts.timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
    if (deadline == absl::InfiniteFuture()) opts.timeout = absl::ZeroDuration();
    // PP9: a CUDA tensor goes device to device where a device map applies
    // (the agent refuses it elsewhere); otherwise through host memory, and
    // the receiving runner moves it onto its device.
    if (m.tensor.is_cuda()) {
      auto peer = agent_->worker(names_[to]);
      if (!peer.ok() ||
          !agent_->DeviceOnPeer(peer->id, m.tensor.device().index(), /*answers=*/false).ok()) {
        m.tensor = m.tensor.to(torch::kCPU);
      }
    }
    Delivery d{m.step, static_cast<int32_t>(m.kind), m.stage, m.microbatch, std::move(m.tensor)};
    agent_->rpc_async(opts, names_[to], internal::kDeliverFn, std::move(d))
        .OnReady([done = std::move(done)](const absl::StatusOr<std::monostate>& r) mutable {
          done(r.status());
        });
  }

  std::string Describe(int worker) const override {
    return absl::StrCat("worker '", names_[worker], "'");
  }

 private:
  rpc::Runtime* const agent_;
  const std::vector<std::string> names_;
  std::atomic<int64_t> deadline_{std::numeric_limits<int64_t>::max()};
};

absl::Status OutOfRange(const char* field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("ConfigureRequest.", field, " is ", value, ", not in [", lo, ", ", hi, "]"));
}

// The checks of a configure request that need no model; each error names
// the field it refuses.
absl::Status CheckRequest(const ConfigureRequest& r) {
  for (absl::Status s : {OutOfRange("workers", r.workers, 1, kMaxCount),
                         OutOfRange("microbatches", r.microbatches, 1, kMaxCount)}) {
    if (!s.ok()) return s;
  }
  // workers x chunks stages, at most kMaxCount of them.
  RETURN_IF_ERROR(OutOfRange("chunks", r.chunks, 1, kMaxCount / r.workers));
  RETURN_IF_ERROR(OutOfRange("rank", r.rank, 0, r.workers - 1));
  if (static_cast<int64_t>(r.stage_workers.size()) != r.workers) {
    return absl::InvalidArgumentError(absl::StrCat("ConfigureRequest.stage_workers has ",
                                                   r.stage_workers.size(), " names for ", r.workers,
                                                   " workers"));
  }
  if (r.batch_size < 1 || r.batch_size % r.microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ConfigureRequest.batch_size is ", r.batch_size,
                                                   ", not a positive multiple of the ",
                                                   r.microbatches, " micro-batches"));
  }
  const int32_t stages = r.workers * r.chunks;
  for (size_t i = 0; i < r.actions.size(); ++i) {
    const internal::WireAction& a = r.actions[i];
    if (!internal::IsActionKind(a.kind)) {
      return absl::InvalidArgumentError(absl::StrCat("ConfigureRequest.actions[", i, "].kind is ",
                                                     a.kind, ", not an action kind"));
    }
    const std::string field = absl::StrCat("actions[", i, "].");
    if (absl::Status s =
            OutOfRange((field + "microbatch").c_str(), a.microbatch, 0, r.microbatches - 1);
        !s.ok()) {
      return s;
    }
    RETURN_IF_ERROR(OutOfRange((field + "stage").c_str(), a.stage, 0, stages - 1));
  }
  if (static_cast<int64_t>(r.cuts.size()) != stages + 1) {
    return absl::InvalidArgumentError(absl::StrCat("ConfigureRequest.cuts has ", r.cuts.size(),
                                                   " cut points for ", stages, " stages (needs ",
                                                   stages + 1, ")"));
  }
  if (r.cuts.front() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConfigureRequest.cuts starts at ", r.cuts.front(), ", not 0"));
  }
  for (size_t i = 1; i < r.cuts.size(); ++i) {
    if (r.cuts[i] <= r.cuts[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("ConfigureRequest.cuts must increase: [", i,
                                                     "] is ", r.cuts[i], " after ", r.cuts[i - 1]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

class StageServer::Impl {
 public:
  explicit Impl(StageServerOptions options)
      : options_(std::move(options)),
        torch_threads_(options_.torch_threads > 0 ? options_.torch_threads
                                                  : at::get_num_threads()) {
    thread_ = std::thread([this] {
      // Intra-op parallelism is per thread (OpenMP): without this the stage
      // thread would use every core, whatever the process asked for.
      at::set_num_threads(torch_threads_);
      Loop();
    });
  }

  // PL5. Fails the queued step, aborts the running one, joins the stage
  // thread.
  void Close() {
    std::optional<PendingStep> queued;
    std::shared_ptr<StageRunner> running;
    int64_t running_step = 0;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      if (pending_.has_value()) {
        queued = std::move(pending_);
        pending_.reset();
        busy_ = false;
      }
      running = running_;
      running_step = running_step_;
    }
    if (queued.has_value()) {
      queued->promise.SetError(absl::UnavailableError(absl::StrCat(
          "pipeline stage server closed before step ", queued->inputs.step, " started")));
    }
    if (running != nullptr) {
      running->Abort(running_step, absl::UnavailableError(absl::StrCat(
                                       "pipeline stage server closed during step ", running_step)));
    }
    if (thread_.joinable()) thread_.join();
  }

  absl::StatusOr<int64_t> Configure(const rpc::CallContext& ctx, const ConfigureRequest& r) {
    auto context = absl::StrCat("pipeline configure (", r.schedule, ")");
    if (absl::Status s = CheckRequest(r); !s.ok()) return Annotate(s, context);
    const ScheduleSpec spec{r.workers, r.microbatches, r.chunks};
    std::vector<Action> actions;
    actions.reserve(r.actions.size());
    for (const internal::WireAction& a : r.actions) actions.push_back(internal::FromWire(a));
    auto opt = dist_optim::DecodeOptions(r.optimizer);
    if (!opt.ok()) return Annotate(opt.status(), "pipeline configure: optimizer options");
    torch::nn::Sequential model;
    try {
      model = options_.model();
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("pipeline configure: the model factory threw: ", e.what()));
    }
    const int64_t layers = static_cast<int64_t>(model->size());
    if (r.cuts.back() != layers) {
      return absl::InvalidArgumentError(absl::StrCat(context, ": ConfigureRequest.cuts end at ",
                                                     r.cuts.back(), ", but the model has ", layers,
                                                     " layers"));
    }
    std::vector<torch::nn::Sequential> chunks;
    for (int c = 0; c < spec.chunks; ++c) {
      const int s = c * spec.workers + r.rank;
      chunks.push_back(Slice(*model, r.cuts[s], r.cuts[s + 1]));
    }
    StageConfig config{spec, r.rank, std::move(actions), r.batch_size, *opt, options_.device};
    ASSIGN_OR_RETURN(auto runner,
                     StageRunner::Create(std::move(config), std::move(chunks), options_.loss));
    if (!r.restore_file.empty()) {
      auto bytes = ReadFile(r.restore_file);
      if (!bytes.ok()) return Annotate(bytes.status(), "pipeline restore");
      if (absl::Status s = (runner)->LoadState(*bytes); !s.ok()) {
        return Annotate(s, absl::StrCat("pipeline restore from ", r.restore_file));
      }
    }
    const int64_t steps = (runner)->steps_taken();
    absl::MutexLock lock(&mu_);
    if (closed_) return Closed();
    if (busy_) return absl::FailedPreconditionError("pipeline configure: a step is running");
    runner_ = std::shared_ptr<StageRunner>(std::move(runner));
    link_ = std::make_shared<RpcStageLink>(ctx.runtime, r.stage_workers);
    trace_ = ctx.runtime->trace();
    stage_ranks_.clear();
    for (const std::string& name : r.stage_workers) {
      auto w = ctx.runtime->worker(name);
      stage_ranks_.push_back(w.ok() ? w->id : -1);
    }
    steps_ = steps;
    return steps;
  }

  rpc::Future<StepReply> RunStep(const rpc::CallContext& ctx, StepRequest r) {
    rpc::Promise<StepReply> promise(ctx.runtime->executor());
    absl::MutexLock lock(&mu_);
    if (closed_) return rpc::MakeErrorFuture<StepReply>(Closed());
    if (runner_ == nullptr) {
      return rpc::MakeErrorFuture<StepReply>(
          absl::FailedPreconditionError("pipeline run_step: this stage is not configured"));
    }
    if (busy_) {
      return rpc::MakeErrorFuture<StepReply>(absl::FailedPreconditionError(
          absl::StrCat("pipeline run_step ", r.step, ": a step is already running")));
    }
    busy_ = true;
    pending_ =
        PendingStep{StepInputs{r.step, r.inputs ? std::move(*r.inputs) : torch::Tensor(),
                               r.targets ? std::move(*r.targets) : torch::Tensor(), ctx.deadline},
                    runner_, link_, promise};
    return promise.future();
  }

  absl::Status Deliver(Delivery d) {
    std::shared_ptr<StageRunner> runner;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return Closed();
      runner = runner_;
    }
    if (runner == nullptr) {
      return absl::FailedPreconditionError("pipeline deliver: this stage is not configured");
    }
    if (d.kind != static_cast<int32_t>(MessageKind::kActivation) &&
        d.kind != static_cast<int32_t>(MessageKind::kGradient)) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline deliver: Delivery.kind is ", d.kind,
                                                     ", neither 0 (activation) nor 1 (gradient)"));
    }
    // The runner refuses stages and micro-batches it does not have (PP7).
    return runner->Deliver(
        {d.step, static_cast<MessageKind>(d.kind), d.stage, d.microbatch, std::move(d.tensor)});
  }

  absl::Status Abort(const internal::AbortRequest& r) {
    std::shared_ptr<StageRunner> runner;
    {
      absl::MutexLock lock(&mu_);
      runner = runner_;
    }
    if (runner != nullptr) runner->Abort(r.step, StatusFromWire(r.code, r.message));
    return absl::OkStatus();
  }

  absl::Status Save(const std::string& path) {
    std::shared_ptr<StageRunner> runner;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return Closed();
      if (runner_ == nullptr || busy_) {
        return absl::FailedPreconditionError(
            "pipeline save: the stage is not configured or a step is running");
      }
      runner = runner_;
      busy_ = true;  // no step while the state is read
    }
    absl::StatusOr<std::string> state = runner->SaveState();
    absl::Status s = state.ok() ? WriteFileAtomically(path, {*state}) : state.status();
    absl::MutexLock lock(&mu_);
    busy_ = false;
    return s;
  }

  absl::StatusOr<std::vector<torch::Tensor>> Parameters(int64_t stage) {
    std::shared_ptr<StageRunner> runner;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return Closed();
      if (runner_ == nullptr || busy_) {
        return absl::FailedPreconditionError(
            "pipeline parameters: the stage is not configured or a step is running");
      }
      runner = runner_;
    }
    if (stage < 0 || stage > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline parameters: stage ", stage));
    }
    std::vector<torch::Tensor> out;
    for (const auto& p : runner->StageParameters(static_cast<int>(stage))) {
      out.push_back(p.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    }
    if (out.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline parameters: stage ", stage, " is not on this worker"));
    }
    return out;
  }

  void Finish() {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }

  absl::Status WaitForFinish(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("the pipeline driver did not finish within ",
                                                      absl::FormatDuration(timeout)));
    }
    return absl::OkStatus();
  }

  int64_t steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

  static absl::Status Closed() { return absl::UnavailableError("pipeline stage server: closed"); }

 private:
  // A run_step call accepted and not yet started.
  struct PendingStep {
    StepInputs inputs;
    std::shared_ptr<StageRunner> runner;
    std::shared_ptr<RpcStageLink> link;
    rpc::Promise<StepReply> promise;
  };

  // The stage thread: runs the steps, one at a time, until Close().
  void Loop() {
    while (true) {
      std::optional<PendingStep> step;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return closed_ || pending_.has_value();
        };
        mu_.Await(absl::Condition(&ready));
        if (closed_) return;  // Close() failed a step still queued
        step = std::move(pending_);
        pending_.reset();
        running_ = step->runner;
        running_step_ = step->inputs.step;
      }
      Run(std::move(*step));
    }
  }

  void Run(PendingStep step) {
    step.link->set_deadline(step.inputs.deadline);
    const int64_t step_id = step.inputs.step;
    const absl::Time started = absl::Now();
    absl::StatusOr<StepReport> r = step.runner->RunStep(std::move(step.inputs), *step.link);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
      running_ = nullptr;
      if (r.ok()) {
        steps_ = step.runner->steps_taken();
        // The bubble: the part of the step this stage spent neither in
        // forwards and backwards nor in its optimizer.
        const double busy = (r->compute_us + r->optimizer_us) / 1e6;
        ++timing_.steps;
        timing_.step_seconds += seconds;
        timing_.busy_seconds += busy;
        timing_.last_bubble = seconds > 0 ? std::clamp(1 - busy / seconds, 0.0, 1.0) : 0;
      }
    }
    if (!r.ok()) {
      step.promise.SetError(r.status());
      return;
    }
    // The job's timeline (obs/trace.h): this stage's actions, as it timed them.
    obs::TraceRecorder* trace = nullptr;
    {
      absl::MutexLock lock(&mu_);
      trace = trace_;
    }
    if (trace != nullptr) {
      for (const TimelineEvent& e : r->events) {
        // Named as the driver's view names them (pipeline/trace.h).
        ActionSlice a = SliceOf(e.action);
        a.args["step"] = absl::StrCat(step_id);
        trace->Slice(
            a.name, a.cat, absl::UnixEpoch() + absl::Microseconds(static_cast<int64_t>(e.start)),
            absl::UnixEpoch() + absl::Microseconds(static_cast<int64_t>(e.end)), std::move(a.args));
      }
    }
    StepReply reply;
    reply.losses = std::move(r->losses);
    reply.events.reserve(r->events.size());
    for (const TimelineEvent& e : r->events) {
      reply.events.push_back({internal::ToWire(e.action), e.start, e.end});
    }
    reply.peak_stashed = r->peak_stashed;
    reply.compute_us = r->compute_us;
    reply.optimizer_us = r->optimizer_us;
    step.promise.SetValue(std::move(reply));
  }

 public:
  // The hang report: this stage's current action, and a receive as a wait
  // on the worker whose message it waits for.
  void CollectState(obs::StateWriter& w) const {
    std::shared_ptr<StageRunner> runner;
    std::vector<int> ranks;
    {
      absl::MutexLock lock(&mu_);
      runner = running_ != nullptr ? running_ : runner_;
      ranks = stage_ranks_;
    }
    auto section = w.AddSection("pipeline");
    if (runner == nullptr) {
      section.Field("action", "not configured");
      return;
    }
    const StageRunner::Activity a = runner->CurrentActivity();
    section.Field("worker", runner->config().worker)
        .Field("step", a.step)
        .Field("action", a.action.empty() ? "idle between steps" : a.action)
        .Field("actions_done", a.actions_done);
    w.AddProgress("pipeline_actions", a.actions_done);
    if (a.action.empty() || a.waits_for_stage < 0) return;
    const int from = runner->config().spec.worker_of(a.waits_for_stage);
    const std::string what =
        absl::StrCat("step ", a.step, ", ", a.action, ": the message of stage ", a.waits_for_stage);
    section.Line(absl::StrCat("waits for ", what, " (stage worker ", from, ")"));
    if (from < static_cast<int>(ranks.size()) && ranks[from] >= 0) {
      w.AddWait(ranks[from], "pipeline", what, a.since);
    }
  }

  void CollectMetrics(obs::MetricsWriter& w) const {
    Timing t;
    {
      absl::MutexLock lock(&mu_);
      t = timing_;
    }
    w.Counter("baton_pipeline_steps_total", "Pipeline steps this stage worker completed.",
              static_cast<double>(t.steps));
    w.Counter("baton_pipeline_step_seconds_total", "Wall time of those steps on this stage worker.",
              t.step_seconds);
    w.Counter("baton_pipeline_busy_seconds_total",
              "Of that, time in forwards, backwards and the optimizer; the rest is the bubble.",
              t.busy_seconds);
    w.Gauge("baton_pipeline_bubble_ratio",
            "The last step's bubble: the fraction of it this stage worker was idle or waiting.",
            t.last_bubble);
  }

 private:
  const StageServerOptions options_;
  const int torch_threads_;
  mutable absl::Mutex mu_;
  std::shared_ptr<StageRunner> runner_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<RpcStageLink> link_ ABSL_GUARDED_BY(mu_);
  std::vector<int> stage_ranks_ ABSL_GUARDED_BY(mu_);         // rank of each stage worker
  obs::TraceRecorder* trace_ ABSL_GUARDED_BY(mu_) = nullptr;  // the agent's, if tracing
  // Steps completed here and where their time went, for the metrics.
  struct Timing {
    int64_t steps = 0;
    double step_seconds = 0;
    double busy_seconds = 0;
    double last_bubble = 0;
  };
  Timing timing_ ABSL_GUARDED_BY(mu_);
  // busy_: a step is queued or running, or a save reads the state.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<PendingStep> pending_ ABSL_GUARDED_BY(mu_);
  // The runner of the step the stage thread runs (null when none), and its id.
  std::shared_ptr<StageRunner> running_ ABSL_GUARDED_BY(mu_);
  int64_t running_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<StageServer>> StageServer::Create(rpc::FunctionRegistry& registry,
                                                                 StageServerOptions options) {
  if (!options.model) return absl::InvalidArgumentError("StageServer: no model factory");
  if (!options.loss) return absl::InvalidArgumentError("StageServer: no loss function");
  auto impl = std::make_shared<Impl>(std::move(options));
  std::weak_ptr<Impl> weak = impl;
  registry.AddStateCollector([weak](obs::StateWriter& w) {
    if (auto self = weak.lock()) self->CollectState(w);
  });
  registry.AddMetricsCollector([weak](obs::MetricsWriter& w) {
    if (auto self = weak.lock()) self->CollectMetrics(w);
  });
  absl::Status s = registry.Register(
      internal::kConfigureFn,
      [weak](const rpc::CallContext& ctx, ConfigureRequest r) -> absl::StatusOr<int64_t> {
        auto self = weak.lock();
        if (self == nullptr) return Impl::Closed();
        return self->Configure(ctx, r);
      });
  if (s.ok()) {
    s = registry.Register(internal::kRunStepFn, [weak](const rpc::CallContext& ctx, StepRequest r) {
      auto self = weak.lock();
      if (self == nullptr) return rpc::MakeErrorFuture<StepReply>(Impl::Closed());
      return self->RunStep(ctx, std::move(r));
    });
  }
  if (s.ok()) {
    s = registry.Register(internal::kDeliverFn, [weak](Delivery d) -> absl::Status {
      auto self = weak.lock();
      if (self == nullptr) return Impl::Closed();
      return self->Deliver(std::move(d));
    });
  }
  if (s.ok()) {
    s = registry.Register(internal::kAbortFn, [weak](internal::AbortRequest r) -> absl::Status {
      auto self = weak.lock();
      if (self == nullptr) return absl::OkStatus();
      return self->Abort(r);
    });
  }
  if (s.ok()) {
    s = registry.Register(internal::kSaveFn, [weak](std::string path) -> absl::Status {
      auto self = weak.lock();
      if (self == nullptr) return Impl::Closed();
      return self->Save(path);
    });
  }
  if (s.ok()) {
    s = registry.Register(internal::kParametersFn,
                          [weak](int64_t stage) -> absl::StatusOr<std::vector<torch::Tensor>> {
                            auto self = weak.lock();
                            if (self == nullptr) return Impl::Closed();
                            return self->Parameters(stage);
                          });
  }
  if (s.ok()) {
    s = registry.Register(internal::kFinishFn, [weak]() -> absl::Status {
      if (auto self = weak.lock()) self->Finish();
      return absl::OkStatus();
    });
  }
  if (!s.ok()) {
    impl->Close();
    return Annotate(s, "StageServer: registering the pipeline functions");
  }
  return std::unique_ptr<StageServer>(new StageServer(std::move(impl)));
}

StageServer::~StageServer() { impl_->Close(); }

absl::Status StageServer::WaitForFinish(absl::Duration timeout) {
  return impl_->WaitForFinish(timeout);
}

int64_t StageServer::steps_taken() const { return impl_->steps(); }

}  // namespace baton::pipeline
