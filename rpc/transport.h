// Transport: how the agent's frames travel between workers, as an interface
// (no gRPC here). Implementations, in rpc/internal/:
// - GrpcTransport: one long-lived gRPC bidirectional stream per peer; the
//   control plane and the transport between hosts;
// - ShmTransport: shared-memory rings between workers of one host, for every
//   message.
// The agent (rpc/agent.h) keeps one of each and picks per peer: a peer with
// a live shared-memory link gets frames through it, every other through
// gRPC.
//
// Contract of an implementation:
// - Send() hands one request frame to the peer, or returns an error
//   (UNAVAILABLE: the peer cannot be reached through it); the returned id
//   names the stream (or link) it went on.
// - Incoming frames reach the TransportHandler: requests with the channel
//   their reply must go back on, responses with the peer they came from.
// - When a stream or link to a peer ends (the peer died, was unreachable, or
//   refused the token), OnStreamClosed names it and the cause, once; calls
//   pending on it are the handler's to fail.
// - Frames from one sender thread to one peer arrive in order.
//
// Thread-safety: Send() and ReplyChannel::Send() may be called from any
// thread. Handler callbacks run on the transport's threads and must not
// block.
#ifndef BATON_RPC_TRANSPORT_H_
#define BATON_RPC_TRANSPORT_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/rpc.pb.h"
#include "rpc/payload.h"

namespace baton::rpc {

// One call or reply: the header (docs/wire_format.md) and its payload.
struct Frame {
  proto::FrameHeader header;
  Payload payload;
};

// Where a request's reply goes: the stream or link it came in on.
class ReplyChannel {
 public:
  virtual ~ReplyChannel() = default;
  // False if the stream is gone (the caller has failed the call already).
  virtual bool Send(Frame frame) = 0;
};

class TransportHandler {
 public:
  virtual ~TransportHandler() = default;
  virtual void OnRequest(std::shared_ptr<ReplyChannel> channel, Frame frame) = 0;
  virtual void OnResponse(int peer, Frame frame) = 0;
  virtual void OnStreamClosed(int peer, uint64_t stream_id, const absl::Status& cause) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Whether frames to `peer` can go through this transport now.
  virtual bool connected(int peer) const = 0;
  virtual absl::StatusOr<uint64_t> Send(int peer, Frame frame) = 0;
};

}  // namespace baton::rpc

#endif  // BATON_RPC_TRANSPORT_H_
