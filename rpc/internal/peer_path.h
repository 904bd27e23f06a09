// PeerPath: how messages to one peer travel. The agent keeps one per peer
// and asks it, instead of deciding inline at every send:
// - frames go over the same-host link (rpc/transport/shm) while it is
//   connected, else over the network transport (rpc/transport/grpc, or the
//   loopback fake in tests);
// - large tensor blobs take the same-host bulk channel (rpc/channel/shm)
//   toward a peer that opened this worker's probe at rendezvous (S4), and
//   only blobs in that peer's own segments are accepted from it.
// The transports and the channel are the agent's collaborators; a path only
// borrows them (they outlive it).
//
// Contract:
// - Send() returns the stream id the frame left on, or the transport's
//   error (UNAVAILABLE: the peer cannot be reached that way).
// - ExportBlobs() moves a frame's large blobs into segments when bulk() and
//   leaves them on the frame otherwise; ImportBlobs() maps what a frame from
//   this peer lists, and is DATA_LOSS for a frame that lists segments when
//   this worker has no bulk channel, or segments that are not the peer's.
// - LoseSameHost() is for a peer replaced by a new incarnation, which opened
//   none of our probes and keeps no link: bulk() turns false, and the link,
//   if any, closes with `cause` (its pending calls fail with it).
//
// Thread-safety: every method may be called from any thread.
#ifndef BATON_RPC_INTERNAL_PEER_PATH_H_
#define BATON_RPC_INTERNAL_PEER_PATH_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/channel/shm/shm_channel.h"
#include "rpc/internal/wire.h"
#include "rpc/transport.h"
#include "rpc/transport/shm/shm_transport.h"

namespace baton::rpc::internal {

class PeerPath {
 public:
  // `link` and `bulk` may be null (no same-host transport or channel);
  // `bulk_prefix` is the peer's segment prefix, empty when the peer did not
  // open our probe (then bulk() is false).
  PeerPath(int peer, Transport* network, ShmTransport* link, ShmChannel* bulk,
           std::string bulk_prefix);
  PeerPath(const PeerPath&) = delete;
  PeerPath& operator=(const PeerPath&) = delete;

  int peer() const { return peer_; }
  bool linked() const { return link_ != nullptr && link_->connected(peer_); }
  bool bulk() const { return bulk_ok_.load(std::memory_order_relaxed); }

  absl::StatusOr<uint64_t> Send(Frame frame) const;
  void ExportBlobs(Frame& frame, absl::Time expiry) const;
  absl::Status ImportBlobs(Frame& frame) const;
  void LoseSameHost(const absl::Status& cause);

 private:
  const int peer_;
  Transport* const network_;
  ShmTransport* const link_;
  ShmChannel* const bulk_;
  const std::string bulk_prefix_;
  std::atomic<bool> bulk_ok_;
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_PEER_PATH_H_
