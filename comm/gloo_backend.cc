#include "comm/gloo_backend.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "comm/internal/gloo_store.h"
#include "comm/internal/reduce_kernels.h"
#include "comm/internal/serial_executor.h"
#include "comm/internal/shm_allreduce.h"
#include "comm/internal/store_exchange.h"

namespace baton::comm {
namespace {

using ::gloo::transport::UnboundBuffer;
using internal::ReduceFn;

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Slots for send/recv: a prefix byte that gloo's collectives never use
// (they build slots from small prefixes), then the user's tag.
uint64_t P2PSlot(uint32_t tag) { return (uint64_t{0xBA} << 56) | tag; }

// Each collective gets its own tag (its sequence number), so consecutive ops
// never share gloo slots. P2P slots use another prefix (see P2PSlot).
uint32_t Tag(int64_t seq) { return static_cast<uint32_t>(seq & 0xFFFFFFFF); }

uint8_t* Bytes(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }

// A 16-byte element, for complex double.
struct Elem16 {
  uint64_t lo, hi;
};

template <typename E>
void AllReduceAs(const std::shared_ptr<::gloo::Context>& context,
                 const std::vector<at::Tensor>& tensors, const ReduceFn& fn,
                 std::chrono::milliseconds timeout, uint32_t tag) {
  ::gloo::AllreduceOptions opts(context);
  std::vector<E*> ptrs;
  ptrs.reserve(tensors.size());
  for (const auto& t : tensors) ptrs.push_back(static_cast<E*>(t.data_ptr()));
  opts.setOutputs(ptrs, static_cast<size_t>(tensors[0].numel()));
  opts.setReduceFunction(fn);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  ::gloo::allreduce(opts);
}

// gloo only needs the element size; the kernel knows the dtype.
void AllReduceTensors(const std::shared_ptr<::gloo::Context>& context,
                      const std::vector<at::Tensor>& tensors, const ReduceFn& fn,
                      std::chrono::milliseconds timeout, uint32_t tag) {
  switch (tensors[0].element_size()) {
    case 1: return AllReduceAs<uint8_t>(context, tensors, fn, timeout, tag);
    case 2: return AllReduceAs<uint16_t>(context, tensors, fn, timeout, tag);
    case 4: return AllReduceAs<uint32_t>(context, tensors, fn, timeout, tag);
    case 8: return AllReduceAs<uint64_t>(context, tensors, fn, timeout, tag);
    case 16: return AllReduceAs<Elem16>(context, tensors, fn, timeout, tag);
    default:
      throw std::invalid_argument(
          absl::StrCat("unsupported element size ", tensors[0].element_size()));
  }
}

template <typename E>
void ReduceAs(const std::shared_ptr<::gloo::Context>& context, const at::Tensor& tensor, int root,
              const ReduceFn& fn, std::chrono::milliseconds timeout, uint32_t tag) {
  ::gloo::ReduceOptions opts(context);
  opts.setOutput(static_cast<E*>(tensor.data_ptr()), static_cast<size_t>(tensor.numel()));
  opts.setRoot(root);
  opts.setReduceFunction(fn);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  ::gloo::reduce(opts);
}

void ReduceTensor(const std::shared_ptr<::gloo::Context>& context, const at::Tensor& tensor,
                  int root, const ReduceFn& fn, std::chrono::milliseconds timeout, uint32_t tag) {
  switch (tensor.element_size()) {
    case 1: return ReduceAs<uint8_t>(context, tensor, root, fn, timeout, tag);
    case 2: return ReduceAs<uint16_t>(context, tensor, root, fn, timeout, tag);
    case 4: return ReduceAs<uint32_t>(context, tensor, root, fn, timeout, tag);
    case 8: return ReduceAs<uint64_t>(context, tensor, root, fn, timeout, tag);
    case 16: return ReduceAs<Elem16>(context, tensor, root, fn, timeout, tag);
    default:
      throw std::invalid_argument(absl::StrCat("unsupported element size ", tensor.element_size()));
  }
}

class GlooBackend final : public Backend {
 public:
  GlooBackend(BackendContext ctx, std::shared_ptr<::gloo::Context> context,
              std::unique_ptr<internal::ShmAllReduce> shm)
      : ctx_(std::move(ctx)),
        context_(std::move(context)),
        shm_(std::move(shm)),
        timeout_(Millis(ctx_.timeout)) {}

