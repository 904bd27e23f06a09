#include "rpc/cuda/ipc_channel.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"

namespace baton::rpc::cuda {
namespace {

const Function<void(std::vector<int64_t>)> release_fn("baton.cuda_ipc.release");

absl::Status CudaStatus(cudaError_t e, absl::string_view call, int peer) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA IPC with worker ", peer, ": ", call, ": ", cudaGetErrorString(e)));
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

// cuMemGetAddressRange, found through the runtime: the channel does not link
// the driver's library (libcuda.so.1), so that a module holding it loads on
// a machine without a GPU driver, as torch's own libraries do.
using MemGetAddressRange = decltype(&cuMemGetAddressRange);

absl::StatusOr<MemGetAddressRange> FindMemGetAddressRange(int peer) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  absl::Status s =
      CudaStatus(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, CUDART_VERSION,
                                                  cudaEnableDefault, &found),
                 "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)", peer);
  if (!s.ok()) return s;
  if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
    return absl::InternalError(
        absl::StrCat("CUDA IPC with worker ", peer, ": the driver has no cuMemGetAddressRange"));
  }
  return reinterpret_cast<MemGetAddressRange>(fn);
}

}  // namespace

class CudaIpcChannel::Impl {
 public:
  explicit Impl(Options options) : options_(options) {}

  ~Impl() {
    StopWatcher();
    // I5: everything still held goes back; mappings close with their
    // shared pointers.
    absl::MutexLock lock(&mu_);
    for (auto& [token, h] : held_) DestroyEvent(h.device, h.event);
    for (auto& [device, events] : free_events_) {
      for (cudaEvent_t e : events) DestroyEvent(device, e);
    }
    for (auto& [peer, m] : peers_) {
      for (auto& [key, ev] : m.events) DestroyEvent(ev.first, ev.second);
    }
  }

