// ShmTransport: every message between two workers on the same host through
// shared memory, small calls included; gRPC stays the control plane and the
// transport between hosts (docs/wire_format.md, "Same-host transport").
//
// Layout:
// - Each process owns a *hub*, a small segment holding its doorbell: a futex
//   word that senders bump after writing, and a flag saying whether the
//   process's receiver thread sleeps on it.
// - Each pair of same-host workers shares one *link* segment with two
//   single-producer/single-consumer byte rings, one per direction. The lower
//   rank creates it at rendezvous and publishes its name; the higher rank
//   maps it, marks it opened and unlinks the name, so nothing is left in
//   /dev/shm once both sides mapped it (ShmChannel::Sweep() removes the
//   names of processes that died before).
//
// Guarantees:
// T1. Frames between two workers arrive whole, once, and in the order each
//     sender thread sent them. A frame larger than the ring is cut into
//     fragments that the receiver puts back together (large tensor blobs
//     normally travel in ShmChannel's bulk segments and never reach the
//     ring).
// T2. Waits are bounded: the receiver spins briefly (adaptively, at most
//     `spin`, yielding the CPU as it goes), then sleeps on
//     its doorbell with a 100 ms timeout; a sender waiting for ring space
//     gives up after `send_timeout` with UNAVAILABLE.
// T3. Peer death, even by SIGKILL, is noticed within about 100 ms (the
//     receiver polls a pidfd of every linked peer): the link is closed,
//     OnStreamClosed reports UNAVAILABLE naming the process, and later sends
//     to that peer fail, so the agent uses gRPC for it again (a restarted
//     incarnation rejoins over gRPC). A peer whose transport closed while
//     its process lives on (its agent shut down) is noticed the same way.
// T4. Memory per pair is 2 * ring_bytes plus 4 KiB of headers, in /dev/shm,
//     reserved when the link is created (base/shm_segment.h), so a full
//     /dev/shm means no link (gRPC carries the pair), never a SIGBUS.
// T5. When a linked peer's process is gone, the requests written to it
//     that it never read (past its final read position, so no part of them
//     reached its handler) are named to the handler with OnRequestsUnread
//     before OnStreamClosed: the agent may send them to the peer's
//     successor (docs/peer_failures.md, P8). A frame left half written (a
//     ring that stayed full mid-frame) closes the link, since nothing may
//     follow it.
//
// Thread-safety: Send() and the reply channels are safe from any thread
// (one mutex per outgoing ring); handler callbacks run on the transport's
// single receiver thread and must not block.
#ifndef BATON_RPC_TRANSPORT_SHM_SHM_TRANSPORT_H_
#define BATON_RPC_TRANSPORT_SHM_SHM_TRANSPORT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/shm_segment.h"
#include "rpc/channel/shm/shm_channel.h"
#include "rpc/internal/wire.h"
#include "rpc/transport.h"

namespace baton::rpc::internal {

struct ShmTransportOptions {
  size_t ring_bytes = size_t{256} << 10;
  // The receiver's longest spin before sleeping; it adapts between 2 us and
  // this: doubled when a spin found a frame, halved when it did not.
  absl::Duration spin = absl::Microseconds(100);
  absl::Duration send_timeout = absl::Seconds(30);
};

class ShmTransport : public ::baton::rpc::Transport {
 public:
  // Stream ids of links (OnStreamClosed) are kStreamBase + peer.
  static constexpr uint64_t kStreamBase = uint64_t{1} << 62;

  // Creates this process's hub. `world_size` bounds peer ids.
  static absl::StatusOr<std::unique_ptr<ShmTransport>> Create(ShmTransportOptions options, int rank,
                                                              int world_size,
                                                              TransportHandler* handler);
  ~ShmTransport() override;  // Close()

  const std::string& hub_name() const { return hub_name_; }

  // Rendezvous, lower rank: creates the link to `peer` and returns its name.
  absl::StatusOr<std::string> CreateLink(int peer, const std::string& peer_hub, pid_t peer_pid);
  // Rendezvous, higher rank: maps the link `peer` created and marks it opened.
  absl::Status OpenLink(int peer, const std::string& link, const std::string& peer_hub,
                        pid_t peer_pid);
  // After the rendezvous barrier: a link is used only if both sides mapped
  // it. Returns the peers linked; links the peer never opened are dropped,
  // and so are links to the peers in `superseded` (a process that died
  // during start-up and was replaced: its successor sets no link up).
  std::vector<int> Activate(const std::vector<int>& superseded = {});

  bool connected(int peer) const override;

  // Sends a request to `peer`; returns the link's stream id. UNAVAILABLE if
  // the link is closed or the ring stayed full for send_timeout.
  absl::StatusOr<uint64_t> Send(int peer, Frame frame) override;

  // Closes the link to `peer`, if any (its process was replaced by a new
  // incarnation, which sets no link up): calls on it fail with `cause`
  // (OnStreamClosed), and later sends go elsewhere.
  void Disconnect(int peer, const absl::Status& cause);

  // Stops the receiver and closes every link (pending frames are dropped).
  void Close();

  struct Stats {
    int64_t frames_sent = 0;
    int64_t frames_received = 0;
    int64_t sleeps = 0;  // receiver futex waits
  };
  Stats stats() const;

 private:
  struct Hub;
  struct Link;
  class Reply;

  ShmTransport(ShmTransportOptions options, int rank, int world_size, TransportHandler* handler);
  absl::Status Write(Link& link, Frame frame);
  void ReceiveLoop();
  // Drains every incoming ring once; true if any frame arrived.
  bool Poll();
  void CheckPeers();
  static bool PeerExited(const Link& link);
  // Marks the link closed (once) and tells the handler (NotifyClosed).
  void CloseLink(int peer, const absl::Status& cause);
  // For a link just marked closed: OnRequestsUnread (T5), then
  // OnStreamClosed. Takes the link's send_mu: not called under it.
  void NotifyClosed(Link& link, const absl::Status& cause);

  const ShmTransportOptions options_;
  const int rank_;
  TransportHandler* const handler_;
  // Held while this transport owns objects in /dev/shm (ShmChannel's S5).
  std::unique_ptr<LivenessMarker> alive_;
  std::string hub_name_;
  ShmSegment hub_segment_;
  Hub* hub_ = nullptr;  // in hub_segment_

  // Fixed after Activate(); a link's `closed` flag changes under its mutex.
  std::vector<std::shared_ptr<Link>> links_;  // by peer id; null when none
  std::vector<int> active_;

  std::atomic<bool> stop_{false};
  std::thread receiver_;
  std::atomic<int64_t> frames_sent_{0};
  std::atomic<int64_t> frames_received_{0};
  std::atomic<int64_t> sleeps_{0};
  absl::Mutex close_mu_;
  bool closed_ ABSL_GUARDED_BY(close_mu_) = false;
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_TRANSPORT_SHM_SHM_TRANSPORT_H_