  ~GlooBackend() override { (void)Shutdown(absl::ZeroDuration()); }

  std::string name() const override { return "gloo"; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }

  WorkPtr AllReduce(const OpInfo& info, std::vector<at::Tensor> tensors, ReduceOp op) override {
    absl::StatusOr<ReduceFn> fn = internal::GetReduceFn(tensors[0].scalar_type(), op);
    if (!fn.ok()) return Failed(info, fn.status());
    return Collective(info,
                      [this, tensors = std::move(tensors), fn = *std::move(fn), op](uint32_t tag) {
                        if (tensors[0].numel() == 0) return;
                        if (shm_ != nullptr && tensors.size() == 1) {
                          // Every rank shares this host: one copy in, one fold, no sockets.
                          absl::Status s = shm_->Run(tensors[0], fn, absl::Now() + ctx_.timeout);
                          if (s.code() == absl::StatusCode::kDeadlineExceeded) {
                            throw internal::ShmTimeoutError(std::string(s.message()));
                          }
                          if (!s.ok()) throw std::runtime_error(std::string(s.message()));
                        } else {
                          AllReduceTensors(context_, tensors, fn, timeout_, tag);
                        }
                        if (op == ReduceOp::kAvg) {
                          for (const auto& t : tensors) t.div_(ctx_.size);
                        }
                      });
  }

  WorkPtr Broadcast(const OpInfo& info, std::vector<at::Tensor> tensors, int root) override {
    return Collective(info, [this, tensors = std::move(tensors), root](uint32_t tag) {
      const at::Tensor& first = tensors[0];
      const size_t nbytes = first.nbytes();
      if (nbytes == 0) return;
      ::gloo::BroadcastOptions opts(context_);
      opts.setOutput(Bytes(first), nbytes);
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::broadcast(opts);
      for (size_t i = 1; i < tensors.size(); ++i) {
        std::memcpy(tensors[i].data_ptr(), first.data_ptr(), nbytes);
      }
    });
  }

  WorkPtr Reduce(const OpInfo& info, std::vector<at::Tensor> tensors, int root,
                 ReduceOp op) override {
    absl::StatusOr<ReduceFn> fn = internal::GetReduceFn(tensors[0].scalar_type(), op);
    if (!fn.ok()) return Failed(info, fn.status());
    return Collective(
        info, [this, tensors = std::move(tensors), fn = *std::move(fn), root, op](uint32_t tag) {
          const at::Tensor& first = tensors[0];
          const size_t n = static_cast<size_t>(first.numel());
          if (n == 0) return;
          for (size_t i = 1; i < tensors.size(); ++i) {
            fn(first.data_ptr(), first.data_ptr(), tensors[i].data_ptr(), n);
          }
          ReduceTensor(context_, first, root, fn, timeout_, tag);
          if (op == ReduceOp::kAvg && ctx_.rank == root) first.div_(ctx_.size);
        });
  }

  WorkPtr AllGather(const OpInfo& info, std::vector<at::Tensor> outputs,
                    at::Tensor input) override {
    return Collective(info,
                      [this, outputs = std::move(outputs), input = std::move(input)](uint32_t tag) {
                        const size_t nbytes = input.nbytes();
                        if (nbytes == 0) return;
                        std::vector<uint8_t> flat(nbytes * ctx_.size);
                        ::gloo::AllgatherOptions opts(context_);
                        opts.setInput(Bytes(input), nbytes);
                        opts.setOutput(flat.data(), flat.size());
                        opts.setTag(tag);
                        opts.setTimeout(timeout_);
                        ::gloo::allgather(opts);
                        for (int r = 0; r < ctx_.size; ++r) {
                          std::memcpy(outputs[r].data_ptr(), flat.data() + r * nbytes, nbytes);
                        }
                      });
  }

