#include "pipeline/stage.h"

#include <algorithm>
#include <exception>
#include <utility>

#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/byte_io.h"
#include "base/status.h"
#include "base/status_macros.h"

namespace baton::pipeline {
namespace {

constexpr char kStateMagic[] = "baton-pipeline-stage-1";

double NowMicros() { return static_cast<double>(absl::GetCurrentTimeNanos()) / 1000.0; }

const char* MessageName(MessageKind k) {
  return k == MessageKind::kActivation ? "activation" : "gradient";
}

bool IsCompute(ActionKind k) { return k == ActionKind::kForward || k == ActionKind::kBackward; }

// PP9: INVALID_ARGUMENT, naming `what`, for a device this process cannot use.
absl::Status CheckDevice(const torch::Device& device, const char* what) {
  if (device.is_cpu()) return absl::OkStatus();
  const int64_t n = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  if (!device.is_cuda() || (device.has_index() ? device.index() >= n : n == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", device.str(),
                                                   ", but this process sees ", n,
                                                   " CUDA device(s) and computes on CPU or CUDA"));
  }
  return absl::OkStatus();
}

// PP9: the host's work on a GPU is queued; an action ends with its kernels.
void WaitForDevice(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace

torch::Tensor SumCrossEntropy(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(
      output, target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

absl::StatusOr<std::unique_ptr<StageRunner>> StageRunner::Create(
    StageConfig config, std::vector<torch::nn::Sequential> modules, LossFn loss) {
  const ScheduleSpec& spec = config.spec;
  if (spec.workers < 1 || spec.microbatches < 1 || spec.chunks < 1 || config.worker < 0 ||
      config.worker >= spec.workers) {
    return absl::InvalidArgumentError(absl::StrCat("stage config: worker ", config.worker, " of ",
                                                   spec.workers, " workers, ", spec.microbatches,
                                                   " micro-batches, ", spec.chunks, " chunks"));
  }
  if (config.batch_size < 1 || config.batch_size % spec.microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("stage config: batch ", config.batch_size,
                                                   " is not a positive multiple of ",
                                                   spec.microbatches, " micro-batches"));
  }
  if (static_cast<int>(modules.size()) != spec.chunks) {
    return absl::InvalidArgumentError(absl::StrCat("stage config: worker ", config.worker, " got ",
                                                   modules.size(), " modules for ", spec.chunks,
                                                   " chunks"));
  }
  for (size_t i = 0; i < config.actions.size(); ++i) {
    const Action& a = config.actions[i];
    if (a.stage < 0 || a.stage >= spec.stages() || spec.worker_of(a.stage) != config.worker ||
        a.microbatch < 0 || a.microbatch >= spec.microbatches) {
      return absl::InvalidArgumentError(absl::StrCat("stage config: action ", i, " (", ToString(a),
                                                     ") is not for worker ", config.worker));
    }
  }
  if (!loss) return absl::InvalidArgumentError("stage config: no loss function");
  RETURN_IF_ERROR(CheckDevice(config.device, "stage config: device"));
  std::vector<Chunk> chunks;
  for (int c = 0; c < spec.chunks; ++c) {
    Chunk chunk;
    chunk.stage = c * spec.workers + config.worker;
    chunk.module = std::move(modules[c]);
    if (chunk.module.is_empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage config: no module for stage ", chunk.stage));
    }
    // The chunk's parameters, and the optimizer state made from them below,
    // live on the stage's device (PP9).
    chunk.module->to(config.device);
    chunk.params = chunk.module->parameters();
    auto opt = dist_optim::FunctionalOptimizer::Create(config.optimizer, chunk.params);
    if (!opt.ok()) {
      return Annotate(opt.status(), absl::StrCat("the optimizer of stage ", chunk.stage));
    }
    chunk.optimizer = std::move(*opt);
    chunks.push_back(std::move(chunk));
  }
  return std::unique_ptr<StageRunner>(
      new StageRunner(std::move(config), std::move(chunks), std::move(loss)));
}

StageRunner::StageRunner(StageConfig config, std::vector<Chunk> chunks, LossFn loss)
    : config_(std::move(config)), chunks_(std::move(chunks)), loss_(std::move(loss)) {}

std::string StageRunner::Where(const Action& a) const {
  return absl::StrCat("stage ", a.stage, " (pipeline worker ", config_.worker, "), micro-batch ",
                      a.microbatch);
}

absl::Status StageRunner::Deliver(StageMessage message) {
  const ScheduleSpec& spec = config_.spec;
  const int kind = static_cast<int>(message.kind);
  const std::string what = absl::StrCat("message for step ", message.step, ", stage ",
                                        message.stage, ", micro-batch ", message.microbatch);
  if (kind != 0 && kind != 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": unknown kind ", kind));
  }
  if (message.stage < 0 || message.stage >= spec.stages() ||
      spec.worker_of(message.stage) != config_.worker) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": pipeline worker ", config_.worker, " does not own that stage"));
  }
  if (message.microbatch < 0 || message.microbatch >= spec.microbatches) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the step has ", spec.microbatches, " micro-batches"));
  }
  if ((message.kind == MessageKind::kActivation && message.stage == 0) ||
      (message.kind == MessageKind::kGradient && message.stage == spec.stages() - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": stage ", message.stage, " never receives a ", MessageName(message.kind)));
  }
  if (!message.tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no tensor"));
  }
  absl::MutexLock lock(&mu_);
  if (message.step <= finished_step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": step ", message.step, " already ended on pipeline worker ", config_.worker));
  }
  if (inbox_.size() >= static_cast<size_t>(2 * spec.stages() * spec.microbatches)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": ", inbox_.size(), " messages already pending"));
  }
  Key key{message.step, kind, message.stage, message.microbatch};
  if (!inbox_.emplace(key, std::move(message.tensor)).second) {
    return absl::AlreadyExistsError(absl::StrCat(what, ": duplicate ", MessageName(message.kind)));
  }
  return absl::OkStatus();
}