  absl::Status Export(const at::Tensor& t, int peer, Encoder& enc) {
    const c10::DeviceIndex device = t.device().index();
    c10::cuda::CUDAGuard guard(device);
    // The allocation (the caching allocator's cudaMalloc segment) the
    // tensor lies in: what an IPC handle covers.
    ASSIGN_OR_RETURN(MemGetAddressRange range, AddressRange(peer));
    // The driver's call needs the device's context current on this thread,
    // which the guard does not make so on a thread that never used the
    // device (it skips setting the device it believes is set).
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice", peer));
    CUdeviceptr base_address = 0;
    size_t base_size = 0;
    if (const CUresult r =
            (range)(&base_address, &base_size, reinterpret_cast<CUdeviceptr>(t.data_ptr()));
        r != CUDA_SUCCESS) {
      return absl::InternalError(
          absl::StrCat("CUDA IPC with worker ", peer, ": cuMemGetAddressRange: CUresult ", r));
    }
    void* base = reinterpret_cast<void*>(base_address);
    cudaIpcMemHandle_t memory;
    if (absl::Status s =
            CudaStatus(cudaIpcGetMemHandle(&memory, base), "cudaIpcGetMemHandle", peer);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<cudaEvent_t> taken = TakeEvent(device, peer);
    if (!taken.ok()) return taken.status();
    cudaEvent_t event = *taken;
    cudaIpcEventHandle_t event_handle;
    absl::Status s =
        CudaStatus(cudaEventRecord(event, c10::cuda::getCurrentCUDAStream(device).stream()),
                   "cudaEventRecord", peer);
    if (s.ok()) {
      s = CudaStatus(cudaIpcGetEventHandle(&event_handle, event), "cudaIpcGetEventHandle", peer);
    }
    if (!s.ok()) {
      DestroyEvent(device, event);
      return s;
    }
    const size_t offset = static_cast<const char*>(t.data_ptr()) - static_cast<const char*>(base);
    const int64_t bytes = static_cast<int64_t>(t.numel() * t.element_size());
    int64_t token;
    {
      absl::MutexLock lock(&mu_);
      token = next_token_++;
      held_[token] = Held{peer, t, device, event, bytes};
      held_bytes_ += bytes;
    }
    enc.WriteBytes(&memory, sizeof(memory));
    enc.WriteVarint(offset);
    enc.WriteVarint(base_size);
    enc.WriteBytes(&event_handle, sizeof(event_handle));
    enc.WriteVarint(static_cast<uint64_t>(token));
    // The message may never reach the peer: then nothing releases the
    // token but the peer's death or this channel's end (I4, I5). Undo it
    // when the agent knows the message was not decoded.
    enc.UndoIfUndelivered([weak = weak_self_, token] {
      if (auto self = weak.lock()) self->impl_->Release(-1, {token});
    });
    return absl::OkStatus();
  }

  absl::StatusOr<at::Tensor> Import(Decoder& dec, int peer, int device,
                                    const std::vector<int64_t>& sizes, c10::ScalarType dtype) {
    cudaIpcMemHandle_t memory;
    cudaIpcEventHandle_t event_handle;
    uint64_t offset = 0, base_size = 0, token = 0;
    absl::Status s = dec.ReadBytes(&memory, sizeof(memory), "CUDA IPC memory handle");
    if (s.ok()) s = dec.ReadVarint(&offset, "CUDA IPC offset");
    if (s.ok()) s = dec.ReadVarint(&base_size, "CUDA IPC allocation size");
    if (s.ok()) s = dec.ReadBytes(&event_handle, sizeof(event_handle), "CUDA IPC event handle");
    if (s.ok()) s = dec.ReadVarint(&token, "CUDA IPC token");
    if (!s.ok()) return s;
    uint64_t numel = 1;
    for (int64_t d : sizes) numel *= static_cast<uint64_t>(d);
    const uint64_t bytes = numel * c10::elementSize(dtype);
    if (offset > base_size || bytes > base_size - offset) {
      return absl::DataLossError(absl::StrCat("CUDA IPC from worker ", peer, ": ", bytes,
                                              " bytes at offset ", offset,
                                              " lie outside an allocation of ", base_size));
    }
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    ASSIGN_OR_RETURN(std::shared_ptr<void> mapping, Map(peer, Bytes(&memory, sizeof(memory))));
    absl::StatusOr<cudaEvent_t> event =
        OpenEvent(peer, device, Bytes(&event_handle, sizeof(event_handle)));
    if (!event.ok()) return event.status();
    // I2, I6: the copy runs on the decoding thread's current stream, where
    // the tensor is used, into memory of that stream: it follows the work
    // queued there (freed, the caching allocator hands a block out again only
    // in that stream's order, so nothing still reading the block's previous
    // tensor is overwritten), and whatever is queued there next sees the
    // copied values.
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
    at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(dtype).device(at::kCUDA, device));
    s = CudaStatus(cudaStreamWaitEvent(current.stream(), *event, 0), "cudaStreamWaitEvent", peer);
    if (s.ok() && bytes > 0) {
      s = CudaStatus(cudaMemcpyAsync(out.data_ptr(), static_cast<char*>(mapping.get()) + offset,
                                     bytes, cudaMemcpyDeviceToDevice, current.stream()),
                     "cudaMemcpyAsync", peer);
    }
    if (s.ok() && options_.stream_ordered) {
      // I3 once the copy has run: the watcher sends the release.
      absl::StatusOr<cudaEvent_t> done = TakeEvent(static_cast<c10::DeviceIndex>(device), peer);
      if (done.ok()) {
        s = CudaStatus(cudaEventRecord(*done, current.stream()), "cudaEventRecord", peer);
        if (s.ok()) {
          Watch({peer, static_cast<int64_t>(token), device, *done, std::move(mapping)});
          return out;
        }
        DestroyEvent(device, *done);
      } else {
        s = done.status();
      }
    }
    if (s.ok()) {
      s = CudaStatus(cudaStreamSynchronize(current.stream()), "cudaStreamSynchronize", peer);
    }
    // I3, also after a failed copy: the sender has nothing more to keep.
    SendRelease(peer, static_cast<int64_t>(token));
    if (!s.ok()) return s;
    return out;
  }

