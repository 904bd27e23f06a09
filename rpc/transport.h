// Transport: how the agent's frames travel between workers, as an interface
// (no gRPC here). Implementations, in rpc/internal/:
// - GrpcTransport: one long-lived gRPC bidirectional stream per peer; the
//   control plane and the transport between hosts;
// - ShmTransport: shared-memory rings between workers of one host, for every
//   message.
// - LoopbackTransport (testing/rpc/, test-only): agents of one process, with
//   hooks that delay, drop, reorder and kill a peer's messages.
// The agent (rpc/agent.h) keeps one network transport (gRPC, or the one a
// test injects through AgentCollaborators) and, on one host, the
// shared-memory transport, and picks per peer: a peer with a live
// shared-memory link gets frames through it, every other through the
// network transport.
//
// Contract of an implementation:
// - Send() hands one request frame to the peer, or returns an error
//   (UNAVAILABLE: the peer cannot be reached through it); the returned id
//   names the stream (or link) it went on.
// - Incoming frames reach the TransportHandler: requests with the channel
//   their reply must go back on, responses with the peer they came from.
// - When a stream or link to a peer ends (the peer died, was unreachable, or
//   refused the token), OnStreamClosed names it and the cause, once; calls
//   pending on it are the handler's to fail. A network transport that knows
//   the peer read nothing of the stream says OnStreamRefused instead; one
//   that knows which requests a dead peer never read names them with
//   OnRequestsUnread just before OnStreamClosed. When a peer's incoming
//   stream is cancelled (not closed cleanly), OnPeerLost names the peer.
// - Frames from one sender thread to one peer arrive in order, except that
//   a frame whose blobs travel on a network transport's bulk channel
//   arrives once they did, and later frames may pass it
//   (rpc/channel/tcp/bulk_channel.h, B4).
// - A stream's end says why (IsSilence below): silence (no answer within a
//   time: a network partition or a hung host) or an answer that the peer is
//   gone (refused, reset or closed). After a stream to a peer ended in
//   silence, the next stream to it waits for the link to come back, and
//   frames sent meanwhile are delivered once it does (or fail with their
//   calls' deadlines), until ResetPeer() gives the peer up.
//
// Thread-safety: Send() and ReplyChannel::Send() may be called from any
// thread. Handler callbacks run on the transport's threads and must not
// block.
#ifndef BATON_RPC_TRANSPORT_H_
#define BATON_RPC_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/log.h"
#include "base/tls.h"
#include "proto/rpc.pb.h"
#include "rpc/payload.h"

namespace baton::rpc {

// One call or reply: the header (docs/wire_format.md) and its payload.
struct Frame {
  proto::FrameHeader header;
  Payload payload;
};

// Whether a stream's or call's failure is silence: the peer did not answer
// in time (DEADLINE_EXCEEDED; UNAVAILABLE from a connection that timed out
// or a route that is gone), which a network partition or a hung host
// causes, as opposed to an answer that the peer is gone (a refused or
// reset connection, a closed stream). Only the latter proves a death
// (docs/peer_failures.md, "Partitions").
inline bool IsSilence(const absl::Status& s) {
  if (absl::IsDeadlineExceeded(s)) return true;
  if (!absl::IsUnavailable(s)) return false;
  const std::string m = absl::AsciiStrToLower(s.message());
  for (const char* mark : {"timed out", "timeout", "no route to host", "network is unreachable",
                           "host is down", "keepalive"}) {
    if (absl::StrContains(m, mark)) return true;
  }
  return false;
}

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
  // Evidence that `peer` may have died although no stream of ours to it
  // ended: its incoming stream was cancelled, or its process is gone. Not a
  // verdict: the agent confirms it (Runtime::AddPeerFailureListener).
  virtual void OnPeerLost(int /*peer*/, const absl::Status& /*cause*/) {}
  // An outgoing stream ended before the peer accepted it: the peer read no
  // frame of it (no process listened, or it refused the stream before
  // reading), so every request sent on it is known undelivered. The
  // default treats it as OnStreamClosed.
  virtual void OnStreamRefused(int peer, uint64_t stream_id, const absl::Status& cause) {
    OnStreamClosed(peer, stream_id, cause);
  }
  // The stream or link `stream_id` to `peer` is ending because the peer's
  // process is gone, and the requests `ids` (their header ids) were provably
  // never read by it: no part of them reached its handler. Called once,
  // just before OnStreamClosed for the same stream, which concerns the
  // requests not named here. The default does nothing (OnStreamClosed then
  // fails them as maybe delivered).
  virtual void OnRequestsUnread(int /*peer*/, uint64_t /*stream_id*/,
                                const std::vector<uint64_t>& /*ids*/,
                                const absl::Status& /*cause*/) {}
  // An incoming network stream opened, presenting `identity` (what its
  // opener's transport was given with AddPeer; empty if none). No frame of
  // it is read before `done` runs, once, from any thread: with the caller
  // id the stream is bound to (every request on it must claim that id), -1
  // to bind it to the id its first request claims, or an error that ends
  // the stream with it. The default binds to the first request's id.
  virtual void AuthenticateStream(absl::string_view /*identity*/,
                                  std::function<void(absl::StatusOr<int>)> done) {
    done(-1);
  }
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Whether frames to `peer` can go through this transport now.
  virtual bool connected(int peer) const = 0;
  virtual absl::StatusOr<uint64_t> Send(int peer, Frame frame) = 0;
};

