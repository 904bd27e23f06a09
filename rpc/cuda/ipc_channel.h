// CudaIpcChannel: CUDA tensors between worker processes of one host through
// CUDA IPC, with no host copy (docs/cuda.md). CUDA builds only
// (CMakeLists.txt, BATON_CUDA; Bazel target //rpc/cuda:ipc_channel in the
// CUDA configuration); elsewhere CUDA tensors travel through host memory.
//
//   auto channel = rpc::cuda::CudaIpcChannel::Install(*registry);  // every worker
//   AgentCollaborators collaborators;
//   collaborators.cuda_channel = channel;
//   auto agent = RpcAgent::Create(options, registry, std::move(collaborators));
//   channel->Attach(agent->get());
//
// The agent uses it toward other processes on its host (same boot id and PID
// namespace); a tensor smaller than Options::min_bytes goes through the host
// instead. The protocol:
//  I1 Export: the sender records an interprocess event on the current stream
//     of the tensor's device (after the work that produced it), and sends the
//     IPC handle of the tensor's allocation, the tensor's offset in it, the
//     event's IPC handle and a token. It keeps the tensor and the event under
//     the token: the memory stays out of the caching allocator meanwhile.
//  I2 Import: the receiver maps the allocation (cudaIpcOpenMemHandle;
//     mappings are cached per sender, at most Options::max_mappings of them,
//     least recently used closed first), makes the decoding thread's current
//     stream wait for the event, and queues there a copy of the bytes into
//     memory of its own. The decode returns without waiting for the copy
//     (Options::stream_ordered): the tensor it hands on owns its memory, and
//     its values are ready in that stream's order. That stream is the
//     device's default stream unless the program made another one current;
//     work on another stream must wait for it first
//     (torch.cuda.current_stream().wait_stream(...), as for any tensor
//     produced on another stream).
//  I3 Release: once the copy has run (an event after it, polled by the
//     channel's watcher thread), the receiver sends the token back
//     (baton.cuda_ipc.release); the sender drops the tensor and returns the
//     event to its pool. A graceful shutdown sends the releases of copies
//     still running before it drains (Runtime::ShutdownHook).
//  I4 A peer found dead (Runtime::AddPeerFailureListener) releases every
//     token held for it and closes its mappings: a dead receiver leaves no
//     device memory held on the sender.
//  I5 Destruction releases whatever is still held.
//  I6 The copy's memory comes from the decoding thread's current stream, and
//     the copy waits for the work queued there first: memory the caching
//     allocator hands out again is never overwritten under a kernel still
//     reading the tensor that had it.
// Errors: CUDA failures are INTERNAL naming the CUDA call and the peer; a
// malformed descriptor is DATA_LOSS.
//
// Thread-safety: thread-safe; Install and Attach once, before and right
// after the agent's Create.
#ifndef BATON_RPC_CUDA_IPC_CHANNEL_H_
#define BATON_RPC_CUDA_IPC_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "rpc/agent.h"
#include "rpc/codec.h"

namespace baton::rpc::cuda {

class CudaIpcChannel final : public CudaTensorChannel,
                             public std::enable_shared_from_this<CudaIpcChannel> {
 public:
  struct Options {
    // Tensors smaller than this go through the host.
    size_t min_bytes = 0;
    // Allocations of other processes kept mapped, per sender.
    size_t max_mappings = 64;
    // false: the decode waits on the host for each copy before it returns
    // (and releases at once), for programs that use received tensors on a
    // stream other than the decoding thread's current one without waiting.
    bool stream_ordered = true;
  };

  // Registers the release function; call on every worker before Create.
  static std::shared_ptr<CudaIpcChannel> Install(FunctionRegistry& registry, Options options);
  static std::shared_ptr<CudaIpcChannel> Install(FunctionRegistry& registry) {
    return Install(registry, Options());
  }
  ~CudaIpcChannel() override;

  // The agent it sends releases through; right after Create.
  void Attach(RpcAgent* agent);

  bool Wants(size_t bytes) const override;
  absl::Status Export(const at::Tensor& tensor, int peer, Encoder& enc) override;
  absl::StatusOr<at::Tensor> Import(Decoder& dec, int peer, int device,
                                    const std::vector<int64_t>& sizes,
                                    c10::ScalarType dtype) override;

  // Exported tensors not yet released, and their bytes (I1, I3, I4).
  size_t held() const;
  int64_t held_bytes() const;

  class Impl;

 private:
  explicit CudaIpcChannel(Options options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::rpc::cuda

#endif  // BATON_RPC_CUDA_IPC_CHANNEL_H_
