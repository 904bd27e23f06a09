// Dense tables through shared memory between processes of one host (issue
// 28): a server publishes each version of its dense chunks once, in a
// segment its trainers map (the parameter board), and each trainer writes
// its gradients into a segment of its own that the server reads in place
// (the gradient box). PsServer and PsClient use them; the RPCs still carry
// clocks, sessions and errors, but no dense bytes. Internal to //ps.
//
// Guarantees (tests in tests/ps/shared_tables_test.cc are named after them):
//   SD1 Whole versions. A reader copies one published version whole or
//       reports that it could not: the board has two buffers, each under a
//       sequence count (odd while written), and Publish writes the buffer
//       readers are not directed to; a read whose count changed under it is
//       retried on the newest buffer, at most kReadTries times.
//   SD2 No older version. Read(min_version) never returns a version older
//       than min_version: a server publishes under its shard's lock before
//       it replies, so the version a pull reply names is on the board.
//   SD3 A box is written only once the server let it go. The server's
//       views of a box's gradients hold the box; when the last view is
//       freed (after the push applied it, or, in kSync, after the clock
//       that used it was applied or discarded) the server marks the box's
//       generation released. A trainer writes a box only when every
//       generation it wrote was released; otherwise its push carries the
//       gradients in the message, as between hosts.
//   SD4 Only what was agreed is mapped. Each segment starts with a magic
//       number, a random nonce and its buffer size; opening one whose
//       header differs from what its creator announced over RPC (another
//       host's object under the same name, a stale one) fails with
//       FAILED_PRECONDITION naming it, and the pair stays on messages.
//   SD5 Cleanup. Segments are named under the creating process's object
//       prefix (rpc/channel/shm/shm_channel.h, S5) and unlinked by their
//       creator's destructor; after a SIGKILL, ShmChannel::Sweep removes
//       them (each creator holds a LivenessMarker). The memory they cost is
//       reported by bytes().
//
// Layout: a 4 KiB header, then the buffers; the chunks of every dense table
// a server holds lie in spec order, each at a 64-byte aligned offset
// (DenseLayout), identical on both sides because both derive it from the
// spec and the ShardPlan.
//
// Thread-safety: ParameterBoard::Publish and GradientBox::Write are called
// by one thread at a time (the shard's lock, the trainer's push); readers
// may run concurrently with them and with each other.
#ifndef BATON_PS_INTERNAL_SHARED_TABLES_H_
#define BATON_PS_INTERNAL_SHARED_TABLES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/shm_segment.h"
#include "ps/sharding.h"
#include "ps/spec.h"

namespace baton::rpc::internal {
class LivenessMarker;
}

namespace baton::ps::internal {

// Where each dense table's chunk lies in one server's buffers.
struct DenseLayout {
  std::vector<int64_t> offset;         // per spec table: byte offset, -1 if none here
  std::vector<int64_t> numel;          // per spec table: elements of the chunk
  std::vector<c10::ScalarType> dtype;  // per spec table
  int64_t bytes = 0;                   // one buffer
  bool empty() const { return bytes == 0; }
};
DenseLayout MakeDenseLayout(const PsSpec& spec, const ShardPlan& plan, int server);

// What a creator announces so that the other side can map its segment.
struct SharedName {
  std::string name;  // empty: none
  uint64_t nonce = 0;
  int64_t bytes = 0;  // one buffer
};

// What a board and a box have in common: the segment, what its creator
// announced, the layout, and (creator only) the name to unlink and the
// liveness marker that lets the sweep judge the creator (SD5).
class SharedSegment {
 public:
  const SharedName& announced() const { return announced_; }
  // Shared memory this segment maps.
  size_t bytes() const { return segment_.size(); }