  WorkPtr Gather(const OpInfo& info, std::vector<at::Tensor> outputs, at::Tensor input,
                 int root) override {
    return Collective(
        info, [this, outputs = std::move(outputs), input = std::move(input), root](uint32_t tag) {
          const size_t nbytes = input.nbytes();
          if (nbytes == 0) return;
          const bool is_root = ctx_.rank == root;
          std::vector<uint8_t> flat(is_root ? nbytes * ctx_.size : 0);
          ::gloo::GatherOptions opts(context_);
          opts.setInput(Bytes(input), nbytes);
          if (is_root) opts.setOutput(flat.data(), flat.size());
          opts.setRoot(root);
          opts.setTag(tag);
          opts.setTimeout(timeout_);
          ::gloo::gather(opts);
          if (!is_root) return;
          for (int r = 0; r < ctx_.size; ++r) {
            std::memcpy(outputs[r].data_ptr(), flat.data() + r * nbytes, nbytes);
          }
        });
  }

  WorkPtr Scatter(const OpInfo& info, at::Tensor output, std::vector<at::Tensor> inputs,
                  int root) override {
    return Collective(
        info, [this, output = std::move(output), inputs = std::move(inputs), root](uint32_t tag) {
          const size_t nbytes = output.nbytes();
          if (nbytes == 0) return;
          ::gloo::ScatterOptions opts(context_);
          if (ctx_.rank == root) {
            std::vector<uint8_t*> ptrs;
            for (const auto& t : inputs) ptrs.push_back(Bytes(t));
            opts.setInputs(ptrs, nbytes);
          }
          opts.setOutput(Bytes(output), nbytes);
          opts.setRoot(root);
          opts.setTag(tag);
          opts.setTimeout(timeout_);
          ::gloo::scatter(opts);
        });
  }

  WorkPtr ReduceScatter(const OpInfo& info, at::Tensor output, std::vector<at::Tensor> inputs,
                        ReduceOp op) override {
    absl::StatusOr<ReduceFn> fn = internal::GetReduceFn(output.scalar_type(), op);
    if (!fn.ok()) return Failed(info, fn.status());
    return Collective(info, [this, output = std::move(output), inputs = std::move(inputs),
                             fn = *std::move(fn), op](uint32_t tag) {
      const size_t nbytes = output.nbytes();
      if (nbytes == 0) return;
      // All-reduce of the concatenation, keeping this rank's chunk: simple
      // and exact; gloo has no reduce-scatter for unbound buffers.
      at::Tensor flat = at::empty({output.numel() * ctx_.size}, output.options());
      for (int r = 0; r < ctx_.size; ++r) {
        std::memcpy(Bytes(flat) + r * nbytes, inputs[r].data_ptr(), nbytes);
      }
      AllReduceTensors(context_, {flat}, fn, timeout_, tag);
      std::memcpy(output.data_ptr(), Bytes(flat) + ctx_.rank * nbytes, nbytes);
      if (op == ReduceOp::kAvg) output.div_(ctx_.size);
    });
  }

  WorkPtr AllToAll(const OpInfo& info, at::Tensor output, at::Tensor input) override {
    return Collective(info,
                      [this, output = std::move(output), input = std::move(input)](uint32_t tag) {
                        const size_t nbytes = input.nbytes();
                        if (nbytes == 0) return;
                        at::Tensor source = input;
                        if (input.data_ptr() == output.data_ptr()) source = input.clone();
                        ::gloo::AlltoallOptions opts(context_);
                        opts.setInput(Bytes(source), nbytes);
                        opts.setOutput(Bytes(output), nbytes);
                        opts.setTag(tag);
                        opts.setTimeout(timeout_);
                        ::gloo::alltoall(opts);
                      });
  }

  WorkPtr Barrier(const OpInfo& info) override {
    return Collective(info, [this](uint32_t tag) {
      ::gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::barrier(opts);
    });
  }

  WorkPtr Send(const OpInfo& info, at::Tensor tensor, int dst, uint32_t tag) override {
    return PointToPoint(info, std::move(tensor), dst, tag, /*send=*/true);
  }

  WorkPtr Recv(const OpInfo& info, at::Tensor tensor, int src, uint32_t tag) override {
    return PointToPoint(info, std::move(tensor), src, tag, /*send=*/false);
  }

