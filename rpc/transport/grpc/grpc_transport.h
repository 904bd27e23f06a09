// GrpcTransport: baton's calls over gRPC (rpc/transport.h's interface).
//
// Each worker runs one gRPC server with a single generic bidirectional
// method (kStreamMethod). A caller opens one long-lived stream to each peer it
// calls; requests go out on it and responses come back on it. Calls are told
// apart by request id, so one stream carries any number of concurrent calls.
//
// Contract:
// - Every incoming stream must carry the job token in its metadata, else it
//   is finished with UNAUTHENTICATED before any frame is read.
// - An outgoing stream presents the identity its peer was added with
//   (metadata kIdentityMetadataKey). An incoming one reads no frame before
//   the handler's AuthenticateStream answers; an error there finishes the
//   stream with it, and a request claiming another caller id than the one
//   the stream is bound to finishes it with PERMISSION_DENIED.
// - An accepted incoming stream sends its initial metadata before it reads
//   a frame; an outgoing stream that ends without having received them
//   (refused, or its peer not listening) is reported with OnStreamRefused:
//   the peer read none of its frames.
// - Frames queued while a write is in flight are coalesced into one packet
//   (at most kCoalesceBytes unless a single frame is larger).
// - When an outgoing stream ends (peer died, unreachable, rejected token),
//   the handler hears OnStreamClosed with the stream's id and the cause; the
//   next send opens a new stream.
// - Shutdown: CloseStreams() half-closes (or cancels) outgoing streams and
//   waits, bounded, for them to end; StopServer() stops accepting and cancels
//   what is left after the grace period.
// - The destructor releases the gRPC channels only after every outgoing
//   stream object is gone (bounded; past the bound it keeps them, never
//   releasing them). gRPC 1.51 runs reactions on the threads of one
//   process-wide completion queue ("nexting_thread"), and whoever drops the
//   last channel or server shuts that queue down and joins its threads: done
//   on one of those threads, it deletes the queue under its own feet (the
//   process aborts in grpc_cq_internal_unref, "prior > 0"). So no gRPC object
//   of the transport is ever released on a reaction thread.
//
// Threads: handler callbacks run on gRPC's callback threads and must not
// block. Send* may be called from any thread.
#ifndef BATON_RPC_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
#define BATON_RPC_TRANSPORT_GRPC_GRPC_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/channel/tcp/bulk_channel.h"
#include "rpc/internal/wire.h"
#include "rpc/transport.h"

namespace baton::rpc::internal {

using ::baton::rpc::ReplyChannel;
using ::baton::rpc::TransportHandler;

class Outbox;
class ClientStream;
class ClientStreamLifetimes;

using TransportOptions = ::baton::rpc::NetworkTransportOptions;

// The metadata an outgoing stream presents its identity in.
inline constexpr char kIdentityMetadataKey[] = "x-baton-identity";

class GrpcTransport : public ::baton::rpc::NetworkTransport {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Start(TransportOptions options,
                                                              TransportHandler* handler);
  ~GrpcTransport() override;

  // host:port actually bound.
  const std::string& address() const override { return address_; }

  // Declares where peer `id` listens and what its streams present there.
  // Must precede sends to it. Another address or identity for a known peer
  // retires its stream and channel (kept until the stream ends, and closed
  // by CloseStreams).
  void AddPeer(int id, const std::string& address, const std::string& identity) override;
  void ResetPeer(int peer) override;

  // Every peer added (a new stream opens on demand).
  bool connected(int peer) const override;
  // Sends a request packet to `peer`; returns the id of the stream used.
  // UNAVAILABLE if the stream could not take it (closing).
  absl::StatusOr<uint64_t> Send(int peer, Frame frame) override;

  // Ends every outgoing stream (half-close, or cancel if `cancel`) and waits
  // at most `timeout` for them to finish.
  absl::Status CloseStreams(bool cancel, absl::Duration timeout) override;
  void StopServer(absl::Duration grace) override;

  int live_streams() const override;

  // The bulk channel (NetworkTransportOptions::bulk_channel, off under TLS).
  std::string bulk_address() const override { return bulk_ == nullptr ? "" : bulk_->address(); }
  void AddBulkPeer(int id, const std::string& bulk_address) override;

 private:
  class Service;
  struct Peer {
    std::string address;
    std::string identity;
    // Made by the first stream to the peer; null until then.
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<grpc::GenericStub> stub;
    std::shared_ptr<ClientStream> stream;
    // The last stream ended in silence (IsSilence): the next one waits for
    // the link (gRPC's wait-for-ready) until accepted or ResetPeer().
    bool silent = false;
  };

  GrpcTransport(TransportOptions options, TransportHandler* handler);
  void OnClientStreamDone(int peer, uint64_t stream_id, const absl::Status& s, bool accepted);

  const TransportOptions options_;
  TransportHandler* const handler_;
  std::unique_ptr<Service> service_;
  // Large blobs beside the streams (rpc/channel/tcp/bulk_channel.h); closed
  // before the streams and the server stop.
  std::unique_ptr<BulkChannel> bulk_;

  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  mutable absl::Mutex mu_;
  // Outlives the transport: the streams' done callbacks and deleters report
  // to it.
  const std::shared_ptr<ClientStreamLifetimes> lifetimes_;
  absl::flat_hash_map<int, Peer> peers_ ABSL_GUARDED_BY(mu_);
  // What AddPeer replaced: at most one per restart of a peer.
  std::vector<Peer> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t next_stream_id_ ABSL_GUARDED_BY(mu_) = 1;
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_TRANSPORT_GRPC_GRPC_TRANSPORT_H_