 protected:
  // The pieces of a new segment, before its header is written.
  struct Parts {
    ShmSegment segment;
    SharedName announced;
    std::unique_ptr<rpc::internal::LivenessMarker> marker;  // null: not the creator
  };
  // Creates "<this process's object prefix><name>.<nonce>" of `total` bytes
  // for buffers of `buffer_bytes`.
  static absl::StatusOr<Parts> CreateParts(const std::string& name, int64_t buffer_bytes,
                                           size_t total);
  // Maps what was announced (`what` names it in errors); SD4: the header's
  // magic, nonce and size must be the announced ones.
  static absl::StatusOr<Parts> OpenParts(const SharedName& announced, const DenseLayout& layout,
                                         size_t total, uint64_t magic, absl::string_view what);

  SharedSegment(Parts parts, DenseLayout layout);
  ~SharedSegment();  // the creator unlinks the name

  ShmSegment segment_;
  const SharedName announced_;
  const DenseLayout layout_;
  std::unique_ptr<rpc::internal::LivenessMarker> marker_;
};

class ParameterBoard : public SharedSegment {
 public:
  static constexpr int kReadTries = 64;

  // Server side: a new board for `layout` (named under this process's
  // object prefix). RESOURCE_EXHAUSTED if /dev/shm has no room.
  static absl::StatusOr<std::unique_ptr<ParameterBoard>> Create(const DenseLayout& layout,
                                                                int server);
  // Trainer side: maps a board a server announced (SD4).
  static absl::StatusOr<std::unique_ptr<ParameterBoard>> Open(const SharedName& announced,
                                                              const DenseLayout& layout);
  // The newest version published, -1 if none.
  int64_t version() const;

  // Creator: publishes `chunks` (per spec table: the chunk's flat values,
  // undefined where the layout has none) as `version` (SD1).
  void Publish(int64_t version, const std::vector<at::Tensor>& chunks);
  // Reader: copies table `table`'s chunk of a version >= min_version into
  // `into` (flat, contiguous, the chunk's numel and dtype), for every
  // (table, into) pair at once; returns the version copied. UNAVAILABLE if
  // no whole version >= min_version could be read (SD1, SD2): the caller
  // pulls through a message instead. INVALID_ARGUMENT for a table without
  // a chunk here or a destination that is not a contiguous host tensor of
  // the chunk's numel and dtype.
  absl::StatusOr<int64_t> Read(int64_t min_version,
                               const std::vector<std::pair<int, at::Tensor>>& into) const;

 private:
  using SharedSegment::SharedSegment;
  struct Header;
  Header* header() const;
  char* buffer(int b) const;
};

class GradientBox : public SharedSegment {
 public:
  // Trainer side: a box for its gradients to `server` (SD5 names).
  static absl::StatusOr<std::unique_ptr<GradientBox>> Create(const DenseLayout& layout, int trainer,
                                                             int server);
  // Server side: maps a box a trainer announced (SD4).
  static absl::StatusOr<std::shared_ptr<GradientBox>> Open(const SharedName& announced,
                                                           const DenseLayout& layout);

  // Trainer: whether every generation written was released (SD3).
  bool Free() const;
  // Trainer: copies `grads` (table index, the chunk's values of its numel
  // and dtype) into the box; returns the new generation (>= 1).
  // INVALID_ARGUMENT (nothing written) for a table without a chunk here or
  // a tensor of another numel or dtype. REQUIRES: Free().
  absl::StatusOr<uint64_t> Write(const std::vector<std::pair<int, at::Tensor>>& grads);

  // Server: views of generation `generation`'s gradient of each table in
  // `tables`; the box is released when the last view is freed (SD3).
  // INVALID_ARGUMENT if the box does not hold that generation (the trainer
  // wrote another since, or never wrote it).
  static absl::StatusOr<std::vector<at::Tensor>> Views(const std::shared_ptr<GradientBox>& box,
                                                       uint64_t generation,
                                                       const std::vector<int>& tables,
                                                       const PsSpec& spec);

 private:
  using SharedSegment::SharedSegment;
  struct Header;
  Header* header() const;
  char* data() const;
};

}  // namespace baton::ps::internal

#endif  // BATON_PS_INTERNAL_SHARED_TABLES_H_