void StageRunner::Abort(int64_t step, absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (step > finished_step_) aborts_.emplace(step, std::move(why));
}

absl::StatusOr<torch::Tensor> StageRunner::Receive(int64_t step, MessageKind kind, int stage,
                                                   int mb, absl::Time deadline) {
  const Key key{step, static_cast<int>(kind), stage, mb};
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return inbox_.count(key) > 0 || aborts_.count(step) > 0 || !send_error_.ok();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError("the step's deadline passed");
  }
  if (auto it = inbox_.find(key); it != inbox_.end()) {
    torch::Tensor t = std::move(it->second);
    inbox_.erase(it);
    return t;
  }
  if (auto a = aborts_.find(step); a != aborts_.end()) return a->second;
  return send_error_;
}

absl::StatusOr<StepReport> StageRunner::RunStep(StepInputs inputs, StageLink& link) {
  {
    absl::MutexLock lock(&mu_);
    if (inputs.step <= finished_step_) {
      return absl::FailedPreconditionError(
          absl::StrCat("pipeline worker ", config_.worker, ": step ", inputs.step,
                       " is not after the last step run, ", finished_step_));
    }
    send_error_ = absl::OkStatus();
  }
  StepReport report;
  report.worker = config_.worker;
  absl::Status s = Run(inputs, link, report);
  {
    // Sends of a failed step may still be in flight: wait for them (bounded)
    // so their callbacks never outlive the step's bookkeeping.
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_sends_ == 0; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), inputs.deadline) && s.ok()) {
      s = absl::DeadlineExceededError(absl::StrCat("pipeline worker ", config_.worker, " step ",
                                                   inputs.step,
                                                   ": sends still unacknowledged at the deadline"));
    }
    if (s.ok() && !send_error_.ok()) s = send_error_;
  }
  if (s.ok()) {
    const double t0 = NowMicros();
    for (Chunk& c : chunks_) {
      std::vector<torch::Tensor> grads;
      grads.reserve(c.params.size());
      for (const auto& p : c.params) grads.push_back(p.grad());
      s = c.optimizer->Step(grads);
      if (!s.ok()) {
        s = Annotate(s, absl::StrCat("the optimizer step of stage ", c.stage));
        break;
      }
    }
    report.optimizer_us = NowMicros() - t0;
  }
  // Gradients are zeroed after every step, good or failed (PP5).
  torch::NoGradGuard no_grad;
  for (Chunk& c : chunks_) {
    for (auto& p : c.params) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
  EndStep(inputs.step);
  if (!s.ok()) return s;
  ++steps_taken_;
  return report;
}

StageRunner::Activity StageRunner::CurrentActivity() const {
  absl::MutexLock lock(&mu_);
  return activity_;
}

void StageRunner::EndStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  activity_.action.clear();
  activity_.waits_for_stage = -1;
  activity_.since = absl::Now();
  finished_step_ = std::max(finished_step_, step);
  for (auto it = inbox_.begin(); it != inbox_.end();) {
    it = std::get<0>(it->first) <= finished_step_ ? inbox_.erase(it) : std::next(it);
  }
  for (auto it = aborts_.begin(); it != aborts_.end();) {
    it = it->first <= finished_step_ ? aborts_.erase(it) : std::next(it);
  }
}

