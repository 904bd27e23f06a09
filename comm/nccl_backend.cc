#include "comm/nccl_backend.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <ATen/ATen.h>

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "comm/internal/nccl_status.h"
#include "comm/internal/store_exchange.h"

namespace baton::comm {
namespace {

absl::Status NcclError(ncclResult_t r, absl::string_view what, ncclComm_t comm = nullptr) {
  return internal::NcclStatus(r, what, comm);
}

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", cudaGetErrorString(e)));
}

absl::StatusOr<ncclDataType_t> NcclType(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat: return ncclFloat32;
    case c10::kDouble: return ncclFloat64;
    case c10::kHalf: return ncclFloat16;
    case c10::kBFloat16: return ncclBfloat16;
    case c10::kChar: return ncclInt8;
    case c10::kByte: return ncclUint8;
    case c10::kBool: return ncclUint8;
    case c10::kInt: return ncclInt32;
    case c10::kLong: return ncclInt64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("backend nccl cannot reduce dtype ", c10::toString(type)));
  }
}

absl::StatusOr<ncclRedOp_t> NcclOp(ReduceOp op, c10::ScalarType type) {
  if (type == c10::kBool) {
    return op == ReduceOp::kSum || op == ReduceOp::kMax ? ncclMax : ncclMin;
  }
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProduct: return ncclProd;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg: return ncclAvg;
  }
  return absl::InvalidArgumentError("unknown reduce op");
}

// One communicator per device of a device set, each with its own stream.
struct DeviceComm {
  c10::DeviceIndex device;
  ncclComm_t comm = nullptr;
  c10::cuda::CUDAStream stream;
};
struct CommSet {
  std::vector<DeviceComm> members;
};

// What an op issues on member i of its communicator set.
using IssueFn = std::function<ncclResult_t(size_t i, DeviceComm& dc)>;
// Work on the NCCL stream before (pre) or after (post) the NCCL calls, with
// that stream current (copies into or out of scratch buffers).
using StreamFn = std::function<void()>;

// An op's end events, one per member device; destroyed with the last of
// the Pending and the Work that hold them.
struct EndEvents {
  std::vector<std::pair<c10::DeviceIndex, cudaEvent_t>> events;
  ~EndEvents() {
    for (const auto& [device, event] : events) {
      c10::cuda::CUDAGuard guard(device);
      cudaEventDestroy(event);
    }
  }
};

// A Work whose caller may make its own stream wait for the op's end events
// instead of blocking the host (Work::WaitOnStream).
class NcclWork final : public Work {
 public:
  NcclWork(std::string description, std::shared_ptr<const EndEvents> done)
      : Work(std::move(description)), done_(std::move(done)) {}

  absl::Status WaitOnStream() override {
    if (IsCompleted()) return status();
    for (const auto& [device, event] : done_->events) {
      const cudaError_t e =
          cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device).stream(), event, 0);
      if (e != cudaSuccess) {
        return absl::InternalError(absl::StrCat(
            description(), ": the current stream cannot wait for the op: ", cudaGetErrorString(e)));
      }
    }
    return absl::OkStatus();
  }

 private:
  const std::shared_ptr<const EndEvents> done_;
};

// One op in flight. It stays in `pending_` until its end events have fired,
// also after an abort, so that its tensors outlive the GPU's use of them;
// only the completion thread pops it.
struct Pending {
  OpInfo info;
  WorkPtr work;
  std::shared_ptr<CommSet> comms;
  std::shared_ptr<EndEvents> done;
  std::vector<at::Tensor> keep_alive;
  absl::Time deadline;
  bool aborted = false;  // failed by an abort; still waits for its events
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(BackendContext ctx, NcclOptions options)
      : ctx_(std::move(ctx)),
        options_(options),
        completion_([this] { CompleteInOrder(); }),
        watchdog_([this] { Watchdog(); }) {}

  ~NcclBackend() override { (void)Shutdown(absl::ZeroDuration()); }

