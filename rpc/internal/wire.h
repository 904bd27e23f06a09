// Framing of calls on the per-peer gRPC stream (see docs/wire_format.md).
//
// A packet (one gRPC message) holds one or more frames; the sender coalesces
// frames that queued while a write was in flight. Blob bytes are appended as
// slices that point at the tensors' memory (no copy); on receipt, blobs
// reference the received slices.
//
// Thread-safety: stateless functions.
#ifndef BATON_RPC_INTERNAL_WIRE_H_
#define BATON_RPC_INTERNAL_WIRE_H_

#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/status.h"
#include "proto/rpc.pb.h"
#include "rpc/payload.h"
#include "rpc/transport.h"

namespace baton::rpc::internal {

using ::baton::rpc::Frame;

// The gRPC method that carries baton's streams.
inline constexpr char kStreamMethod[] = "/baton.Rpc/Stream";

// Serializes `frame` (filling payload_size and blob_sizes) and appends its
// slices to `out`. Returns the number of bytes appended.
size_t AppendFrame(Frame frame, std::vector<grpc::Slice>* out);

// Bytes that AppendFrame would produce, for size-limit checks.
size_t FrameSize(const Frame& frame);

// Who wrote a packet's bytes: gRPC (received from a socket) or baton itself
// (the shared-memory transport's rings). Marks the blobs (Blob::written_by_grpc).
enum class PacketSource { kGrpc, kBaton };

// Splits a received packet into frames. DATA_LOSS if it is malformed.
absl::Status ParsePacket(grpc::ByteBuffer* packet, PacketSource source, std::vector<Frame>* out);

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_WIRE_H_
