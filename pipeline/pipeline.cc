#include "pipeline/pipeline.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <limits>
#include <set>
#include <thread>
#include <utility>

#include <ATen/Parallel.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"
#include "base/status.h"
#include "pipeline/internal/functions.h"
#include "pipeline/trace.h"
#include "rpc/executor.h"

namespace baton::pipeline {
namespace {

namespace fs = std::filesystem;
using internal::StepReply;

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

// Sends stage messages as baton.pipeline.deliver calls.
class RpcStageLink : public StageLink {
 public:
  RpcStageLink(rpc::RpcAgent* agent, std::vector<std::string> names)
      : agent_(agent), names_(std::move(names)) {}

  void set_deadline(absl::Time deadline) { deadline_.store(absl::ToUnixNanos(deadline)); }

  void Send(int to, StageMessage m, absl::AnyInvocable<void(absl::Status)> done) override {
    const absl::Time deadline = absl::FromUnixNanos(deadline_.load());
    rpc::CallOptions opts;
    opts.timeout = std::max(absl::Milliseconds(1), deadline - absl::Now());
    if (deadline == absl::InfiniteFuture()) opts.timeout = absl::ZeroDuration();
    agent_
        ->rpc_async(opts, names_[to], internal::kDeliverFn, m.step,
                    static_cast<int64_t>(m.kind), static_cast<int64_t>(m.stage),
                    static_cast<int64_t>(m.microbatch), std::move(m.tensor))
        .OnReady([done = std::move(done)](const absl::StatusOr<std::monostate>& r) mutable {
          done(r.status());
        });
  }

  std::string Describe(int worker) const override {
    return absl::StrCat("worker '", names_[worker], "'");
  }

 private:
  rpc::RpcAgent* const agent_;
  const std::vector<std::string> names_;
  std::atomic<int64_t> deadline_{std::numeric_limits<int64_t>::max()};
};

}  // namespace

// ---------------------------------------------------------------------------
// StageServer

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