absl::Status StageRunner::Run(const StepInputs& in, StageLink& link, StepReport& report) {
  const ScheduleSpec& spec = config_.spec;
  const int m = spec.microbatches, last = spec.stages() - 1;
  const int64_t rows = config_.batch_size / m;
  const bool has_first = spec.worker_of(0) == config_.worker;
  const bool has_last = spec.worker_of(last) == config_.worker;
  auto check_batch = [&](const torch::Tensor& t, const char* what) -> absl::Status {
    if (!t.defined() || t.dim() < 1 || t.size(0) != config_.batch_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline worker ", config_.worker, " step ", in.step, ": the batch's ",
                       what, " must have ", config_.batch_size, " rows; got ",
                       t.defined() ? absl::StrCat(t.dim() ? t.size(0) : 0, " rows") : "none"));
    }
    return absl::OkStatus();
  };
  std::vector<torch::Tensor> xs, ys;
  if (has_first) {
    RETURN_IF_ERROR(check_batch(in.inputs, "inputs"));
    xs = in.inputs.to(config_.device).split(rows);
  }
  if (has_last) {
    RETURN_IF_ERROR(check_batch(in.targets, "targets"));
    ys = in.targets.to(config_.device).split(rows);
    report.losses.assign(m, 0.0);
  }

  struct Slot {
    torch::Tensor received;  // activation (forward input) or gradient (of the output)
    torch::Tensor input;     // forward input, requires grad on stages > 0
    torch::Tensor output;    // forward output (the scaled loss on the last stage)
    torch::Tensor input_grad;
  };
  std::vector<Slot> slots(static_cast<size_t>(spec.chunks) * m);
  auto slot = [&](const Action& a) -> Slot& {
    return slots[static_cast<size_t>(a.stage / spec.workers) * m + a.microbatch];
  };
  int stashed = 0;
  auto send = [&](const Action& a, MessageKind kind, int to_stage, torch::Tensor t) {
    const int to = spec.worker_of(to_stage);
    StageMessage msg{in.step, kind, to_stage, a.microbatch, std::move(t)};
    if (to == config_.worker) return Deliver(std::move(msg));
    {
      absl::MutexLock lock(&mu_);
      ++pending_sends_;
    }
    const std::string what = absl::StrCat(Where(a), ": sending the ", MessageName(kind),
                                          " to stage ", to_stage, " on ", link.Describe(to));
    link.Send(to, std::move(msg), [this, what](absl::Status s) {
      absl::MutexLock lock(&mu_);
      --pending_sends_;
      if (!s.ok() && send_error_.ok()) send_error_ = Annotate(s, what);
    });
    return absl::OkStatus();
  };

  for (const Action& a : config_.actions) {
    {
      absl::MutexLock lock(&mu_);
      activity_.step = in.step;
      activity_.action = ToString(a);
      activity_.since = absl::Now();
      activity_.waits_for_stage = a.kind == ActionKind::kRecvActivation ? a.stage - 1
                                  : a.kind == ActionKind::kRecvGradient ? a.stage + 1
                                                                        : -1;
      ++activity_.actions_done;
    }
    const double start = NowMicros();
    Slot& sl = slot(a);
    Chunk& chunk = chunk_of(a.stage);
    absl::Status s;
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient: {
        const bool act = a.kind == ActionKind::kRecvActivation;
        const int from = act ? a.stage - 1 : a.stage + 1;
        auto t = Receive(in.step, act ? MessageKind::kActivation : MessageKind::kGradient, a.stage,
                         a.microbatch, in.deadline);
        if (!t.ok()) {
          return Annotate(
              t.status(),
              absl::StrCat(Where(a), ": waiting for the ", act ? "activation" : "gradient",
                           " from stage ", from, " on ", link.Describe(spec.worker_of(from))));
        }
        sl.received = t->to(config_.device);  // PP9: a no-op where it arrived
        break;
      }
      case ActionKind::kForward: {
        torch::Tensor x = a.stage == 0 ? xs[a.microbatch] : std::move(sl.received);
        if (!x.defined()) {
          return absl::InternalError(absl::StrCat(Where(a), ": forward before its input arrived"));
        }
        if (a.stage > 0) x.requires_grad_(true);
        try {
          torch::Tensor y = chunk.module->forward(x);
          if (a.stage == last) {
            torch::Tensor loss = loss_(y, ys[a.microbatch]);
            if (!loss.defined() || loss.numel() != 1) {
              return absl::InvalidArgumentError(
                  absl::StrCat(Where(a), ": the loss function must return a scalar"));
            }
            y = loss.reshape({}) / static_cast<double>(config_.batch_size);
            report.losses[a.microbatch] = y.item<double>();
          }
          sl.input = std::move(x);
          sl.output = std::move(y);
        } catch (const std::exception& e) {
          return absl::InvalidArgumentError(absl::StrCat(Where(a), ": forward failed: ", e.what()));
        }
        report.peak_stashed = std::max(report.peak_stashed, ++stashed);
        break;
      }
      case ActionKind::kSendActivation:
        s = send(a, MessageKind::kActivation, a.stage + 1, sl.output.detach());
        break;
      case ActionKind::kBackward: {
        if (!sl.output.defined()) {
          return absl::InternalError(absl::StrCat(Where(a), ": backward before its forward"));
        }
        try {
          if (a.stage == last) {
            sl.output.backward();
          } else {
            torch::Tensor g = std::move(sl.received);
            if (!g.defined() || g.sizes() != sl.output.sizes() ||
                g.scalar_type() != sl.output.scalar_type()) {
              return absl::InvalidArgumentError(
                  absl::StrCat(Where(a), ": the gradient received does not match the output ",
                               c10::str(sl.output.sizes(), " ", sl.output.scalar_type())));
            }
            torch::autograd::backward({sl.output}, {g});
          }
        } catch (const std::exception& e) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(a), ": backward failed: ", e.what()));
        }
        if (a.stage > 0) sl.input_grad = sl.input.grad();
        sl.input = torch::Tensor();
        sl.output = torch::Tensor();
        --stashed;
        break;
      }
      case ActionKind::kSendGradient:
        s = send(a, MessageKind::kGradient, a.stage - 1, std::move(sl.input_grad));
        sl.input_grad = torch::Tensor();
        break;
    }
    if (!s.ok()) return Annotate(s, Where(a));
    if (IsCompute(a.kind)) WaitForDevice(config_.device);
    const double end = NowMicros();
    const bool waited =
        (a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kRecvGradient) &&
        end - start >= 1.0;
    if (IsCompute(a.kind)) report.compute_us += end - start;
    if (IsCompute(a.kind) || waited || a.kind == ActionKind::kSendActivation ||
        a.kind == ActionKind::kSendGradient) {
      report.events.push_back({config_.worker, a, start, end});
    }
    // A neighbour's failure or an abort ends the step at the next action.
    absl::MutexLock lock(&mu_);
    if (!send_error_.ok()) return send_error_;
    if (auto ab = aborts_.find(in.step); ab != aborts_.end()) {
      return Annotate(ab->second, absl::StrCat(Where(a), ": aborted after ", ToString(a)));
    }
  }
  return absl::OkStatus();
}

