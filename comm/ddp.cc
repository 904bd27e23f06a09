#include "comm/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status.h"

namespace baton::comm {

at::Tensor ParamGradSource::Get(size_t, const at::Tensor& param) { return param.grad(); }

void ParamGradSource::Set(size_t, const at::Tensor& param, const at::Tensor& grad) {
  if (param.grad().defined()) {
    param.mutable_grad().copy_(grad);
  } else {
    param.mutable_grad() = grad.clone();
  }
}

namespace internal {

// The per-iteration bookkeeping of DDP: buckets, readiness, launches.
class Reducer {
 public:
  struct Bucket {
    at::Tensor flat;
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    WorkPtr work;
  };

  Reducer(ProcessGroup group, std::vector<at::Tensor> params, std::vector<std::string> names,
          const DdpOptions& options, std::shared_ptr<GradientSource> source)
      : group_(std::move(group)),
        params_(std::move(params)),
        names_(std::move(names)),
        source_(std::move(source)),
        find_unused_(options.find_unused_parameters),
        timeout_(options.timeout > absl::ZeroDuration() ? options.timeout : group_.timeout()) {
    // Backward produces gradients roughly in reverse registration order.
    bucket_of_.assign(params_.size(), 0);
    int64_t bytes = 0;
    for (size_t k = params_.size(); k-- > 0;) {
      const at::Tensor& p = params_[k];
      const int64_t nbytes = p.numel() * p.element_size();
      if (buckets_.empty() || bytes + nbytes > options.bucket_cap_bytes ||
          params_[buckets_.back().params.front()].scalar_type() != p.scalar_type() ||
          params_[buckets_.back().params.front()].device() != p.device()) {
        if (buckets_.empty() || !buckets_.back().params.empty()) {
          buckets_.emplace_back();
        }
        bytes = 0;
      }
      Bucket& b = buckets_.back();
      bucket_of_[k] = buckets_.size() - 1;
      b.offsets.push_back(b.params.empty() ? 0
                                           : b.offsets.back() + params_[b.params.back()].numel());
      b.params.push_back(k);
      bytes += nbytes;
    }
    for (Bucket& b : buckets_) {
      const at::Tensor& last = params_[b.params.back()];
      b.flat = at::zeros({b.offsets.back() + last.numel()}, last.options());
    }
    ready_.assign(params_.size(), false);
  }

  const std::vector<Bucket>& buckets() const { return buckets_; }

  void set_no_sync(bool v) {
    absl::MutexLock lock(&mu_);
    no_sync_ = v;
  }
  bool no_sync() {
    absl::MutexLock lock(&mu_);
    return no_sync_;
  }

  // Called by the autograd hook of parameter `index` (hook_mode) or by the
  // external gradient producer. Returns true if this was the first gradient
  // of the iteration (the caller then arranges for Finish to run).
  bool MarkReady(size_t index) {
    std::vector<size_t> launch;
    bool first = false;
    {
      absl::MutexLock lock(&mu_);
      if (no_sync_ || index >= params_.size() || ready_[index]) return false;
      if (!active_) {
        active_ = true;
        first = true;
      }
      Fill(index);
      ready_[index] = true;
      ++ready_count_[bucket_of_[index]];
      launch = NextLaunchesLocked();
    }
    Launch(launch);
    return first;
  }