  absl::Status Shutdown(absl::Duration timeout) override {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) return absl::OkStatus();
      shut_down_ = true;
    }
    const absl::Time deadline = absl::Now() + timeout;
    const bool collectives_done = collectives_.Drain(timeout);
    const bool p2p_done = p2p_.Drain(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!collectives_done || !p2p_done) {
      if (shm_ != nullptr) shm_->Abort();
      // Unblock what is still waiting; a collective stuck in the transport
      // ends when the connections close or at its own deadline.
      absl::flat_hash_set<std::shared_ptr<UnboundBuffer>> pending;
      {
        absl::MutexLock lock(&mu_);
        pending.swap(pending_p2p_);
      }
      for (const auto& buf : pending) {
        buf->abortWaitSend();
        buf->abortWaitRecv();
      }
      try {
        context_->closeConnections();
      } catch (const std::exception&) {
        // Already broken; nothing more to release.
      }
    }
    collectives_.Join();
    p2p_.Join();
    if (collectives_done && p2p_done) return absl::OkStatus();
    return absl::DeadlineExceededError(absl::StrCat("ops still running after ",
                                                    DurationText(timeout),
                                                    " were cancelled and the connections closed"));
  }

 private:
  WorkPtr Failed(const OpInfo& info, absl::Status status) {
    return Work::Completed(info.description, Annotate(status, info.description));
  }