  std::string name() const override { return "nccl"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CUDA; }

  WorkPtr AllReduce(const OpInfo& info, std::vector<at::Tensor> tensors, ReduceOp op) override {
    auto type = NcclType(tensors[0].scalar_type());
    if (!type.ok()) return Failed(info, type.status());
    auto rop = NcclOp(op, tensors[0].scalar_type());
    if (!rop.ok()) return Failed(info, rop.status());
    return Launch(
        info, tensors, tensors, nullptr,
        [&, dt = *type, rop = *rop](size_t i, DeviceComm& dc) {
          void* p = tensors[i].data_ptr();
          return ncclAllReduce(p, p, tensors[i].numel(), dt, rop, dc.comm, dc.stream.stream());
        },
        nullptr);
  }

  WorkPtr Broadcast(const OpInfo& info, std::vector<at::Tensor> tensors, int root) override {
    const int ndev = static_cast<int>(tensors.size());
    return Launch(
        info, tensors, tensors, nullptr,
        [&](size_t i, DeviceComm& dc) {
          void* p = tensors[i].data_ptr();
          return ncclBroadcast(p, p, tensors[i].nbytes(), ncclUint8, root * ndev, dc.comm,
                               dc.stream.stream());
        },
        nullptr);
  }

  WorkPtr Reduce(const OpInfo& info, std::vector<at::Tensor> tensors, int root,
                 ReduceOp op) override {
    auto type = NcclType(tensors[0].scalar_type());
    if (!type.ok()) return Failed(info, type.status());
    auto rop = NcclOp(op, tensors[0].scalar_type());
    if (!rop.ok()) return Failed(info, rop.status());
    const int ndev = static_cast<int>(tensors.size());
    return Launch(
        info, tensors, tensors, nullptr,
        [&, dt = *type, rop = *rop](size_t i, DeviceComm& dc) {
          void* p = tensors[i].data_ptr();
          return ncclReduce(p, p, tensors[i].numel(), dt, rop, root * ndev, dc.comm,
                            dc.stream.stream());
        },
        nullptr);
  }

  WorkPtr AllGather(const OpInfo& info, std::vector<at::Tensor> outputs,
                    at::Tensor input) override {
    at::Tensor flat;
    std::vector<at::Tensor> keep = outputs;
    keep.push_back(input);
    return Launch(
        info, {input}, keep,
        [&] { flat = at::empty({input.numel() * ctx_.size}, input.options()); },
        [&](size_t, DeviceComm& dc) {
          return ncclAllGather(input.data_ptr(), flat.data_ptr(), input.nbytes(), ncclUint8,
                               dc.comm, dc.stream.stream());
        },
        [&] {
          for (int r = 0; r < ctx_.size; ++r) {
            outputs[r].view({-1}).copy_(flat.narrow(0, r * input.numel(), input.numel()));
          }
        });
  }

  WorkPtr Gather(const OpInfo& info, std::vector<at::Tensor> outputs, at::Tensor input,
                 int root) override {
    std::vector<at::Tensor> keep = outputs;
    keep.push_back(input);
    const bool is_root = ctx_.rank == root;
    return Launch(
        info, {input}, keep, nullptr,
        [&](size_t, DeviceComm& dc) -> ncclResult_t {
          if (!is_root) {
            return ncclSend(input.data_ptr(), input.nbytes(), ncclUint8, root, dc.comm,
                            dc.stream.stream());
          }
          for (int r = 0; r < ctx_.size; ++r) {
            if (r == root) continue;
            ncclResult_t res = ncclRecv(outputs[r].data_ptr(), input.nbytes(), ncclUint8, r,
                                        dc.comm, dc.stream.stream());
            if (res != ncclSuccess) return res;
          }
          return ncclSuccess;
        },
        [&] {
          if (is_root) outputs[root].copy_(input);
        });
  }