// The transport a worker registers an address for: it serves incoming
// streams from the start and reaches peers by the addresses they
// registered.
// - AddPeer() precedes sends to a peer; a stream opens on demand and
//   presents `identity` to the peer (TransportHandler::AuthenticateStream
//   there). Adding a peer again with another address or identity (a
//   restarted worker that rejoined) sends new messages on a new stream; the
//   old one ends on its own.
// - CloseStreams() ends the outgoing streams (half-close, or cancel) and
//   waits at most `timeout` for them to end; StopServer() stops accepting
//   and cancels what is left after `grace`. Neither blocks past its bound.
class NetworkTransport : public Transport {
 public:
  // Where peers reach this worker (e.g. host:port).
  virtual const std::string& address() const = 0;
  virtual void AddPeer(int id, const std::string& address, const std::string& identity) = 0;
  // The agent gave `peer` up (it stayed silent past the partition
  // tolerance): a stream waiting for the link to it ends now (its calls
  // fail), and the next one does not wait.
  virtual void ResetPeer(int /*peer*/) {}
  virtual absl::Status CloseStreams(bool cancel, absl::Duration timeout) = 0;
  virtual void StopServer(absl::Duration grace) = 0;
  virtual int live_streams() const = 0;
  // Where its bulk channel for large blobs listens, "" without one
  // (rpc/channel/tcp/bulk_channel.h); the agent publishes it.
  virtual std::string bulk_address() const { return ""; }
  // Where peer `id`'s bulk channel listens (after AddPeer).
  virtual void AddBulkPeer(int /*id*/, const std::string& /*bulk_address*/) {}
};

struct NetworkTransportOptions {
  std::string listen_address;  // host:port; port 0 picks one
  std::string job_token;       // every incoming stream must carry it
  int64_t max_message_bytes = 0;
  TlsConfig tls;  // mutual TLS (base/tls.h); empty: plain text
  // How long a connection outlives silence (BatonChannelArguments): the
  // agent's partition tolerance.
  absl::Duration silence_timeout = absl::Seconds(30);
  // Blobs of at least bulk_min_bytes go through a TCP connection of their
  // own beside the stream (rpc/channel/tcp/bulk_channel.h; TLS under TLS).
  bool bulk_channel = false;
  size_t bulk_min_bytes = size_t{1} << 18;
  int bulk_lanes = 2;  // connections per peer (B10)
  Logger log;          // base/log.h; default: stderr
};

// Starts a network transport that delivers to `handler` (the agent).
using NetworkTransportFactory = std::function<absl::StatusOr<std::unique_ptr<NetworkTransport>>(
    const NetworkTransportOptions& options, TransportHandler* handler)>;

}  // namespace baton::rpc

#endif  // BATON_RPC_TRANSPORT_H_