std::vector<torch::Tensor> StageRunner::Parameters() const {
  std::vector<torch::Tensor> out;
  for (const Chunk& c : chunks_) out.insert(out.end(), c.params.begin(), c.params.end());
  return out;
}

std::vector<torch::Tensor> StageRunner::StageParameters(int stage) const {
  for (const Chunk& c : chunks_) {
    if (c.stage == stage) return c.params;
  }
  return {};
}

absl::StatusOr<std::string> StageRunner::SaveState() const {
  ByteWriter w;
  w.Raw(kStateMagic, sizeof(kStateMagic));
  w.I64(steps_taken_);
  w.I64(static_cast<int64_t>(chunks_.size()));
  for (const Chunk& c : chunks_) {
    w.I64(c.stage);
    w.I64(static_cast<int64_t>(c.params.size()));
    for (const auto& p : c.params) {
      torch::Tensor t = p.detach().to(torch::kCPU).contiguous();  // PP9: host bytes
      w.U8(static_cast<uint8_t>(t.scalar_type()));
      w.I64(t.numel());
      w.I64(static_cast<int64_t>(t.nbytes()));
      w.Raw(t.data_ptr(), t.nbytes());
    }
    auto opt = c.optimizer->SaveState();
    if (!opt.ok()) return Annotate(opt.status(), absl::StrCat("stage ", c.stage));
    w.I64(static_cast<int64_t>(opt->size()));
    w.Raw(opt->data(), opt->size());
  }
  return w.Release();
}