  absl::Status Unusable(const OpInfo& info) {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      return absl::FailedPreconditionError(
          absl::StrCat(info.description, ": the group was destroyed"));
    }
    if (!abort_reason_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(info.description, ": the group was aborted earlier: ", abort_reason_));
    }
    return absl::OkStatus();
  }

  absl::Status Cancelled(const OpInfo& info) {
    return absl::CancelledError(
        absl::StrCat(info.description, ": cancelled because the group was destroyed"));
  }

  // Runs `body` on the collective thread, turning exceptions into a status.
  WorkPtr Collective(const OpInfo& info, std::function<void(uint32_t tag)> body) {
    absl::Status usable = Unusable(info);
    if (!usable.ok()) return Work::Completed(info.description, usable);
    auto work = std::make_shared<Work>(info.description);
    const bool queued =
        collectives_.Submit([this, info, work, body = std::move(body)](bool cancelled) {
          work->MarkCompleted(cancelled ? Cancelled(info)
                                        : Guarded(info, [&] { body(Tag(info.seq)); }));
        });
    if (!queued) work->MarkCompleted(Cancelled(info));
    return work;
  }

  WorkPtr PointToPoint(const OpInfo& info, at::Tensor tensor, int peer, uint32_t tag, bool send) {
    absl::Status usable = Unusable(info);
    if (!usable.ok()) return Work::Completed(info.description, usable);
    const std::string what =
        absl::StrCat(info.description, send ? " to rank " : " from rank ",
                     internal::RankText(peer, ctx_.global_ranks), " (tag ", tag, ")");
    if (tensor.nbytes() == 0) return Work::Completed(what, absl::OkStatus());
    std::shared_ptr<UnboundBuffer> buf;
    try {
      buf = context_->createUnboundBuffer(tensor.data_ptr(), tensor.nbytes());
      if (send) {
        buf->send(peer, P2PSlot(tag));
      } else {
        buf->recv(peer, P2PSlot(tag));
      }
    } catch (const std::exception& e) {
      return Work::Completed(what, absl::UnavailableError(absl::StrCat(what, ": ", e.what())));
    }
    {
      absl::MutexLock lock(&mu_);
      pending_p2p_.insert(buf);
    }
    auto work = std::make_shared<Work>(what);
    OpInfo p2p_info = info;
    p2p_info.description = what;
    const bool queued =
        p2p_.Submit([this, p2p_info, work, buf, send, tensor = std::move(tensor)](bool) {
          bool completed = false;
          absl::Status status = Guarded(p2p_info, [&] {
            completed = send ? buf->waitSend(timeout_) : buf->waitRecv(timeout_);
          });
          if (status.ok() && !completed) status = Cancelled(p2p_info);
          {
            absl::MutexLock lock(&mu_);
            pending_p2p_.erase(buf);
          }
          work->MarkCompleted(std::move(status));
        });
    if (!queued) work->MarkCompleted(Cancelled(p2p_info));
    return work;
  }

  absl::Status Guarded(const OpInfo& info, const std::function<void()>& body) {
    {
      absl::MutexLock lock(&mu_);
      if (!abort_reason_.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat(info.description, ": the group was aborted earlier: ", abort_reason_));
      }
    }
    absl::Status status;
    try {
      body();
      return absl::OkStatus();
    } catch (const internal::ShmTimeoutError& e) {
      status = TimedOut(info, e.what());
    } catch (const ::gloo::IoException& e) {
      const std::string what = e.what();
      if (absl::StrContains(what, "Timed out") || absl::StrContains(what, "timed out")) {
        status = TimedOut(info, what);
      } else {
        status = absl::UnavailableError(
            absl::StrCat(info.description, ": connection to a peer failed: ", what));
      }
    } catch (const std::exception& e) {
      // A bug or bad state inside gloo or ATen: the group cannot be trusted.
      status = absl::InternalError(absl::StrCat(info.description, ": ", e.what()));
    }
    absl::MutexLock lock(&mu_);
    if (abort_reason_.empty()) abort_reason_ = std::string(status.message());
    return status;
  }

  absl::Status TimedOut(const OpInfo& info, const std::string& what) {
    std::string who;
    if (info.seq >= 0) {
      const std::vector<int> missing =
          internal::MissingRanks(*ctx_.store, ctx_.prefix, info.seq, ctx_.rank, ctx_.size,
                                 std::min(ctx_.timeout, absl::Seconds(3)));
      who = missing.empty()
                ? "; every rank reached it (a peer may be slow or stuck)"
                : absl::StrCat("; ranks ", internal::RanksText(missing, ctx_.global_ranks),
                               " never arrived");
    }
    return absl::DeadlineExceededError(absl::StrCat(
        info.description, " (rank ", internal::RankText(ctx_.rank, ctx_.global_ranks), " of ",
        ctx_.size, "): timed out after ", DurationText(ctx_.timeout), who, " [gloo: ", what, "]"));
  }

  const BackendContext ctx_;
  const std::shared_ptr<::gloo::Context> context_;
  // Same-host all-reduce; null when the ranks are not all on this host.
  const std::unique_ptr<internal::ShmAllReduce> shm_;
  const std::chrono::milliseconds timeout_;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Set by the first timeout or transport error; later ops fail fast.
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::shared_ptr<UnboundBuffer>> pending_p2p_ ABSL_GUARDED_BY(mu_);

  // Declared last: their threads use the members above and are joined in
  // Shutdown (called by the destructor).
  internal::SerialExecutor collectives_;
  internal::SerialExecutor p2p_;
};

absl::StatusOr<std::unique_ptr<Backend>> CreateGloo(const BackendContext& ctx,
                                                    const GlooOptions& options) {
  const std::string where = absl::StrCat("gloo rendezvous of group '", ctx.group_name, "' (rank ",
                                         ctx.rank, " of ", ctx.size, ")");
  try {
    ::gloo::transport::tcp::attr attr;
    if (!options.interface.empty()) {
      attr.iface = options.interface;
    } else {
      attr.hostname = options.hostname;
    }
    std::shared_ptr<::gloo::transport::Device> device = ::gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<::gloo::rendezvous::Context>(ctx.rank, ctx.size);
    context->setTimeout(Millis(ctx.timeout));
    internal::GlooStore store(*ctx.store, ctx.prefix, ctx.timeout);
    context->connectFullMesh(store, device);
    auto shm = internal::ShmAllReduce::Create(ctx);
    if (!shm.ok()) return Annotate(shm.status(), where);
    return std::unique_ptr<Backend>(
        std::make_unique<GlooBackend>(ctx, std::move(context), *std::move(shm)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(where, ": ", e.what()));
  }
}

}  // namespace

BackendFactory GlooBackendFactory(GlooOptions options) {
  return [options = std::move(options)](const BackendContext& ctx) {
    return CreateGloo(ctx, options);
  };
}

}  // namespace baton::comm