  // Ends the iteration: handles unused parameters, waits for every bucket and
  // writes the averaged gradients back through the source.
  absl::Status Finish() {
    std::vector<size_t> launch;
    std::vector<std::string> unused;
    {
      absl::MutexLock lock(&mu_);
      if (!active_) return absl::OkStatus();
      for (size_t i = 0; i < params_.size(); ++i) {
        if (ready_[i]) continue;
        if (!find_unused_) {
          unused.push_back(absl::StrCat(i, ":'", names_[i], "'"));
          continue;
        }
        const Bucket& b = buckets_[bucket_of_[i]];
        Slice(b, i).zero_();
        ready_[i] = true;
        ++ready_count_[bucket_of_[i]];
      }
      if (unused.empty()) launch = NextLaunchesLocked();
    }
    Launch(launch);
    absl::Status status;
    if (!unused.empty()) {
      status = absl::FailedPreconditionError(
          absl::StrCat("DDP: parameters [", absl::StrJoin(unused, ", "),
                       "] received no gradient in this backward pass; construct with "
                       "DdpOptions::find_unused_parameters = true if some parameters are "
                       "not used in every iteration"));
    }
    // Wait for whatever was launched even on error, so the group stays in
    // step with the other ranks.
    // GPU buckets: the current stream waits for the all-reduce (the host
    // does not), so the write-back and the optimizer step queue behind it at
    // once. CPU buckets: the host waits.
    const absl::Time deadline = absl::Now() + timeout_;
    for (Bucket& b : buckets_) {
      if (!b.work) continue;
      absl::Status s;
      if (status.ok()) s = b.work->WaitOnStream();
      if (!status.ok() || absl::IsUnimplemented(s)) {
        s = b.work->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
      }
      if (!s.ok() && status.ok()) status = Annotate(s, "DDP gradient bucket");
    }
    if (status.ok()) {
      for (const Bucket& b : buckets_) {
        for (size_t i : b.params) {
          source_->Set(i, params_[i], Slice(b, i).view(params_[i].sizes()));
        }
      }
    }
    Reset();
    return status;
  }

 private:
  at::Tensor Slice(const Bucket& b, size_t index) const {
    const auto pos = std::find(b.params.begin(), b.params.end(), index) - b.params.begin();
    return b.flat.narrow(0, b.offsets[pos], params_[index].numel());
  }

  void Fill(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Bucket& b = buckets_[bucket_of_[index]];
    at::Tensor grad = source_->Get(index, params_[index]);
    at::Tensor slice = Slice(b, index);
    if (grad.defined()) {
      slice.copy_(grad.detach().reshape({-1}));
    } else {
      slice.zero_();
    }
  }

  std::vector<size_t> NextLaunchesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<size_t> out;
    while (next_launch_ < buckets_.size() &&
           ready_count_[next_launch_] == buckets_[next_launch_].params.size()) {
      out.push_back(next_launch_++);
    }
    return out;
  }

  // Issues the all-reduces outside mu_ (issuing may talk to the store in
  // debug mode), in bucket order: launch_mu_ keeps that order across threads.
  void Launch(const std::vector<size_t>& which) {
    if (which.empty()) return;
    absl::MutexLock lock(&launch_mu_);
    const double world = group_.size();
    for (size_t k : which) {
      Bucket& b = buckets_[k];
      b.flat.div_(world);
      b.work = group_.AllReduce({b.flat}, ReduceOp::kSum);
    }
  }

  void Reset() {
    absl::MutexLock lock(&mu_);
    active_ = false;
    next_launch_ = 0;
    std::fill(ready_.begin(), ready_.end(), false);
    std::fill(ready_count_.begin(), ready_count_.end(), 0);
    for (Bucket& b : buckets_) {
      b.work.reset();
    }
  }

 public:
  void InitCounts() {
    absl::MutexLock lock(&mu_);
    ready_count_.assign(buckets_.size(), 0);
  }

 private:
  ProcessGroup group_;
  const std::vector<at::Tensor> params_;
  const std::vector<std::string> names_;
  const std::shared_ptr<GradientSource> source_;
  const bool find_unused_;
  const absl::Duration timeout_;
  // Layout, set at construction; flat contents are written under mu_ until
  // launched, then owned by the all-reduce until Finish waits for it.
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;

  absl::Mutex launch_mu_;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(launch_mu_);
  bool no_sync_ ABSL_GUARDED_BY(mu_) = false;
  bool active_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> ready_count_ ABSL_GUARDED_BY(mu_);
  size_t next_launch_ ABSL_GUARDED_BY(mu_) = 0;
};

namespace {

// Runs after a parameter's gradient was accumulated into .grad.
class ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<Reducer> reducer, size_t index)
      : reducer_(std::move(reducer)), index_(index) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    std::shared_ptr<Reducer> reducer = reducer_.lock();
    if (reducer && reducer->MarkReady(index_)) {
      // First gradient of this backward: finish when the engine is done.
      std::weak_ptr<Reducer> weak = reducer;
      torch::autograd::Engine::get_default_engine().queue_callback([weak] {
        if (std::shared_ptr<Reducer> r = weak.lock()) {
          ThrowIfError(r->Finish());
        }
      });
    }
    return outputs;
  }

 private:
  std::weak_ptr<Reducer> reducer_;
  size_t index_;
};

