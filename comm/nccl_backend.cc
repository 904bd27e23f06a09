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
#include "comm/internal/store_exchange.h"

namespace baton::comm {
namespace {

absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(what, ": NCCL error ", static_cast<int>(r), " (",
                   ncclGetErrorString(r), ")"));
}

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": CUDA error ", cudaGetErrorString(e)));
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
      return absl::InvalidArgumentError(absl::StrCat(
          "backend nccl cannot reduce dtype ", c10::toString(type)));
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

struct Pending {
  OpInfo info;
  WorkPtr work;
  std::shared_ptr<CommSet> comms;
  std::vector<cudaEvent_t> done;  // one per member
  std::vector<at::Tensor> keep_alive;
  absl::Time deadline;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(BackendContext ctx, NcclOptions options)
      : ctx_(std::move(ctx)), options_(options),
        watchdog_([this] { Watchdog(); }) {}

  ~NcclBackend() override { (void)Shutdown(absl::ZeroDuration()); }

  std::string name() const override { return "nccl"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CUDA; }

  WorkPtr AllReduce(const OpInfo& info, std::vector<at::Tensor> tensors,
                    ReduceOp op) override {
    auto type = NcclType(tensors[0].scalar_type());
    if (!type.ok()) return Failed(info, type.status());
    auto rop = NcclOp(op, tensors[0].scalar_type());
    if (!rop.ok()) return Failed(info, rop.status());
    return Launch(info, tensors, tensors, nullptr,
                  [&, dt = *type, rop = *rop](size_t i, DeviceComm& dc) {
                    void* p = tensors[i].data_ptr();
                    return ncclAllReduce(p, p, tensors[i].numel(), dt, rop,
                                         dc.comm, dc.stream.stream());
                  },
                  nullptr);
  }

