// The NCCL backend: collectives on CUDA tensors (CUDA 13 + NCCL), compiled
// only in the CUDA build (see comm/README.md; the default CPU build never
// includes this file).
//
//   auto pg = ProcessGroup::Create(store, rank, world, NcclBackendFactory());
//
// Contract:
//  - One NCCL communicator per device set: an op on tensors of devices
//    {d0, d1, ...} (one tensor per device, the *_multigpu pattern) uses the
//    communicator of that set, created on first use with the unique id that
//    group rank 0 publishes through the store. Ranks must use the same device
//    set for the same op.
//  - Ops run on the backend's own stream per device. Each op first waits (an
//    event, not the host) for the caller's current stream on that device, so
//    it sees the inputs. Tensors are recorded on the NCCL stream for the
//    caching allocator, and the backend holds them until the op's end event
//    has fired.
//  - Completion: a completion thread waits on the oldest op's end events
//    (cudaEventSynchronize) and completes its Work the moment they fire, in
//    issue order. Nothing polls for completion. While ops are in flight that
//    thread spins in the CUDA driver (the default scheduling on a host with
//    more cores than GPUs), as torch.cuda.synchronize() does.
//  - A watchdog thread handles errors and deadlines only: while ops are in
//    flight it checks ncclCommGetAsyncError and the oldest op's deadline
//    every NcclOptions::poll_interval. An asynchronous NCCL error or a missed
//    deadline aborts the communicators (ncclCommAbort), fails every op in
//    flight (naming missing ranks on a timeout) and every later op.
//  - Errors carry NCCL's own text (ncclGetLastError) after the result code:
//    UNAVAILABLE "issuing the op: NCCL error 4 (invalid argument): ...".
//  - Reduce ops: sum, product, min, max, avg (float types; ncclAvg). Dtypes:
//    float16/32/64, bfloat16, int8, uint8, int32, int64, bool (as uint8; sum
//    and max mean "or"). int16 and complex are rejected.
//  - send/recv go through the single-device communicator and NCCL matches
//    them in issue order per peer: the tag is checked by nobody, so issue them
//    in the same order on both sides.
//  - One GPU per rank on one host: NCCL refuses two ranks on one device.
//
// Thread-safety: see ProcessGroup and Backend.
#ifndef BATON_COMM_NCCL_BACKEND_H_
#define BATON_COMM_NCCL_BACKEND_H_

#include "absl/time/time.h"
#include "comm/backend.h"

namespace baton::comm {

struct NcclOptions {
  // How often the watchdog checks the ops in flight for asynchronous NCCL
  // errors and missed deadlines (completion does not wait for it).
  absl::Duration poll_interval = absl::Milliseconds(1);
};

BackendFactory NcclBackendFactory(NcclOptions options = {});

}  // namespace baton::comm

#endif  // BATON_COMM_NCCL_BACKEND_H_