  WorkPtr Scatter(const OpInfo& info, at::Tensor output, std::vector<at::Tensor> inputs,
                  int root) override {
    std::vector<at::Tensor> keep = inputs;
    keep.push_back(output);
    const bool is_root = ctx_.rank == root;
    return Launch(
        info, {output}, keep, nullptr,
        [&](size_t, DeviceComm& dc) -> ncclResult_t {
          if (!is_root) {
            return ncclRecv(output.data_ptr(), output.nbytes(), ncclUint8, root, dc.comm,
                            dc.stream.stream());
          }
          for (int r = 0; r < ctx_.size; ++r) {
            if (r == root) continue;
            ncclResult_t res = ncclSend(inputs[r].data_ptr(), output.nbytes(), ncclUint8, r,
                                        dc.comm, dc.stream.stream());
            if (res != ncclSuccess) return res;
          }
          return ncclSuccess;
        },
        [&] {
          if (is_root) output.copy_(inputs[root]);
        });
  }

  WorkPtr ReduceScatter(const OpInfo& info, at::Tensor output, std::vector<at::Tensor> inputs,
                        ReduceOp op) override {
    auto type = NcclType(output.scalar_type());
    if (!type.ok()) return Failed(info, type.status());
    auto rop = NcclOp(op, output.scalar_type());
    if (!rop.ok()) return Failed(info, rop.status());
    at::Tensor flat;
    std::vector<at::Tensor> keep = inputs;
    keep.push_back(output);
    return Launch(
        info, {output}, keep,
        [&] {
          std::vector<at::Tensor> flats;
          for (const auto& t : inputs) flats.push_back(t.view({-1}));
          flat = at::cat(flats);
        },
        [&, dt = *type, rop = *rop](size_t, DeviceComm& dc) {
          return ncclReduceScatter(flat.data_ptr(), output.data_ptr(), output.numel(), dt, rop,
                                   dc.comm, dc.stream.stream());
        },
        nullptr);
  }

  WorkPtr AllToAll(const OpInfo& info, at::Tensor output, at::Tensor input) override {
    at::Tensor source;
    const size_t chunk = input.nbytes() / ctx_.size;
    return Launch(
        info, {output}, {output, input},
        [&] { source = input.data_ptr() == output.data_ptr() ? input.clone() : input; },
        [&](size_t, DeviceComm& dc) -> ncclResult_t {
          auto* in = static_cast<uint8_t*>(source.data_ptr());
          auto* out = static_cast<uint8_t*>(output.data_ptr());
          for (int r = 0; r < ctx_.size; ++r) {
            ncclResult_t res =
                ncclSend(in + r * chunk, chunk, ncclUint8, r, dc.comm, dc.stream.stream());
            if (res == ncclSuccess) {
              res = ncclRecv(out + r * chunk, chunk, ncclUint8, r, dc.comm, dc.stream.stream());
            }
            if (res != ncclSuccess) return res;
          }
          return ncclSuccess;
        },
        nullptr);
  }