  void Close() {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  absl::StatusOr<int64_t> Configure(const rpc::CallContext& ctx, const std::string& name,
                                    const std::vector<int64_t>& spec_v,
                                    const std::vector<int64_t>& actions_v,
                                    const std::vector<int64_t>& cuts_v,
                                    const std::string& optimizer, int64_t batch,
                                    const std::vector<std::string>& names,
                                    const std::string& restore) {
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline configure (", name, "): ", why));
    };
    if (spec_v.size() != 4) return bad("the spec needs 4 numbers");
    const int64_t limit = 1 << 16;
    for (int64_t v : spec_v) {
      if (v < 0 || v > limit) return bad(absl::StrCat("spec value ", v, " out of range"));
    }
    ScheduleSpec spec{static_cast<int>(spec_v[0]), static_cast<int>(spec_v[1]),
                      static_cast<int>(spec_v[2])};
    const int worker = static_cast<int>(spec_v[3]);
    if (spec.workers < 1 || spec.microbatches < 1 || spec.chunks < 1 || worker >= spec.workers) {
      return bad(absl::StrCat("worker ", worker, " of ", spec.workers, ", ", spec.microbatches,
                              " micro-batches, ", spec.chunks, " chunks"));
    }
    if (static_cast<int>(names.size()) != spec.workers) {
      return bad(absl::StrCat(names.size(), " worker names for ", spec.workers, " workers"));
    }
    if (actions_v.size() % 3 != 0) return bad("actions must be (kind, microbatch, stage) triples");
    std::vector<Action> actions;
    for (size_t i = 0; i < actions_v.size(); i += 3) {
      if (actions_v[i] < 0 || actions_v[i] > static_cast<int64_t>(ActionKind::kRecvGradient) ||
          actions_v[i + 1] < 0 || actions_v[i + 1] > limit || actions_v[i + 2] < 0 ||
          actions_v[i + 2] > limit) {
        return bad(absl::StrCat("action ", i / 3, " is malformed"));
      }
      actions.push_back({static_cast<ActionKind>(actions_v[i]), static_cast<int>(actions_v[i + 1]),
                         static_cast<int>(actions_v[i + 2])});
    }
    auto opt = dist_optim::DecodeOptions(optimizer);
    if (!opt.ok()) return Annotate(opt.status(), "pipeline configure: optimizer options");
    torch::nn::Sequential model;
    try {
      model = options_.model();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("pipeline configure: the model factory threw: ",
                                              e.what()));
    }
    const int64_t layers = static_cast<int64_t>(model->size());
    if (static_cast<int>(cuts_v.size()) != spec.stages() + 1 || cuts_v.front() != 0 ||
        cuts_v.back() != layers) {
      return bad(absl::StrCat("cut points ", absl::StrJoin(cuts_v, ","), " do not split ",
                              layers, " layers into ", spec.stages(), " stages"));
    }
    for (size_t i = 1; i < cuts_v.size(); ++i) {
      if (cuts_v[i] <= cuts_v[i - 1]) return bad("cut points must increase");
    }
    std::vector<torch::nn::Sequential> chunks;
    for (int c = 0; c < spec.chunks; ++c) {
      const int s = c * spec.workers + worker;
      chunks.push_back(
          Slice(*model, static_cast<int>(cuts_v[s]), static_cast<int>(cuts_v[s + 1])));
    }
    StageConfig config{spec, worker, std::move(actions), batch, *opt};
    auto runner = StageRunner::Create(std::move(config), std::move(chunks), options_.loss);
    if (!runner.ok()) return runner.status();
    if (!restore.empty()) {
      auto bytes = ReadFile(restore);
      if (!bytes.ok()) return Annotate(bytes.status(), "pipeline restore");
      if (absl::Status s = (*runner)->LoadState(*bytes); !s.ok()) {
        return Annotate(s, absl::StrCat("pipeline restore from ", restore));
      }
    }
    const int64_t steps = (*runner)->steps_taken();
    absl::MutexLock lock(&mu_);
    if (busy_) return absl::FailedPreconditionError("pipeline configure: a step is running");
    runner_ = std::shared_ptr<StageRunner>(std::move(*runner));
    link_ = std::make_shared<RpcStageLink>(ctx.agent, names);
    steps_ = steps;
    return steps;
  }

  rpc::Future<StepReply> RunStep(const rpc::CallContext& ctx, int64_t step,
                                 std::optional<torch::Tensor> inputs,
                                 std::optional<torch::Tensor> targets) {
    rpc::Promise<StepReply> promise(ctx.agent->executor());
    std::shared_ptr<StageRunner> runner;
    std::shared_ptr<RpcStageLink> link;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return rpc::MakeErrorFuture<StepReply>(absl::UnavailableError("stage closed"));
      if (runner_ == nullptr) {
        return rpc::MakeErrorFuture<StepReply>(
            absl::FailedPreconditionError("pipeline run_step: this stage is not configured"));
      }
      if (busy_) {
        return rpc::MakeErrorFuture<StepReply>(absl::FailedPreconditionError(
            absl::StrCat("pipeline run_step ", step, ": a step is already running")));
      }
      busy_ = true;
      runner = runner_;
      link = link_;
      StepInputs in{step, inputs ? std::move(*inputs) : torch::Tensor(),
                    targets ? std::move(*targets) : torch::Tensor(), ctx.deadline};
      tasks_.push_back([this, runner, link, promise, in = std::move(in)]() mutable {
        link->set_deadline(in.deadline);
        absl::StatusOr<StepReport> r = runner->RunStep(std::move(in), *link);
        {
          absl::MutexLock lock(&mu_);
          busy_ = false;
          if (r.ok()) steps_ = runner->steps_taken();
        }
        if (!r.ok()) {
          promise.SetError(r.status());
          return;
        }
        std::vector<double> events;
        events.reserve(r->events.size() * 5);
        for (const TimelineEvent& e : r->events) {
          events.insert(events.end(), {static_cast<double>(e.action.kind),
                                       static_cast<double>(e.action.microbatch),
                                       static_cast<double>(e.action.stage), e.start, e.end});
        }
        promise.SetValue(StepReply{std::move(r->losses), std::move(events), r->peak_stashed,
                                   r->compute_us, r->optimizer_us});
      });
    }
    return promise.future();
  }

  absl::Status Deliver(int64_t step, int64_t kind, int64_t stage, int64_t mb, torch::Tensor t) {
    std::shared_ptr<StageRunner> runner = current();
    if (runner == nullptr) {
      return absl::FailedPreconditionError("pipeline deliver: this stage is not configured");
    }
    const int64_t limit = 1 << 16;
    if (kind < 0 || kind > 1 || stage < 0 || stage > limit || mb < 0 || mb > limit) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline deliver: bad message (kind ", kind,
                                                     ", stage ", stage, ", micro-batch ", mb,
                                                     ")"));
    }
    return runner->Deliver({step, static_cast<MessageKind>(kind), static_cast<int>(stage),
                            static_cast<int>(mb), std::move(t)});
  }

  absl::Status Abort(int64_t step, int64_t code, const std::string& message) {
    std::shared_ptr<StageRunner> runner = current();
    if (runner != nullptr) {
      runner->Abort(step, StatusFromWire(static_cast<int>(code), message));
    }
    return absl::OkStatus();
  }

  absl::Status Save(const std::string& path) {
    std::shared_ptr<StageRunner> runner;
    {
      absl::MutexLock lock(&mu_);
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
      out.push_back(p.detach().clone());
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
      return absl::DeadlineExceededError(absl::StrCat(
          "the pipeline driver did not finish within ", absl::FormatDuration(timeout)));
    }
    return absl::OkStatus();
  }

  int64_t steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

 private:
  std::shared_ptr<StageRunner> current() {
    absl::MutexLock lock(&mu_);
    return runner_;
  }

  void Loop() {
    while (true) {
      absl::AnyInvocable<void()> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return closed_ || !tasks_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (closed_) return;  // a step still queued fails at its caller's deadline
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  const StageServerOptions options_;
  const int torch_threads_;
  mutable absl::Mutex mu_;
  std::shared_ptr<StageRunner> runner_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<RpcStageLink> link_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::AnyInvocable<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // the stage thread: runs the steps, one at a time
};

absl::StatusOr<std::unique_ptr<StageServer>> StageServer::Create(rpc::FunctionRegistry& registry,
                                                                 StageServerOptions options) {
  if (!options.model) return absl::InvalidArgumentError("StageServer: no model factory");
  if (!options.loss) return absl::InvalidArgumentError("StageServer: no loss function");
  auto impl = std::make_shared<Impl>(std::move(options));
  std::weak_ptr<Impl> weak = impl;
  const absl::Status closed = absl::UnavailableError("pipeline stage server: closed");
  absl::Status s = registry.Register(
      internal::kConfigureFn,
      [weak, closed](const rpc::CallContext& ctx, std::string name, std::vector<int64_t> spec,
                     std::vector<int64_t> actions, std::vector<int64_t> cuts,
                     std::string optimizer, int64_t batch, std::vector<std::string> names,
                     std::string restore) -> absl::StatusOr<int64_t> {
        auto self = weak.lock();
        if (self == nullptr) return closed;
        return self->Configure(ctx, name, spec, actions, cuts, optimizer, batch, names, restore);
      });
  if (s.ok()) {
    s = registry.Register(internal::kRunStepFn,
                          [weak, closed](const rpc::CallContext& ctx, int64_t step,
                                         std::optional<torch::Tensor> inputs,
                                         std::optional<torch::Tensor> targets) {
                            auto self = weak.lock();
                            if (self == nullptr) return rpc::MakeErrorFuture<StepReply>(closed);
                            return self->RunStep(ctx, step, std::move(inputs), std::move(targets));
                          });
  }
  if (s.ok()) {
    s = registry.Register(internal::kDeliverFn,
                          [weak, closed](int64_t step, int64_t kind, int64_t stage, int64_t mb,
                                         torch::Tensor t) -> absl::Status {
                            auto self = weak.lock();
                            if (self == nullptr) return closed;
                            return self->Deliver(step, kind, stage, mb, std::move(t));
                          });
  }
  if (s.ok()) {
    s = registry.Register(internal::kAbortFn,
                          [weak](int64_t step, int64_t code, std::string message) -> absl::Status {
                            auto self = weak.lock();
                            if (self == nullptr) return absl::OkStatus();
                            return self->Abort(step, code, message);
                          });
  }
  if (s.ok()) {
    s = registry.Register(internal::kSaveFn, [weak, closed](std::string path) -> absl::Status {
      auto self = weak.lock();
      if (self == nullptr) return closed;
      return self->Save(path);
    });
  }
  if (s.ok()) {
    s = registry.Register(
        internal::kParametersFn,
        [weak, closed](int64_t stage) -> absl::StatusOr<std::vector<torch::Tensor>> {
          auto self = weak.lock();
          if (self == nullptr) return closed;
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

// ---------------------------------------------------------------------------
// Pipeline (the driver)

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
  if (absl::Status s = p->Configure(restore); !s.ok()) return s;
  return p;
}

absl::Status Pipeline::Configure(const std::string& restore_dir) {
  const Schedule& sch = options_.schedule;
  const ScheduleSpec& spec = sch.spec;
  std::vector<rpc::Future<int64_t>> futures;
  const std::vector<int64_t> cuts(cuts_.begin(), cuts_.end());
  const std::string optimizer = dist_optim::EncodeOptions(options_.optimizer);
  for (int w = 0; w < spec.workers; ++w) {
    std::vector<int64_t> actions;
    for (const Action& a : sch.per_worker[w]) {
      actions.insert(actions.end(), {static_cast<int64_t>(a.kind), a.microbatch, a.stage});
    }
    futures.push_back(agent_.rpc_async(
        options_.stage_workers[w], internal::kConfigureFn, sch.name,
        std::vector<int64_t>{spec.workers, spec.microbatches, spec.chunks, w}, std::move(actions),
        cuts, optimizer, options_.batch_size, options_.stage_workers,
        restore_dir.empty() ? std::string() : StateFile(restore_dir, w)));
  }
  std::vector<std::string> errors;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::set<int64_t> steps;
  for (int w = 0; w < spec.workers; ++w) {
    const auto& r = futures[w].result();
    if (!r.ok()) {
      if (errors.empty()) code = r.status().code();
      errors.push_back(absl::StrCat("pipeline worker ", w, " ('", options_.stage_workers[w],
                                    "', ", StagesOf(spec, w), "): ", r.status().ToString()));
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
      return absl::InvalidArgumentError(absl::StrCat(
          "Pipeline::Step: the ", what, " must have ", options_.batch_size, " rows"));
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
    futures.push_back(agent_.rpc_async(
        opts, options_.stage_workers[w], internal::kRunStepFn, id,
        w == first ? std::optional<torch::Tensor>(inputs) : std::nullopt,
        w == last ? std::optional<torch::Tensor>(targets) : std::nullopt));
    futures.back().OnReady([gather, w](const absl::StatusOr<StepReply>& r) {
      absl::MutexLock lock(&gather->mu);
      ++gather->done;
      if (!r.ok()) gather->failed.push_back(w);
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
      agent_.rpc_async(short_opts, options_.stage_workers[o], internal::kAbortFn, id,
                       static_cast<int64_t>(absl::StatusCode::kAborted), why);
    }
  }
  if (!failed.empty()) {
    std::vector<std::string> parts;
    for (int w : failed) {
      parts.push_back(absl::StrCat("pipeline worker ", w, " ('", options_.stage_workers[w], "', ",
                                   StagesOf(spec, w),
                                   "): ", futures[w].result().status().ToString()));
    }
    return absl::Status(futures[failed.front()].result().status().code(),
                        absl::StrCat("pipeline step ", steps_done_, " failed: ",
                                     absl::StrJoin(parts, "; ")));
  }
  StepResult out;
  out.step = steps_done_;
  out.wall_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  out.theoretical_bubble = TheoreticalBubble(options_.schedule);
  out.peak_stashed.assign(p, 0);
  double start = std::numeric_limits<double>::infinity(), end = 0, busy = 0;
  for (int w = 0; w < p; ++w) {
    const StepReply& r = *futures[w].result();
    const auto& [losses, events, peak, compute_us, optimizer_us] = r;
    if (w == last) {
      for (double l : losses) out.loss += l;
    }
    out.peak_stashed[w] = static_cast<int>(peak);
    busy += compute_us;
    for (size_t i = 0; i + 4 < events.size(); i += 5) {
      TimelineEvent e;
      e.worker = w;
      e.action = {static_cast<ActionKind>(static_cast<int>(events[i])),
                  static_cast<int>(events[i + 1]), static_cast<int>(events[i + 2])};
      e.start = events[i + 3];
      e.end = events[i + 4];
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
  if (absl::Status s = WriteFileAtomically((fs::path(dir) / "LATEST").string(),
                                           {absl::StrCat(steps_done_, "\n")});
      !s.ok()) {
    return s;
  }
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
    auto r = agent_.rpc_async(options_.stage_workers[spec.worker_of(s)],
                              internal::kParametersFn, static_cast<int64_t>(s))
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
