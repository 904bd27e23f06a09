// BulkChannel: large tensor blobs between workers over a dedicated TCP
// connection per ordered pair of workers, beside the gRPC stream that keeps
// carrying their frames (docs/wire_format.md, "Network bulk channel"). The
// gRPC transport (rpc/transport/grpc/grpc_transport.h) owns one.
//
// Protocol:
// B1. Each worker listens on a port of its own (address(), published at
//     rendezvous). A sender opens `lanes` connections (B10) to each peer it
//     sends a large blob to, in the background, on its first such send;
//     until a connection is up (B2), blobs stay on the stream. Each lane is
//     a connection of its own with its own transfer ids: B2-B9 hold per
//     lane.
// B2. The connection opens with a hello: magic, version, the job token,
//     the sender's stream identity (the one its gRPC streams to that peer
//     present), its lane and the first transfer id it will carry (B7). The receiver reads nothing
//     more before the token matches and the identity proves a worker (the transport's stream
//     authenticator); otherwise it closes the connection. It then binds the connection to that
//     worker and answers one byte; only then does the sender use it.
// B3. A blob is a record: transfer id (u64, increasing per sender, peer
//     and lane), size (u64), stripe, offset and total (u64 each, B10; 0, 0
//     and the size for a whole blob), then its bytes, written from the
//     tensor's own memory. The frame that carries it lists {index, id, size,
//     lane, offset} in FrameHeader.tcp_blobs, and the blob travels empty on
//     the stream; the frame's logical size is unchanged.
// B4. A frame is delivered once its blobs arrived; the stream reads on
//     meanwhile, so the frames after it may pass it (a probe's answer never
//     waits behind a large tensor's bytes). Frames without bulk blobs keep
//     their order.
// B5. The receiver reads each record into memory allocated for it (64-byte
//     aligned; the decoded tensor's own storage, no further copy; buffers of
//     1 MiB or more are reused once their tensors died, up to 8 and 256 MiB). A record
//     larger than max_blob_bytes closes the connection. Blobs read but not
//     yet claimed by a frame count against unclaimed_budget, per sender and
//     lane (at least 4 KiB each; a receiver holds at most `lanes` times
//     the budget per sender): past it, the lane's reading pauses until
//     frames claim what it read (a lane holding none always reads one
//     more: each lane delivers in frame order, so the oldest frame is never
//     held back behind later ones).
// B6. When the sender's connection ends, blobs read in full stay
//     claimable, and a frame waiting for another waits on for the sender to
//     resume (B8). With no connection from the sender for silence_timeout,
//     the waits fail: a request is answered with UNAVAILABLE before it ran
//     (not_run), a response completes its call with UNAVAILABLE; records of
//     the ids they wanted are dropped if they come after all. A connection
//     from a new incarnation of the sender drops what the old one left
//     unclaimed, and the waits begun before it fail (Import's wait_epoch).
// B7. A connection outlives silence as long as the stream does (the
//     agent's partition tolerance: TCP_USER_TIMEOUT and keepalive), no
//     longer. Its hello names the first id it carries: the receiver ends the
//     sender's older connections, and a frame waiting for a lower id that
//     has not arrived fails at once (the sender gave it up, B8).
// B8. The receiver acknowledges each record once read: its id (u64) on the
//     same connection. A record whose id is below one already read is a
//     resend: read, dropped, acknowledged. The sender keeps each record (the
//     tensor's memory) until acknowledged. When a connection that was up
//     breaks (a partition longer than TCP tolerates, a reset), the sender
//     connects again every retry_after and writes the unacknowledged records
//     first, the oldest one's id in its hello, for up to half of
//     silence_timeout after the last connection that got a record through;
//     then it gives them up. Meanwhile new blobs travel on the stream. A
//     connection superseded by a newer one from its sender reads nothing
//     more.
// B9. Under the job's TLS (options.tls), every connection is mutual TLS 1.3
//     before its hello (B2): each side presents its certificate from the
//     job's CA and refuses a peer without one; the sender checks the
//     receiver's name as the gRPC streams do (connection.h). A failed
//     handshake is a failed connection: blobs stay on the stream. The hello,
//     the records and the acknowledgements then travel inside TLS.
// B10. Lanes and stripes: one TCP connection moves less than two here (on
//     loopback and across a veth pair the sender's core also runs the
//     receiver's TCP stack), so a sender keeps `lanes` connections per peer.
//     A blob of at least stripe_min_bytes, sent while at least two lanes are
//     up, is cut into at most one slice per lane that is up (4 KiB-aligned
//     offsets), each a record of its lane naming the blob's stripe (a number
//     per sender and peer, from 1), its offset and the blob's total size;
//     the receiver reads every slice straight into one buffer of the total
//     size, so the stripe arrives as one blob with no copy. Its frame lists
//     one entry per slice, with the same index and stripe. The receiver
//     charges a stripe's whole size to the lane of its first slice (B5; the
//     later slices wait for nothing but a resend of a part that a left
//     connection is still reading), and ends the connection of a slice that
//     overlaps another of its stripe, names another total, or would make
//     more slices than kMaxLanes. When a frame naming a stripe fails, the
//     stripe goes with every slice of it and its charge, and its slices
//     still to come are dropped as read; so does a stripe left with no
//     slice read or being read. Smaller blobs go whole, each on the lane
//     with the fewest records waiting. A receiver refuses a lane beyond its
//     own `lanes`.
//
// Entries come from a peer and are not trusted: Import checks each index
// and lane, that the blob traveled empty, that no lane's id is named twice,
// that an index's slices cover it exactly once, the sizes against
// max_blob_bytes and the records' actual sizes, offsets and stripe, and
// that no blob is claimed twice.
//
// Thread-safety: safe for concurrent use. Callbacks of Import run on the
// channel's threads (a reader's, its acceptor's) or in Close(), never under
// the channel's lock, and must not block.
#ifndef BATON_RPC_CHANNEL_TCP_BULK_CHANNEL_H_
#define BATON_RPC_CHANNEL_TCP_BULK_CHANNEL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/log.h"
#include "base/tls.h"
#include "rpc/transport.h"

