// Outbox: the write queue of one stream of the gRPC network transport
// (grpc_transport.cc); private to this package. It serializes writes on the
// stream and coalesces queued frames into one write of up to 1 MiB (a
// single larger frame goes alone).
//
// Exactly one thread at a time holds the "writer" role (writing_ == true) and
// may touch current_ and call start_write_. on_idle_close_ runs exactly once,
// when the outbox is closed and no write is in flight; after it, no write
// starts, so the reactor may finish.
//
// Reads can be paused while too much waits (PauseReadsIfOver); `resume_reads`
// restarts them from OnWriteDone, only while a next write is starting, so
// writing_ stays true and on_idle_close_ (which finishes the stream) cannot
// run concurrently with it.
//
// Thread-safety: every method may be called from any thread; the callbacks
// run without the outbox's lock held.
#ifndef BATON_RPC_TRANSPORT_GRPC_OUTBOX_H_
#define BATON_RPC_TRANSPORT_GRPC_OUTBOX_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace baton::rpc::internal {

class Outbox {
 public:
  Outbox(std::function<void(const grpc::ByteBuffer*)> start_write,
         std::function<void()> on_idle_close, std::function<void()> resume_reads = nullptr)
      : start_write_(std::move(start_write)),
        on_idle_close_(std::move(on_idle_close)),
        resume_reads_(std::move(resume_reads)) {}

  // Queues a frame of `bytes` bytes; false once closed.
  bool Send(std::vector<grpc::Slice> slices, size_t bytes);
  // The stream's write finished (`ok`: it succeeded; else the outbox closes).
  void OnWriteDone(bool ok);
  // True (and reads count as paused) if more than `limit` bytes wait behind
  // the write in flight; the caller then does not start its next read.
  bool PauseReadsIfOver(size_t limit);
  void Close();

 private:
  void BuildLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Item {
    std::vector<grpc::Slice> slices;
    size_t bytes;
  };
  const std::function<void(const grpc::ByteBuffer*)> start_write_;
  const std::function<void()> on_idle_close_;
  const std::function<void()> resume_reads_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // in queue_, not yet in a write
  bool reads_paused_ ABSL_GUARDED_BY(mu_) = false;
  size_t pause_limit_ ABSL_GUARDED_BY(mu_) = 0;  // of the last pause
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool idle_closed_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer current_;  // owned by the writer role
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_TRANSPORT_GRPC_OUTBOX_H_