  WorkPtr Barrier(const OpInfo& info) override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      return Failed(info, absl::FailedPreconditionError("no CUDA device"));
    }
    at::Tensor one = at::zeros(
        {1}, at::TensorOptions().device(at::Device(at::kCUDA, ctx_.rank % count)).dtype(at::kInt));
    WorkPtr work = AllReduce(info, {one}, ReduceOp::kSum);
    return work;
  }

  WorkPtr Send(const OpInfo& info, at::Tensor tensor, int dst, uint32_t) override {
    return Launch(
        info, {tensor}, {tensor}, nullptr,
        [&](size_t, DeviceComm& dc) {
          return ncclSend(tensor.data_ptr(), tensor.nbytes(), ncclUint8, dst, dc.comm,
                          dc.stream.stream());
        },
        nullptr);
  }

  WorkPtr Recv(const OpInfo& info, at::Tensor tensor, int src, uint32_t) override {
    return Launch(
        info, {tensor}, {tensor}, nullptr,
        [&](size_t, DeviceComm& dc) {
          return ncclRecv(tensor.data_ptr(), tensor.nbytes(), ncclUint8, src, dc.comm,
                          dc.stream.stream());
        },
        nullptr);
  }

  absl::Status Shutdown(absl::Duration timeout) override {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return absl::OkStatus();
      shut_down_ = true;
      auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.empty(); };
      if (!mu_.AwaitWithTimeout(absl::Condition(&drained), timeout)) {
        AbortLocked("the group was destroyed with ops in flight");
      }
      stop_ = true;
    }
    CompleteFailed();
    // The completion thread leaves once the aborted ops' events fired
    // (ncclCommAbort ends their kernels); the watchdog at once.
    if (completion_.joinable()) completion_.join();
    if (watchdog_.joinable()) watchdog_.join();
    absl::MutexLock lock(&mu_);
    for (auto& [key, set] : comms_) {
      for (DeviceComm& dc : set->members) {
        if (dc.comm != nullptr) ncclCommDestroy(dc.comm);
        dc.comm = nullptr;
      }
    }
    comms_.clear();
    return absl::OkStatus();
  }

 private:
  WorkPtr Failed(const OpInfo& info, absl::Status status) {
    return Work::Completed(info.description, Annotate(status, info.description));
  }

  // Finds or creates the communicators of the devices of `tensors`.
  absl::StatusOr<std::shared_ptr<CommSet>> Comms(const std::vector<at::Tensor>& tensors) {
    std::vector<c10::DeviceIndex> devices;
    for (const auto& t : tensors) devices.push_back(t.device().index());
    const std::string key = absl::StrJoin(devices, ",");
    int64_t index;
    {
      absl::MutexLock lock(&mu_);
      auto it = comms_.find(key);
      if (it != comms_.end()) return it->second;
      index = next_comm_++;
    }
    const int ndev = static_cast<int>(devices.size());
    const std::string id_key = absl::StrCat(ctx_.prefix, "/nccl/", index);
    // Everyone arrives first: ncclCommInitRank blocks without a deadline.
    absl::Status s =
        store::Barrier(*ctx_.store, id_key + "/arrive", ctx_.rank, ctx_.size, ctx_.timeout);
    if (!s.ok()) return Annotate(s, "creating the NCCL communicator");
    ncclUniqueId id;
    if (ctx_.rank == 0) {
      s = NcclError(ncclGetUniqueId(&id), "ncclGetUniqueId");
      if (!s.ok()) return s;
      s = ctx_.store->Set(id_key, absl::string_view(id.internal, sizeof(id)));
      if (!s.ok()) return s;
    } else {
      absl::StatusOr<std::string> v = ctx_.store->Get(id_key, ctx_.timeout);
      if (!v.ok()) return Annotate(v.status(), "reading the NCCL unique id");
      if (v->size() != sizeof(id)) {
        return absl::InternalError("the NCCL unique id has the wrong size");
      }
      std::memcpy(id.internal, v->data(), sizeof(id));
    }
    auto set = std::make_shared<CommSet>();
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < ndev && r == ncclSuccess; ++i) {
      c10::cuda::CUDAGuard guard(devices[i]);
      DeviceComm dc{devices[i], nullptr, c10::cuda::getStreamFromPool(false, devices[i])};
      r = ncclCommInitRank(&dc.comm, ctx_.size * ndev, id, ctx_.rank * ndev + i);
      set->members.push_back(dc);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess) r = end;
    s = NcclError(r, absl::StrCat("ncclCommInitRank for devices [", key, "]"));
    if (!s.ok()) return s;
    absl::MutexLock lock(&mu_);
    comms_[key] = set;
    return set;
  }

  WorkPtr Launch(const OpInfo& info, const std::vector<at::Tensor>& tensors,
                 std::vector<at::Tensor> keep_alive, const StreamFn& pre, const IssueFn& issue,
                 const StreamFn& post) {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) {
        return Failed(info, absl::FailedPreconditionError("the group was destroyed"));
      }
      if (!abort_reason_.empty()) {
        return Failed(info, absl::FailedPreconditionError(
                                absl::StrCat("the group was aborted earlier: ", abort_reason_)));
      }
    }
    absl::StatusOr<std::shared_ptr<CommSet>> comms = Comms(tensors);
    if (!comms.ok()) return Failed(info, comms.status());
    Pending p;
    p.info = info;
    p.comms = *comms;
    p.done = std::make_shared<EndEvents>();
    p.deadline = absl::Now() + ctx_.timeout;
    try {
      // The NCCL streams wait for the callers' current streams.
      for (DeviceComm& dc : p.comms->members) {
        c10::cuda::CUDAGuard guard(dc.device);
        cudaEvent_t ready;
        absl::Status s =
            CudaError(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event");
        if (s.ok()) {
          s = CudaError(cudaEventRecord(ready, c10::cuda::getCurrentCUDAStream(dc.device)),
                        "event record");
        }
        if (s.ok()) {
          s = CudaError(cudaStreamWaitEvent(dc.stream.stream(), ready, 0), "stream wait");
        }
        cudaEventDestroy(ready);
        if (!s.ok()) return Failed(info, s);
      }
      DeviceComm& first = p.comms->members[0];
      if (pre) {
        c10::cuda::CUDAStreamGuard on_stream(first.stream);
        pre();
      }
      ncclResult_t r = ncclGroupStart();
      for (size_t i = 0; i < p.comms->members.size() && r == ncclSuccess; ++i) {
        r = issue(i, p.comms->members[i]);
      }
      const ncclResult_t end = ncclGroupEnd();
      if (r == ncclSuccess) r = end;
      absl::Status s = NcclError(r, "issuing the op", first.comm);
      if (!s.ok()) return Failed(info, s);
      if (post) {
        c10::cuda::CUDAStreamGuard on_stream(first.stream);
        post();
      }
      for (DeviceComm& dc : p.comms->members) {
        c10::cuda::CUDAGuard guard(dc.device);
        for (const at::Tensor& t : keep_alive) {
          if (t.defined() && t.device().index() == dc.device) {
            c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), dc.stream);
          }
        }
        cudaEvent_t done;
        s = CudaError(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "event");
        if (!s.ok()) return Failed(info, s);
        p.done->events.push_back({dc.device, done});
        s = CudaError(cudaEventRecord(done, dc.stream.stream()), "event record");
        if (!s.ok()) return Failed(info, s);
      }
    } catch (const std::exception& e) {
      return Failed(info, absl::InternalError(e.what()));
    }
    p.keep_alive = std::move(keep_alive);
    p.work = std::make_shared<NcclWork>(info.description, p.done);
    WorkPtr work = p.work;
    absl::MutexLock lock(&mu_);
    pending_.push_back(std::move(p));
    return work;
  }

  // Aborts every communicator; every op in flight fails with `reason` (its
  // Work completes in CompleteFailed, outside the lock). The ops stay in
  // pending_ until their events fire.
  void AbortLocked(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (abort_reason_.empty()) abort_reason_ = reason;
    for (auto& [key, set] : comms_) {
      for (DeviceComm& dc : set->members) {
        if (dc.comm != nullptr) ncclCommAbort(dc.comm);
        dc.comm = nullptr;  // every Pending sharing the set sees it gone
      }
    }
    comms_.clear();
    for (Pending& p : pending_) {
      if (p.aborted) continue;
      p.aborted = true;
      failed_.push_back({p.work, absl::FailedPreconditionError(
                                     absl::StrCat(p.info.description, ": aborted: ", reason))});
    }
  }

  // Completes the works failed by an abort, outside the lock.
  void CompleteFailed() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::pair<WorkPtr, absl::Status>> failed;
    {
      absl::MutexLock lock(&mu_);
      failed.swap(failed_);
    }
    for (auto& [work, status] : failed) work->MarkCompleted(status);
  }

  // The completion thread: waits for the oldest op's end events (NCCL ops
  // on one communicator finish in issue order) and completes its Work the
  // moment they fire. cudaEventSynchronize returns as soon as the GPU
  // passes the event; nothing polls on a timer.
  void CompleteInOrder() {
    for (;;) {
      std::shared_ptr<const EndEvents> done;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pending_.empty() || stop_; };
        mu_.Await(absl::Condition(&ready));
        if (pending_.empty()) return;  // stop_ and nothing left
        done = pending_.front().done;
      }
      absl::Status status;
      for (const auto& [device, event] : done->events) {
        c10::cuda::CUDAGuard guard(device);
        const cudaError_t e = cudaEventSynchronize(event);
        if (e != cudaSuccess && status.ok()) {
          status = CudaError(e, "waiting for the op's end event");
        }
      }
      Pending p;
      {
        absl::MutexLock lock(&mu_);
        p = std::move(pending_.front());
        pending_.pop_front();
      }
      p.keep_alive.clear();
      if (!p.aborted) {
        p.work->MarkCompleted(status.ok() ? status : Annotate(status, p.info.description));
      }
    }
  }

  // The watchdog: errors and deadlines only. While ops are in flight it
  // checks every poll_interval for an asynchronous NCCL error and for the
  // oldest live op's deadline, and aborts the communicators on either.
  void Watchdog() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        auto busy = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || LiveLocked() != nullptr;
        };
        mu_.Await(absl::Condition(&busy));
        if (stop_) return;
        Pending* p = LiveLocked();
        ncclResult_t async = ncclSuccess;
        ncclComm_t failing = nullptr;
        for (DeviceComm& dc : p->comms->members) {
          if (dc.comm == nullptr) continue;
          ncclResult_t r = ncclSuccess;
          ncclCommGetAsyncError(dc.comm, &r);
          if (r != ncclSuccess && r != ncclInProgress) {
            async = r;
            failing = dc.comm;
          }
        }
        if (async != ncclSuccess) {
          const absl::Status s = NcclError(async, p->info.description, failing);
          AbortLocked(std::string(s.message()));
        } else if (absl::Now() > p->deadline) {
          const OpInfo info = p->info;
          mu_.Unlock();  // the census talks to the store
          std::vector<int> missing;
          if (info.seq >= 0) {
            missing = internal::MissingRanks(*ctx_.store, ctx_.prefix, info.seq, ctx_.rank,
                                             ctx_.size, std::min(ctx_.timeout, absl::Seconds(3)));
          }
          mu_.Lock();
          const std::string reason = absl::StrCat(
              info.description, ": timed out after ", DurationText(ctx_.timeout),
              missing.empty()
                  ? ""
                  : absl::StrCat("; ranks ", internal::RanksText(missing, ctx_.global_ranks),
                                 " never arrived"));
          AbortLocked(reason);
          for (auto& f : failed_) {
            if (f.first->description() == info.description) {
              f.second = absl::DeadlineExceededError(reason);
            }
          }
        }
      }
      CompleteFailed();
      // Sleep until the next check, or wake for stop_.
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.poll_interval);
      if (stop_) return;
    }
  }

  // The oldest op in flight that no abort has failed yet, or null.
  Pending* LiveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (Pending& p : pending_) {
      if (!p.aborted) return &p;
    }
    return nullptr;
  }

  const BackendContext ctx_;
  const NcclOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<CommSet>> comms_ ABSL_GUARDED_BY(mu_);
  int64_t next_comm_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<WorkPtr, absl::Status>> failed_ ABSL_GUARDED_BY(mu_);
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Last: they use everything above.
  std::thread completion_;
  std::thread watchdog_;
};

}  // namespace

BackendFactory NcclBackendFactory(NcclOptions options) {
  return [options](const BackendContext& ctx) -> absl::StatusOr<std::unique_ptr<Backend>> {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("backend nccl for group '", ctx.group_name, "': no CUDA device"));
    }
    return std::unique_ptr<Backend>(std::make_unique<NcclBackend>(ctx, options));
  };
}

}  // namespace baton::comm