namespace baton::rpc::internal {

namespace tcp {
class Connection;
class TlsContext;
}  // namespace tcp

struct BulkChannelOptions {
  std::string host = "127.0.0.1";  // to listen on (the transport's host)
  std::string job_token;
  size_t min_bytes = size_t{1} << 18;  // smaller blobs stay on the stream
  // Connections per peer (B10), 1 to kMaxLanes (others are taken as the
  // nearest), and the smallest blob striped across them.
  int lanes = 2;
  size_t stripe_min_bytes = size_t{4} << 20;  // 1-4 MiB: whole, on alternate lanes
  uint64_t max_blob_bytes = uint64_t{1} << 30;
  uint64_t unclaimed_budget = uint64_t{1} << 30;  // per sender (B5)
  absl::Duration handshake_timeout = absl::Seconds(10);
  absl::Duration retry_after = absl::Seconds(1);  // between tries to reconnect (B8)
  // How long a silent connection lives (B7): the agent's partition tolerance.
  absl::Duration silence_timeout = absl::Seconds(30);
  // The job's TLS (base/tls.h; empty: plain TCP): B9.
  TlsConfig tls;
  // Says when connections to a peer fail their TLS handshake (the first
  // failure after each success), as the channel then stays off for it.
  Logger log;
};

class BulkChannel {
 public:
  static constexpr int kMaxLanes = kMaxBulkLanes;
  // Checks a hello's identity (B2): the worker it proves, or an error. May
  // block (the channel's own thread calls it).
  using Authenticator = std::function<absl::StatusOr<int>(const std::string& identity)>;