  // Sends what the watcher still holds (graceful shutdown: before the
  // drain), waiting for its copies until `deadline`.
  absl::Status Flush(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return pending_.empty() && watching_ == 0;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("CUDA IPC: ", pending_.size() + watching_,
                       " imported copies still running at the shutdown deadline"));
    }
    return absl::OkStatus();
  }

  // Stops the watcher: no release is sent any more (the senders release
  // at our death or their end, I4/I5). A copy still running keeps its
  // mapping until it ends, waited for up to kCopyWait; past that the mapping
  // is left open rather than closed under the copy.
  void StopWatcher() {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      agent_closed_ = true;
    }
    if (watcher_.joinable()) watcher_.join();
  }

  // Drops `tokens` (I3); `peer` -1: the exporter's own undo.
  void Release(int peer, const std::vector<int64_t>& tokens) {
    absl::MutexLock lock(&mu_);
    for (int64_t token : tokens) {
      auto it = held_.find(token);
      if (it == held_.end() || (peer >= 0 && it->second.peer != peer)) continue;
      free_events_[it->second.device].push_back(it->second.event);
      held_bytes_ -= it->second.bytes;
      held_.erase(it);
    }
  }

  // I4: the peer's tokens, mappings and events go.
  void PeerDied(int peer) {
    std::vector<std::pair<c10::DeviceIndex, cudaEvent_t>> events;
    PeerState gone;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = held_.begin(); it != held_.end();) {
        if (it->second.peer == peer) {
          events.push_back({it->second.device, it->second.event});
          held_bytes_ -= it->second.bytes;
          it = held_.erase(it);
        } else {
          ++it;
        }
      }
      auto p = peers_.find(peer);
      if (p != peers_.end()) {
        gone = std::move(p->second);
        peers_.erase(p);
      }
    }
    // The event the dead peer may still have waited on is not reused.
    for (auto& [device, e] : events) DestroyEvent(device, e);
    for (auto& [key, ev] : gone.events) DestroyEvent(ev.first, ev.second);
  }

  size_t held() const {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  int64_t held_bytes() const {
    absl::MutexLock lock(&mu_);
    return held_bytes_;
  }

  const Options options_;
  Runtime* agent_ = nullptr;
  std::weak_ptr<CudaIpcChannel> weak_self_;

 private:
  // An import whose copy is queued: the sender's memory is released when
  // `done` has completed.
  struct Pending {
    int peer;
    int64_t token;
    int device;
    cudaEvent_t done;
    std::shared_ptr<void> mapping;  // open until the copy has read it
  };
  static constexpr absl::Duration kCopyWait = absl::Seconds(10);

  void Watch(Pending p) {
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_) {
        if (!watcher_.joinable()) watcher_ = std::thread([this] { WatchLoop(); });
        pending_.push_back(std::move(p));
        return;
      }
    }
    // The agent is closing: nobody will take the release; the copy still
    // needs its mapping until it ends.
    cudaEventSynchronize(p.done);
    Finish(p);
  }

  // The watcher thread: takes new imports, polls their events (backing off
  // from 10 us to 1 ms while copies run), and releases what has been copied.
  void WatchLoop() {
    std::vector<Pending> inflight;
    absl::Duration nap = absl::Microseconds(10);
    bool stop = false;
    while (!stop) {
      {
        absl::MutexLock lock(&mu_);
        auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !pending_.empty();
        };
        if (inflight.empty()) {
          mu_.AwaitWithTimeout(absl::Condition(&work), absl::Seconds(1));
          nap = absl::Microseconds(10);
        }
        for (Pending& p : pending_) inflight.push_back(std::move(p));
        pending_.clear();
        watching_ = inflight.size();
        stop = stopping_;
      }
      if (stop) break;
      std::vector<Pending> copied;
      for (auto it = inflight.begin(); it != inflight.end();) {
        if (cudaEventQuery(it->done) == cudaErrorNotReady) {
          ++it;
        } else {
          copied.push_back(std::move(*it));
          it = inflight.erase(it);
        }
      }
      for (Pending& p : copied) {
        SendRelease(p.peer, p.token);
        Finish(p);
      }
      {
        absl::MutexLock lock(&mu_);
        watching_ = inflight.size();
      }
      if (copied.empty() && !inflight.empty()) {
        absl::SleepFor(nap);
        nap = std::min(nap * 2, absl::Milliseconds(1));
      }
    }
    // Stopped: wait (bounded) for what is still copying, send nothing.
    const absl::Time until = absl::Now() + kCopyWait;
    {
      absl::MutexLock lock(&mu_);
      for (Pending& p : pending_) inflight.push_back(std::move(p));
      pending_.clear();
    }
    for (Pending& p : inflight) {
      while (cudaEventQuery(p.done) == cudaErrorNotReady && absl::Now() < until) {
        absl::SleepFor(absl::Microseconds(100));
      }
      if (cudaEventQuery(p.done) == cudaErrorNotReady) {
        // Left open for good: closing it under a running copy could fault.
        new std::shared_ptr<void>(std::move(p.mapping));
        continue;
      }
      Finish(p);
    }
    absl::MutexLock lock(&mu_);
    watching_ = 0;
  }

  // The event goes back to the pool; the mapping is let go.
  void Finish(Pending& p) {
    p.mapping.reset();
    absl::MutexLock lock(&mu_);
    free_events_[p.device].push_back(p.done);
  }

  absl::StatusOr<MemGetAddressRange> AddressRange(int peer) {
    absl::MutexLock lock(&mu_);
    if (address_range_ == nullptr) {
      ASSIGN_OR_RETURN(MemGetAddressRange fn, FindMemGetAddressRange(peer));
      address_range_ = fn;
    }
    return address_range_;
  }

  struct Held {
    int peer;
    at::Tensor tensor;  // keeps the memory out of the caching allocator
    c10::DeviceIndex device;
    cudaEvent_t event;
    int64_t bytes;
  };
  struct PeerState {
    // Mapped allocations, most recently used first.
    std::list<std::pair<std::string, std::shared_ptr<void>>> mappings;
    // Every mapping still open, cached or held by an import in progress.
    absl::flat_hash_map<std::string, std::weak_ptr<void>> live;
    // Opened events of the peer's pool, by handle: (device, event).
    absl::flat_hash_map<std::string, std::pair<int, cudaEvent_t>> events;
  };

  static void DestroyEvent(int device, cudaEvent_t event) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaEventDestroy(event);
  }

  // An interprocess event of `device`'s pool, or a new one.
  absl::StatusOr<cudaEvent_t> TakeEvent(c10::DeviceIndex device, int peer) {
    {
      absl::MutexLock lock(&mu_);
      auto& pool = free_events_[device];
      if (!pool.empty()) {
        cudaEvent_t e = pool.back();
        pool.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    absl::Status s =
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess),
                   "cudaEventCreateWithFlags", peer);
    if (!s.ok()) return s;
    return e;
  }

  absl::StatusOr<std::shared_ptr<void>> Map(int peer, const std::string& handle) {
    // One open at a time: CUDA maps an allocation once per process, so two
    // imports of one allocation must not both miss and both open it.
    absl::MutexLock opening(&open_mu_);
    {
      absl::MutexLock lock(&mu_);
      PeerState& state = peers_[peer];
      auto& list = state.mappings;
      for (auto it = list.begin(); it != list.end(); ++it) {
        if (it->first == handle) {
          list.splice(list.begin(), list, it);
          return list.front().second;
        }
      }
      // Evicted from the cache while an import still copies from it: still
      // mapped, so it is taken again rather than opened twice.
      if (auto live = state.live.find(handle); live != state.live.end()) {
        if (std::shared_ptr<void> mapped = live->second.lock()) {
          list.emplace_front(handle, mapped);
          while (list.size() > options_.max_mappings) list.pop_back();
          return mapped;
        }
        state.live.erase(live);
      }
    }
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* address = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaIpcOpenMemHandle(&address, h, cudaIpcMemLazyEnablePeerAccess),
                               "cudaIpcOpenMemHandle", peer));
    // Closed when the last user lets go: the cache below, or an import in
    // progress when the cache evicts it.
    const int device = [] {
      int d = 0;
      cudaGetDevice(&d);
      return d;
    }();
    std::shared_ptr<void> mapped(address, [device](void* p) {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      cudaIpcCloseMemHandle(p);
    });
    absl::MutexLock lock(&mu_);
    PeerState& state = peers_[peer];
    state.live[handle] = mapped;
    auto& list = state.mappings;
    list.emplace_front(handle, mapped);
    while (list.size() > options_.max_mappings) list.pop_back();
    // Forget mappings that closed.
    if (state.live.size() > 2 * options_.max_mappings) {
      for (auto it = state.live.begin(); it != state.live.end();) {
        if (it->second.expired()) {
          state.live.erase(it++);
        } else {
          ++it;
        }
      }
    }
    return mapped;
  }

  absl::StatusOr<cudaEvent_t> OpenEvent(int peer, int device, const std::string& handle) {
    {
      absl::MutexLock lock(&mu_);
      auto& events = peers_[peer].events;
      auto it = events.find(handle);
      if (it != events.end()) return it->second.second;
    }
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    cudaEvent_t event;
    RETURN_IF_ERROR(CudaStatus(cudaIpcOpenEventHandle(&event, h), "cudaIpcOpenEventHandle", peer));
    absl::MutexLock lock(&mu_);
    peers_[peer].events[handle] = {device, event};
    return event;
  }

  void SendRelease(int peer, int64_t token) {
    {
      absl::MutexLock lock(&mu_);
      if (agent_closed_) return;
    }
    if (agent_ == nullptr) return;
    // Fire and forget, from the executor: the decode may run on a thread
    // that must not wait for room in the peer's window. If it never
    // arrives, the sender releases the token when it finds this worker dead
    // (I4) or at its end (I5).
    Runtime* agent = agent_;
    auto send = [agent, peer, token] {
      (void)agent->rpc_async(CallOptions{}, peer, release_fn, std::vector<int64_t>{token});
    };
    if (agent->executor() == nullptr || !agent->executor()->Submit(send)) send();
  }

  // Serialises Map's opens (held around mu_, never inside it).
  absl::Mutex open_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  int64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Held> held_ ABSL_GUARDED_BY(mu_);
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::vector<cudaEvent_t>> free_events_ ABSL_GUARDED_BY(mu_);
  std::map<int, PeerState> peers_ ABSL_GUARDED_BY(mu_);
  MemGetAddressRange address_range_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Imports for the watcher, and how many it polls.
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  size_t watching_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set once the agent can send nothing more (its shutdown's release step).
  bool agent_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

CudaIpcChannel::CudaIpcChannel(Options options) : impl_(std::make_unique<Impl>(options)) {}
CudaIpcChannel::~CudaIpcChannel() = default;

std::shared_ptr<CudaIpcChannel> CudaIpcChannel::Install(FunctionRegistry& registry,
                                                        Options options) {
  std::shared_ptr<CudaIpcChannel> channel(new CudaIpcChannel(options));
  channel->impl_->weak_self_ = channel;
  std::weak_ptr<CudaIpcChannel> weak = channel;
  (void)registry.Register(release_fn, [weak](const CallContext& ctx, std::vector<int64_t> tokens) {
    auto self = weak.lock();
    if (self == nullptr || ctx.caller == nullptr) return;
    self->impl_->Release(ctx.caller->id, tokens);
  });
  return channel;
}

void CudaIpcChannel::Attach(RpcAgent* handle) {
  Runtime* agent = &handle->runtime();
  impl_->agent_ = agent;
  std::weak_ptr<CudaIpcChannel> weak = impl_->weak_self_;
  agent->AddPeerFailureListener([weak](const PeerFailure& failure) {
    if (auto self = weak.lock()) self->impl_->PeerDied(failure.peer);
  });
  // Releases of copies still running go out before the drain; none is sent
  // once the agent can no longer send (the watcher stops).
  Runtime::ShutdownHook hook;
  hook.settle = [weak](absl::Time deadline) {
    auto self = weak.lock();
    return self != nullptr ? self->impl_->Flush(deadline) : absl::OkStatus();
  };
  hook.release = [weak] {
    if (auto self = weak.lock()) self->impl_->StopWatcher();
  };
  agent->AddShutdownHook(std::move(hook));
}

bool CudaIpcChannel::Wants(size_t bytes) const { return bytes >= impl_->options_.min_bytes; }

absl::Status CudaIpcChannel::Export(const at::Tensor& tensor, int peer, Encoder& enc) {
  return impl_->Export(tensor, peer, enc);
}

absl::StatusOr<at::Tensor> CudaIpcChannel::Import(Decoder& dec, int peer, int device,
                                                  const std::vector<int64_t>& sizes,
                                                  c10::ScalarType dtype) {
  return impl_->Import(dec, peer, device, sizes, dtype);
}

size_t CudaIpcChannel::held() const { return impl_->held(); }
int64_t CudaIpcChannel::held_bytes() const { return impl_->held_bytes(); }

}  // namespace baton::rpc::cuda