absl::Status StageRunner::LoadState(const std::string& bytes) {
  ByteReader r(bytes);
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("pipeline worker ", config_.worker, " state: ", why));
  };
  absl::string_view magic;
  if (!r.Raw(sizeof(kStateMagic), &magic) ||
      magic != absl::string_view(kStateMagic, sizeof(kStateMagic))) {
    return bad("not a pipeline stage state");
  }
  int64_t steps = 0, nchunks = 0;
  if (!r.I64(&steps) || !r.I64(&nchunks) || steps < 0) return bad("truncated header");
  if (nchunks != static_cast<int64_t>(chunks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline worker ", config_.worker,
                                                   " state has ", nchunks, " chunks, not ",
                                                   chunks_.size()));
  }
  // Parse and check everything first; change nothing until all is good.
  struct Parsed {
    std::vector<absl::string_view> params;
    std::string optimizer;
  };
  std::vector<Parsed> parsed(chunks_.size());
  for (size_t c = 0; c < chunks_.size(); ++c) {
    int64_t stage = 0, n = 0;
    if (!r.I64(&stage) || !r.I64(&n)) return bad("truncated chunk header");
    if (stage != chunks_[c].stage || n != static_cast<int64_t>(chunks_[c].params.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline worker ", config_.worker, " state: chunk ", c, " is stage ", stage,
                       " with ", n, " parameters; this worker's is stage ", chunks_[c].stage,
                       " with ", chunks_[c].params.size()));
    }
    for (int64_t i = 0; i < n; ++i) {
      const torch::Tensor& p = chunks_[c].params[i];
      uint8_t dtype = 0;
      int64_t numel = 0, nbytes = 0;
      absl::string_view data;
      if (!r.U8(&dtype) || !r.I64(&numel) || !r.I64(&nbytes)) return bad("truncated parameter");
      if (dtype != static_cast<uint8_t>(p.scalar_type()) || numel != p.numel() ||
          nbytes != static_cast<int64_t>(p.nbytes())) {
        return absl::InvalidArgumentError(
            absl::StrCat("pipeline worker ", config_.worker, " state: stage ", stage, " parameter ",
                         i, " has ", numel, " elements of dtype ", static_cast<int>(dtype),
                         "; the model's has ", p.numel(), " of ", p.scalar_type()));
      }
      if (!r.Raw(static_cast<size_t>(nbytes), &data)) return bad("truncated parameter data");
      parsed[c].params.push_back(data);
    }
    int64_t opt_size = 0;
    absl::string_view opt;
    if (!r.I64(&opt_size) || opt_size < 0 || !r.Raw(static_cast<size_t>(opt_size), &opt)) {
      return bad("truncated optimizer state");
    }
    parsed[c].optimizer = std::string(opt);
  }
  if (r.remaining() != 0) return bad(absl::StrCat(r.remaining(), " trailing bytes"));
  // Optimizer states are checked by loading them into fresh optimizers.
  std::vector<std::unique_ptr<dist_optim::FunctionalOptimizer>> fresh;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    ASSIGN_OR_RETURN(auto opt,
                     dist_optim::FunctionalOptimizer::Create(config_.optimizer, chunks_[c].params));
    if (absl::Status s = (opt)->LoadState(parsed[c].optimizer); !s.ok()) {
      return Annotate(s, absl::StrCat("pipeline worker ", config_.worker, " state: stage ",
                                      chunks_[c].stage, "'s optimizer"));
    }
    fresh.push_back(std::move(opt));
  }
  torch::NoGradGuard no_grad;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    for (size_t i = 0; i < chunks_[c].params.size(); ++i) {
      torch::Tensor& p = chunks_[c].params[i];
      // PP9: the saved bytes are host memory, whatever the parameter's device.
      torch::Tensor src = torch::from_blob(const_cast<char*>(parsed[c].params[i].data()), p.sizes(),
                                           torch::TensorOptions().dtype(p.scalar_type()));
      p.copy_(src);
    }
    chunks_[c].optimizer = std::move(fresh[c]);
  }
  steps_taken_ = steps;
  return absl::OkStatus();
}

void LocalStageLink::Send(int to, StageMessage message,
                          absl::AnyInvocable<void(absl::Status)> done) {
  {
    absl::MutexLock lock(&mu_);
    if (std::find(killed_.begin(), killed_.end(), to) != killed_.end()) {
      done(absl::UnavailableError(absl::StrCat(Describe(to), " is dead")));
      return;
    }
  }
  if (to < 0 || to >= static_cast<int>(runners_.size())) {
    done(absl::InvalidArgumentError(absl::StrCat("no local worker ", to)));
    return;
  }
  message.tensor = message.tensor.clone();  // as if it crossed a wire
  done(runners_[to]->Deliver(std::move(message)));
}

std::string LocalStageLink::Describe(int worker) const {
  return absl::StrCat("local worker ", worker);
}

void LocalStageLink::Kill(int worker) {
  absl::MutexLock lock(&mu_);
  killed_.push_back(worker);
}

}  // namespace baton::pipeline
