#include "rpc/internal/peer_path.h"

#include <utility>

namespace baton::rpc::internal {

PeerPath::PeerPath(int peer, Transport* network, ShmTransport* link, ShmChannel* bulk,
                   std::string bulk_prefix)
    : peer_(peer),
      network_(network),
      link_(link),
      bulk_(bulk),
      bulk_prefix_(std::move(bulk_prefix)),
      bulk_ok_(bulk != nullptr && !bulk_prefix_.empty()) {}

absl::StatusOr<uint64_t> PeerPath::Send(Frame frame) const {
  if (linked()) return link_->Send(peer_, std::move(frame));
  return network_->Send(peer_, std::move(frame));
}

void PeerPath::ExportBlobs(Frame& frame, absl::Time expiry) const {
  if (bulk()) bulk_->Export(frame, expiry);
}

absl::Status PeerPath::ImportBlobs(Frame& frame) const {
  if (frame.header.shm_blobs_size() == 0) return absl::OkStatus();
  if (bulk_ == nullptr) return absl::DataLossError("shared-memory blob without a channel");
  // Only the peer's own segments may be named (a hostile peer must not make
  // us map another process's memory); a peer without a probed path has
  // none we accept.
  return bulk_->Import(frame,
                       bulk_prefix_.empty() ? "/baton.no-segments-from-this-peer." : bulk_prefix_);
}

void PeerPath::LoseSameHost(const absl::Status& cause) {
  bulk_ok_.store(false, std::memory_order_relaxed);
  if (link_ != nullptr) link_->Disconnect(peer_, cause);
}

}  // namespace baton::rpc::internal