  static absl::StatusOr<std::unique_ptr<BulkChannel>> Start(BulkChannelOptions options,
                                                            Authenticator authenticate);
  ~BulkChannel();  // Close()
  BulkChannel(const BulkChannel&) = delete;
  BulkChannel& operator=(const BulkChannel&) = delete;

  // host:port it listens on.
  const std::string& address() const { return address_; }

  // Where `peer` listens and the identity to present there. Another identity
  // (a restarted peer) replaces the connection.
  void AddPeer(int peer, const std::string& address, const std::string& identity);

  // Whether the frame has a blob of at least min_bytes (Export's concern).
  bool Wants(const Frame& frame) const;

  // Sender: moves the frame's blobs of at least min_bytes into the
  // connection to `peer` (B3), if it is up; otherwise starts it and leaves
  // the frame as it is.
  void Export(int peer, Frame& frame);

  // Whether blobs to `peer` go through the channel now (a lane of it is
  // up), waiting up to `timeout` while connections to it are being made
  // (tests, benchmarks).
  bool Connected(int peer, absl::Duration timeout);

  // Receiver: fills the frame's tcp_blobs from what `peer` sent. true: every
  // blob is in place; false: some have not arrived, and `ready` runs once
  // when they did or the wait ended: call Import again (with the same
  // `wait_epoch`). An error: the frame cannot be completed, and what of it
  // arrived is released (DATA_LOSS for bad entries or a blob claimed
  // already; UNAVAILABLE when the sender gave the blobs up, did not resume
  // in time (B6), or restarted since the frame's first Import: `wait_epoch`,
  // 0 before it, keeps the sender's incarnation then; null: not checked).
  absl::StatusOr<bool> Import(int peer, Frame& frame, std::function<void()> ready,
                              uint64_t* wait_epoch = nullptr);

  // Ends every connection and thread; waits end with UNAVAILABLE.
  void Close();

  // Breaks every connection of this channel, as a reset or a partition that
  // outlasted TCP would (tests of B6 and B8).
  void DropConnectionsForTesting();

  struct Stats {
    uint64_t blobs_sent = 0, bytes_sent = 0, blobs_received = 0, bytes_received = 0;
    // Incoming connections closed before their hello was accepted (B2, B9).
    uint64_t connections_refused = 0;
  };
  Stats stats() const;

 private:
  struct Outgoing;
  struct Incoming;
  struct Arrivals;
  class BufferPool;

  enum class ConnectionEnd { kStopped, kNotReady, kBroke };

  BulkChannel(BulkChannelOptions options, Authenticator authenticate);
  void AcceptLoop();
  void ReadLoop(std::shared_ptr<Incoming> in);
  // The sender's thread for one peer: connections, one after another while
  // records wait (B8).
  void WriteLoop(std::shared_ptr<Outgoing> out);
  // One connection: hello, then records until it breaks or is stopped.
  ConnectionEnd RunConnection(const std::shared_ptr<Outgoing>& out);
  void ReadAcknowledgements(const std::shared_ptr<Outgoing>& out, tcp::Connection* conn);
  // The reader of `in` ended.
  void Ended(const std::shared_ptr<Incoming>& in);
  // Whether the waits on a sender's lane fail now (B6).
  bool Abandoned(const Arrivals& arr, int lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeAbandoned();

  const BulkChannelOptions options_;
  const Authenticator authenticate_;
  const std::shared_ptr<BufferPool> buffers_;   // outlived by nothing it lends
  std::shared_ptr<const tcp::TlsContext> tls_;  // null: plain TCP (B9)
  int listen_fd_ = -1;
  std::string address_;
  std::thread acceptor_;

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Each peer's lanes (B10), options_.lanes of them.
  absl::flat_hash_map<int, std::vector<std::shared_ptr<Outgoing>>> out_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Incoming>> in_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::shared_ptr<Arrivals>> arrivals_ ABSL_GUARDED_BY(mu_);
  int handshaking_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_CHANNEL_TCP_BULK_CHANNEL_H_