  WorkPtr Broadcast(const OpInfo& info, std::vector<at::Tensor> tensors,
                    int root) override {
    const int ndev = static_cast<int>(tensors.size());
    return Launch(info, tensors, tensors, nullptr,
                  [&](size_t i, DeviceComm& dc) {
                    void* p = tensors[i].data_ptr();
                    return ncclBroadcast(p, p, tensors[i].nbytes(), ncclUint8,
                                         root * ndev, dc.comm,
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
    return Launch(info, tensors, tensors, nullptr,
                  [&, dt = *type, rop = *rop](size_t i, DeviceComm& dc) {
                    void* p = tensors[i].data_ptr();
                    return ncclReduce(p, p, tensors[i].numel(), dt, rop,
                                      root * ndev, dc.comm, dc.stream.stream());
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
          return ncclAllGather(input.data_ptr(), flat.data_ptr(),
                               input.nbytes(), ncclUint8, dc.comm,
                               dc.stream.stream());
        },
        [&] {
          for (int r = 0; r < ctx_.size; ++r) {
            outputs[r].view({-1}).copy_(
                flat.narrow(0, r * input.numel(), input.numel()));
          }
        });
  }

  WorkPtr Gather(const OpInfo& info, std::vector<at::Tensor> outputs,
                 at::Tensor input, int root) override {
    std::vector<at::Tensor> keep = outputs;
    keep.push_back(input);
    const bool is_root = ctx_.rank == root;
    return Launch(
        info, {input}, keep, nullptr,
        [&](size_t, DeviceComm& dc) -> ncclResult_t {
          if (!is_root) {
            return ncclSend(input.data_ptr(), input.nbytes(), ncclUint8, root,
                            dc.comm, dc.stream.stream());
          }
          for (int r = 0; r < ctx_.size; ++r) {
            if (r == root) continue;
            ncclResult_t res =
                ncclRecv(outputs[r].data_ptr(), input.nbytes(), ncclUint8, r,
                         dc.comm, dc.stream.stream());
            if (res != ncclSuccess) return res;
          }
          return ncclSuccess;
        },
        [&] {
          if (is_root) outputs[root].copy_(input);
        });
  }

  WorkPtr Scatter(const OpInfo& info, at::Tensor output,
                  std::vector<at::Tensor> inputs, int root) override {
    std::vector<at::Tensor> keep = inputs;
    keep.push_back(output);
    const bool is_root = ctx_.rank == root;
    return Launch(
        info, {output}, keep, nullptr,
        [&](size_t, DeviceComm& dc) -> ncclResult_t {
          if (!is_root) {
            return ncclRecv(output.data_ptr(), output.nbytes(), ncclUint8,
                            root, dc.comm, dc.stream.stream());
          }
          for (int r = 0; r < ctx_.size; ++r) {
            if (r == root) continue;
            ncclResult_t res =
                ncclSend(inputs[r].data_ptr(), output.nbytes(), ncclUint8, r,
                         dc.comm, dc.stream.stream());
            if (res != ncclSuccess) return res;
          }
          return ncclSuccess;
        },
        [&] {
          if (is_root) output.copy_(inputs[root]);
        });
  }

  WorkPtr ReduceScatter(const OpInfo& info, at::Tensor output,
                        std::vector<at::Tensor> inputs, ReduceOp op) override {
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
          return ncclReduceScatter(flat.data_ptr(), output.data_ptr(),
                                   output.numel(), dt, rop, dc.comm,
                                   dc.stream.stream());
        },
        nullptr);
  }

  WorkPtr AllToAll(const OpInfo& info, at::Tensor output,
                   at::Tensor input) override {
    at::Tensor source;
    const size_t chunk = input.nbytes() / ctx_.size;
    return Launch(
        info, {output}, {output, input},
        [&] {
          source = input.data_ptr() == output.data_ptr() ? input.clone() : input;
        },
        [&](size_t, DeviceComm& dc) -> ncclResult_t {
          auto* in = static_cast<uint8_t*>(source.data_ptr());
          auto* out = static_cast<uint8_t*>(output.data_ptr());
          for (int r = 0; r < ctx_.size; ++r) {
            ncclResult_t res = ncclSend(in + r * chunk, chunk, ncclUint8, r,
                                        dc.comm, dc.stream.stream());
            if (res == ncclSuccess) {
              res = ncclRecv(out + r * chunk, chunk, ncclUint8, r, dc.comm,
                             dc.stream.stream());
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
        {1}, at::TensorOptions()
                 .device(at::Device(at::kCUDA, ctx_.rank % count))
                 .dtype(at::kInt));
    WorkPtr work = AllReduce(info, {one}, ReduceOp::kSum);
    return work;
  }

  WorkPtr Send(const OpInfo& info, at::Tensor tensor, int dst,
               uint32_t) override {
    return Launch(info, {tensor}, {tensor}, nullptr,
                  [&](size_t, DeviceComm& dc) {
                    return ncclSend(tensor.data_ptr(), tensor.nbytes(),
                                    ncclUint8, dst, dc.comm,
                                    dc.stream.stream());
                  },
                  nullptr);
  }

  WorkPtr Recv(const OpInfo& info, at::Tensor tensor, int src,
               uint32_t) override {
    return Launch(info, {tensor}, {tensor}, nullptr,
                  [&](size_t, DeviceComm& dc) {
                    return ncclRecv(tensor.data_ptr(), tensor.nbytes(),
                                    ncclUint8, src, dc.comm,
                                    dc.stream.stream());
                  },
                  nullptr);
  }

  absl::Status Shutdown(absl::Duration timeout) override {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return absl::OkStatus();
      shut_down_ = true;
      auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return pending_.empty();
      };
      if (!mu_.AwaitWithTimeout(absl::Condition(&drained), timeout)) {
        AbortLocked("the group was destroyed with ops in flight");
      }
      stop_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    absl::MutexLock lock(&mu_);
    for (auto& [key, set] : comms_) {
      for (DeviceComm& dc : set->members) ncclCommDestroy(dc.comm);
    }
    comms_.clear();
    return absl::OkStatus();
  }

 private:
  WorkPtr Failed(const OpInfo& info, absl::Status status) {
    return Work::Completed(info.description, Annotate(status, info.description));
  }

  // Finds or creates the communicators of the devices of `tensors`.
  absl::StatusOr<std::shared_ptr<CommSet>> Comms(
      const std::vector<at::Tensor>& tensors) {
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
    absl::Status s = store::Barrier(*ctx_.store, id_key + "/arrive", ctx_.rank,
                                    ctx_.size, ctx_.timeout);
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
      DeviceComm dc{devices[i], nullptr,
                    c10::cuda::getStreamFromPool(false, devices[i])};
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
                 std::vector<at::Tensor> keep_alive, const StreamFn& pre,
                 const IssueFn& issue, const StreamFn& post) {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) {
        return Failed(info, absl::FailedPreconditionError("the group was destroyed"));
      }
      if (!abort_reason_.empty()) {
        return Failed(info, absl::FailedPreconditionError(absl::StrCat(
                                "the group was aborted earlier: ", abort_reason_)));
      }
    }
    absl::StatusOr<std::shared_ptr<CommSet>> comms = Comms(tensors);
    if (!comms.ok()) return Failed(info, comms.status());
    Pending p;
    p.info = info;
    p.work = std::make_shared<Work>(info.description);
    p.comms = *comms;
    p.deadline = absl::Now() + ctx_.timeout;
    try {
      // The NCCL streams wait for the callers' current streams.
      for (DeviceComm& dc : p.comms->members) {
        c10::cuda::CUDAGuard guard(dc.device);
        cudaEvent_t ready;
        absl::Status s = CudaError(
            cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event");
        if (s.ok()) {
          s = CudaError(cudaEventRecord(
                            ready, c10::cuda::getCurrentCUDAStream(dc.device)),
                        "event record");
        }
        if (s.ok()) {
          s = CudaError(cudaStreamWaitEvent(dc.stream.stream(), ready, 0),
                        "stream wait");
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
      absl::Status s = NcclError(r, "issuing the op");
      if (!s.ok()) return Failed(info, s);
      if (post) {
        c10::cuda::CUDAStreamGuard on_stream(first.stream);
        post();
      }
      for (DeviceComm& dc : p.comms->members) {
        c10::cuda::CUDAGuard guard(dc.device);
        for (const at::Tensor& t : keep_alive) {
          if (t.defined() && t.device().index() == dc.device) {
            c10::cuda::CUDACachingAllocator::recordStream(
                t.storage().data_ptr(), dc.stream);
          }
        }
        cudaEvent_t done;
        s = CudaError(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
                      "event");
        if (s.ok()) s = CudaError(cudaEventRecord(done, dc.stream.stream()), "event record");
        if (!s.ok()) return Failed(info, s);
        p.done.push_back(done);
      }
    } catch (const std::exception& e) {
      return Failed(info, absl::InternalError(e.what()));
    }
    p.keep_alive = std::move(keep_alive);
    WorkPtr work = p.work;
    absl::MutexLock lock(&mu_);
    pending_.push_back(std::move(p));
    return work;
  }

  // Aborts every communicator; pending ops fail with `reason`.
  void AbortLocked(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (abort_reason_.empty()) abort_reason_ = reason;
    for (auto& [key, set] : comms_) {
      for (DeviceComm& dc : set->members) ncclCommAbort(dc.comm);
    }
    comms_.clear();
    for (Pending& p : pending_) {
      failed_.push_back({p.work, absl::FailedPreconditionError(absl::StrCat(
                                     p.info.description, ": aborted: ", reason))});
      for (cudaEvent_t e : p.done) cudaEventDestroy(e);
    }
    pending_.clear();
  }

  // Polls the oldest op: its end events, async errors, its deadline.
  void Watchdog() {
    for (;;) {
      std::vector<std::pair<WorkPtr, absl::Status>> finished;
      {
        absl::MutexLock lock(&mu_);
        finished.swap(failed_);
        if (stop_ && pending_.empty() && finished.empty()) return;
        while (!pending_.empty()) {
          Pending& p = pending_.front();
          bool all_done = true;
          for (size_t i = 0; i < p.done.size(); ++i) {
            c10::cuda::CUDAGuard guard(p.comms->members[i].device);
            if (cudaEventQuery(p.done[i]) != cudaSuccess) all_done = false;
          }
          if (all_done) {
            for (cudaEvent_t e : p.done) cudaEventDestroy(e);
            finished.push_back({p.work, absl::OkStatus()});
            pending_.pop_front();
            continue;
          }
          ncclResult_t async = ncclSuccess;
          for (DeviceComm& dc : p.comms->members) {
            ncclResult_t r = ncclSuccess;
            ncclCommGetAsyncError(dc.comm, &r);
            if (r != ncclSuccess) async = r;
          }
          if (async != ncclSuccess) {
            const absl::Status s = NcclError(async, p.info.description);
            AbortLocked(std::string(s.message()));
          } else if (absl::Now() > p.deadline) {
            const OpInfo info = p.info;
            mu_.Unlock();  // the census talks to the store
            std::vector<int> missing;
            if (info.seq >= 0) {
              missing = internal::MissingRanks(*ctx_.store, ctx_.prefix,
                                               info.seq, ctx_.rank, ctx_.size,
                                               std::min(ctx_.timeout, absl::Seconds(3)));
            }
            mu_.Lock();
            const std::string reason = absl::StrCat(
                info.description, ": timed out after ", DurationText(ctx_.timeout),
                missing.empty() ? ""
                                : absl::StrCat("; ranks ",
                                               internal::RanksText(missing, ctx_.global_ranks),
                                               " never arrived"));
            AbortLocked(reason);
            for (auto& f : failed_) {
              if (f.first->description() == info.description) {
                f.second = absl::DeadlineExceededError(reason);
              }
            }
          }
          break;
        }
        finished.insert(finished.end(), failed_.begin(), failed_.end());
        failed_.clear();
      }
      for (auto& [work, status] : finished) work->MarkCompleted(status);
      absl::SleepFor(options_.poll_interval);
    }
  }

  const BackendContext ctx_;
  const NcclOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<CommSet>> comms_
      ABSL_GUARDED_BY(mu_);
  int64_t next_comm_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<WorkPtr, absl::Status>> failed_ ABSL_GUARDED_BY(mu_);
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;  // last: uses everything above
};

}  // namespace

BackendFactory NcclBackendFactory(NcclOptions options) {
  return [options](const BackendContext& ctx)
             -> absl::StatusOr<std::unique_ptr<Backend>> {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "backend nccl for group '", ctx.group_name, "': no CUDA device"));
    }
    return std::unique_ptr<Backend>(std::make_unique<NcclBackend>(ctx, options));
  };
}

}  // namespace baton::comm
