// ShmChannel: moves large tensor blobs between workers on the same host
// through POSIX shared memory instead of the gRPC stream.
//
// Each sender keeps a pool of reusable segments ("/baton.<ns>.<pid>.s<k>",
// where <ns> identifies the sender's PID namespace), each a
// 64-byte header followed by `capacity` data bytes. Fresh shared pages are
// expensive to fault in, so segments are created once and reused warm.
//
// Protocol (docs/wire_format.md, "Same-host bulk channel"):
// S1. To send a blob of at least kMinBytes, the sender takes a free segment,
//     bumps its generation, stores it in the header (write_gen), copies the
//     bytes, and lists {index, name, size, generation, capacity} in
//     FrameHeader.shm_blobs; the blob itself travels empty. The logical
//     message size (for limits) is unchanged.
// S2. The receiver checks the entry (below), maps the segment (cached by
//     name) and pins the generation: a compare-and-swap of the header's
//     claim word from "held for a receiver" to "pinned", then names itself
//     (pid and PID namespace) as the holder. A failed pin means the sender
//     reclaimed the segment (S3): the blob is reported as DATA_LOSS, never
//     used. A pinned blob is the segment's bytes, with no copy: tensors
//     decoded from it alias the sender's pages. When its last user lets go
//     (the tensors die), the receiver stores the generation in
//     released_gen.
// S3. A segment is free when released_gen equals its generation. Past its
//     holder's deadline (the call's deadline plus a grace period) an
//     unpinned segment is reclaimed by the sender's own compare-and-swap, so
//     a late receiver's pin fails; a pinned one is freed only once its
//     holder's process is gone (judged within one PID namespace: from
//     another, it waits for the release). No segment is ever reused while a
//     receiver may use it.
// S4. A peer is sent segments only if it proved at rendezvous that it can
//     open an object this worker created (same /dev/shm).
// S5. Close() unlinks every segment name; Sweep() removes names left by dead
//     processes: "/baton.<ns>.<pid>.*" whose creator is gone. The creator's
//     liveness is judged by its LivenessMarker, in any PID namespace that
//     shares /dev/shm (containers, sandboxes): the group is gone when it has
//     markers and none is locked. Without a marker, only a pid of this PID
//     namespace can be judged (kill(pid, 0)); other names stay.
// Without a free segment and no room to create one (pool limit, or /dev/shm
// full), the blob stays on the stream.
//
// Entries come from a peer and are not trusted: before mapping anything the
// receiver checks that the name is a segment's ("<prefix>s<k>", of the
// sender when its prefix is known), that the blob is one of the frame's and
// travels only here, that kMinBytes <= size <= capacity, that the capacity
// is one a segment can have, and that the generation is not 0 (never
// written); mapping then fails unless the object holds the whole capacity.
// So a peer can make a worker read and release only a segment of its own,
// within it, and only as written.
//
// Thread-safety: safe for concurrent use.
#ifndef BATON_RPC_CHANNEL_SHM_SHM_CHANNEL_H_
#define BATON_RPC_CHANNEL_SHM_SHM_CHANNEL_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/internal/wire.h"

namespace baton::rpc::internal {

// A process's mark of life in /dev/shm: "/baton.<ns>.<pid>.alive.<k>",
// held open with an exclusive flock(2) for the marker's lifetime. The kernel
// drops the lock when the process dies (SIGKILL included), so Sweep() in any
// PID namespace that shares /dev/shm can tell a live creator from a dead
// one. The name appears already locked (created under a name Sweep ignores,
// locked, then renamed). Every creator of baton objects (ShmChannel,
// ShmTransport) holds one before it creates any; a process that forks
// without exec keeps the lock in the child until the child exits.
class LivenessMarker {
 public:
  // `prefix`: ObjectPrefix(getpid()) in production; tests pass another.
  static absl::StatusOr<std::unique_ptr<LivenessMarker>> Create(const std::string& prefix);
  ~LivenessMarker();  // unlinks and unlocks
  LivenessMarker(const LivenessMarker&) = delete;
  LivenessMarker& operator=(const LivenessMarker&) = delete;
  const std::string& name() const { return name_; }

 private:
  LivenessMarker(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  const int fd_;
  const std::string name_;  // "/baton...."
};

class ShmChannel {
 public:
  static constexpr size_t kMinBytes = 32 << 10;
  // Total bytes of segments one sender keeps.
  static constexpr size_t kPoolBytes = size_t{2} << 30;

  ShmChannel();
  ~ShmChannel();  // Close()

  // S1: moves eligible blobs of `frame` into segments held until `expiry`.
  void Export(Frame& frame, absl::Time expiry);
  // S2: pins the frame's segment blobs and makes them the payload's blobs
  // (released when the last user of each lets go). DATA_LOSS naming the
  // entry on any inconsistency, or for a segment the sender reclaimed.
  // `sender_prefix` is the sender's ObjectPrefix: entries must then name its
  // segments. Empty: a segment of any process (the name's form is checked).
  absl::Status Import(Frame& frame, absl::string_view sender_prefix = {});
  // Whether `name` has the form of a segment ("/baton.<ns>.<pid>.s<k>") and,
  // unless `owner_prefix` is empty, starts with it.
  static bool IsSegmentName(absl::string_view name, absl::string_view owner_prefix);

  void Close();
  static int Sweep();
  // "/baton.<ns>.<pid>." for this PID namespace: the prefix of every object
  // a process `pid` of this namespace creates.
  static std::string ObjectPrefix(int pid);

  // S4: creates a probe object holding `token`; returns its name.
  absl::StatusOr<std::string> CreateProbe(const std::string& token);
  static bool CheckProbe(const std::string& name, const std::string& token);
  void RemoveProbe();

  // Segments currently held by a receiver.
  size_t busy_segments() const;
  // Blob bytes copied into segments (S1) and out of them so far: a blob
  // that crosses through shared memory is copied once, by its sender; the
  // receiver uses the segment's pages (S2), so bytes_copied_in() stays 0.
  int64_t bytes_copied_out() const { return bytes_out_.load(std::memory_order_relaxed); }
  int64_t bytes_copied_in() const { return bytes_in_.load(std::memory_order_relaxed); }

 private:
  struct Segment;
  struct Mapping;
  // A free segment of at least `size` bytes, or nullptr.
  Segment* Acquire(size_t size, absl::Time expiry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Mapping>> Map(const std::string& name, uint64_t capacity);

  std::atomic<int64_t> bytes_out_{0};
  std::atomic<int64_t> bytes_in_{0};
  const int pid_;
  // S5: held while this channel may own objects (null if /dev/shm refused).
  std::unique_ptr<LivenessMarker> alive_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Segment>> segments_ ABSL_GUARDED_BY(mu_);
  size_t pool_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::string probe_ ABSL_GUARDED_BY(mu_);
  absl::Mutex map_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Mapping>> mappings_ ABSL_GUARDED_BY(map_mu_);
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_CHANNEL_SHM_SHM_CHANNEL_H_