absl::Status BroadcastFromRankZero(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                                   absl::string_view what) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor t = tensors[i].detach();
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    absl::Status s = group.Broadcast({buf}, 0)->Wait(group.timeout());
    if (!s.ok()) return Annotate(s, absl::StrCat("DDP: broadcasting ", what, " ", i));
    if (!buf.is_same(t)) t.copy_(buf);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace internal

absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::Create(
    std::shared_ptr<torch::nn::Module> module, ProcessGroup group, DdpOptions options) {
  if (module == nullptr) {
    return absl::InvalidArgumentError("DDP: module is null");
  }
  if (!group.is_member()) {
    return absl::FailedPreconditionError(
        absl::StrCat("DDP: this process is not a member of group '", group.name(), "'"));
  }
  if (options.bucket_cap_bytes <= 0) {
    return absl::InvalidArgumentError("DDP: bucket_cap_bytes must be > 0");
  }
  std::unique_ptr<DistributedDataParallel> ddp(
      new DistributedDataParallel(std::move(module), std::move(group), std::move(options)));
  for (const auto& item : ddp->module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    ddp->params_.push_back(item.value());
    ddp->names_.push_back(item.key());
  }
  if (ddp->params_.empty()) {
    return absl::InvalidArgumentError("DDP: the module has no parameters that require a gradient");
  }
  absl::Status s = internal::BroadcastFromRankZero(ddp->group_, ddp->params_, "parameter");
  if (!s.ok()) return s;
  if (ddp->options_.broadcast_buffers) {
    s = ddp->SyncBuffers();
    if (!s.ok()) return s;
  }
  const bool hooks = ddp->options_.gradient_source == nullptr;
  std::shared_ptr<GradientSource> source =
      hooks ? std::make_shared<ParamGradSource>() : ddp->options_.gradient_source;
  ddp->reducer_ = std::make_shared<internal::Reducer>(ddp->group_, ddp->params_, ddp->names_,
                                                      ddp->options_, std::move(source));
  ddp->reducer_->InitCounts();
  if (hooks) {
    for (size_t i = 0; i < ddp->params_.size(); ++i) {
      torch_compat::NodePtr<> acc = torch::autograd::impl::grad_accumulator(ddp->params_[i]);
      if (acc == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("DDP: parameter '", ddp->names_[i], "' is not a leaf tensor"));
      }
      acc->add_post_hook(std::make_unique<internal::ReadyHook>(ddp->reducer_, i));
      ddp->accumulators_.push_back(std::move(acc));
    }
  }
  return ddp;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 ProcessGroup group, DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {}

DistributedDataParallel::~DistributedDataParallel() = default;

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : reducer_->buckets()) out.push_back(b.params);
  return out;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel* ddp)
    : ddp_(ddp), previous_(ddp->reducer_->no_sync()) {
  ddp_->reducer_->set_no_sync(true);
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_->reducer_->set_no_sync(previous_); }

absl::Status DistributedDataParallel::SyncBuffers() {
  std::vector<at::Tensor> buffers;
  for (const auto& b : module_->buffers(/*recurse=*/true)) buffers.push_back(b);
  return internal::BroadcastFromRankZero(group_, buffers, "buffer");
}

void DistributedDataParallel::MarkGradientReady(size_t index) { reducer_->MarkReady(index); }

absl::Status DistributedDataParallel::FinishGradients() { return reducer_->Finish(); }

absl::Status DistributedDataParallel::SyncGradients() {
  for (size_t i = 0; i < params_.size(); ++i) reducer_->MarkReady(i);
  return reducer_->Finish();
}

}  // namespace baton::comm
