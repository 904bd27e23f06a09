// Payload: an encoded message body. `bytes` is the codec's byte stream;
// `blobs` are raw tensor bytes that travel beside it without being copied
// into `bytes`.
//
// A Blob points at memory kept alive by `owner`: on the sending side the
// tensor itself, on the receiving side the gRPC slices it arrived in. A
// received blob may span several slices (`pieces`); the codec copies such a
// blob once, into the destination tensor.
//
// Thread-safety: plain values; a Blob's memory is read-only once shared.
#ifndef BATON_RPC_PAYLOAD_H_
#define BATON_RPC_PAYLOAD_H_

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace baton::rpc {

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

struct Blob {
  absl::InlinedVector<absl::Span<const char>, 1> pieces;
  std::shared_ptr<const void> owner;
  // The bytes were written by gRPC, on whichever thread polled the socket,
  // and reached baton through gRPC's own synchronization. Only
  // ThreadSanitizer builds look at it: gRPC is not instrumented, so TSan
  // would take every 8-byte word of the copy for a race with that write
  // (suppressed, tools/tsan_grpc_suppressions.txt, but TSan files each
  // reported address in a list it searches linearly: a 256 MiB tensor
  // then stalls the process for minutes). The copy is not checked.
  bool written_by_grpc = false;

  size_t size() const {
    size_t n = 0;
    for (const auto& p : pieces) n += p.size();
    return n;
  }
  // Contiguous memory, or nullptr if the blob spans several pieces.
  const char* contiguous() const {
    if (pieces.empty()) return nullptr;
    return pieces.size() == 1 ? pieces[0].data() : nullptr;
  }
  void CopyTo(void* dst) const {
#if defined(__SANITIZE_THREAD__)
    if (written_by_grpc) AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
    char* out = static_cast<char*>(dst);
    for (const auto& p : pieces) {
      if (!p.empty()) std::memcpy(out, p.data(), p.size());
      out += p.size();
    }
#if defined(__SANITIZE_THREAD__)
    if (written_by_grpc) AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
  }
};

// The most reply notes (rpc/function.h) one reply carries; a receiver
// refuses a frame header that lists more (DATA_LOSS).
inline constexpr size_t kMaxReplyNotes = 1024;

// The most connections (lanes) of the network bulk channel per peer pair,
// and so the most slices one blob is cut into there
// (rpc/channel/tcp/bulk_channel.h, B10); a frame header listing more
// bulk-channel entries than this per blob is refused (DATA_LOSS).
inline constexpr int kMaxBulkLanes = 8;

struct Payload {
  std::string bytes;
  std::vector<Blob> blobs;
  // Per-message data of protocol layers (call hooks), carried in
  // FrameHeader.extensions.
  std::map<std::string, std::string> extensions;
  // Local to the sender, never sent: what to undo if the message is known
  // not to have been decoded by its destination (RRef forks made while
  // encoding it, rref/rref_context.h G8). The agent runs them when a call
  // fails before its request left, when the callee refused the request
  // before running its function, or when a reply could not be sent.
  // Running them twice is harmless.
  std::vector<std::function<void()>> undo_if_undelivered;

  // Runs and clears undo_if_undelivered.
  void Undeliverable() {
    std::vector<std::function<void()>> undo;
    undo.swap(undo_if_undelivered);
    for (auto& f : undo) f();
  }

  size_t total_size() const {
    size_t n = bytes.size();
    for (const auto& b : blobs) n += b.size();
    return n;
  }
};

}  // namespace baton::rpc

#endif  // BATON_RPC_PAYLOAD_H_
