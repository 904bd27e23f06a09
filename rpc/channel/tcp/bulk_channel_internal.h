// The bulk channel's wire constants and its state, shared by the files
// that implement it (bulk_channel.cc: setup, connections and their end;
// bulk_channel_send.cc: the sender's lanes; bulk_channel_receive.cc: the
// receiver's reading and Import). Not part of its interface
// (bulk_channel.h); every field of the state structs is guarded by
// BulkChannel::mu_ unless its comment says otherwise.
#ifndef BATON_RPC_CHANNEL_TCP_BULK_CHANNEL_INTERNAL_H_
#define BATON_RPC_CHANNEL_TCP_BULK_CHANNEL_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/channel/tcp/bulk_channel.h"

namespace baton::rpc::internal {
namespace bulk {

constexpr uint32_t kMagic = 0x424e5442;  // "BTNB"
constexpr uint32_t kVersion = 3;         // 2: acknowledgements (B8); 3: lanes, stripes (B10)
constexpr uint32_t kMaxHelloField = 4096;
constexpr int kMaxHandshakes = 64;  // unauthenticated connections at once
constexpr size_t kAlign = 64;

constexpr uint64_t kStripeAlign = 4096;

struct Hello {
  uint32_t magic, version, token_len, identity_len;
  uint64_t first_id;        // the connection's first record id; none below it follows (B7, B8)
  uint32_t lane, reserved;  // which of the sender's connections to the peer this is (B10)
};
struct RecordHeader {
  uint64_t id, size;
  uint64_t stripe, offset, total;  // B10: 0, 0, size for a whole blob
};

// The part [offset, offset + size) of `blob`, sharing its memory.
inline Blob SliceOf(const Blob& blob, size_t offset, size_t size) {
  Blob slice;
  slice.owner = blob.owner;
  for (const auto& piece : blob.pieces) {
    if (size == 0) break;
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    const size_t n = std::min(size, piece.size() - offset);
    slice.pieces.emplace_back(piece.data() + offset, n);
    offset = 0;
    size -= n;
  }
  return slice;
}

// The id after `id`, saturating: ids come from a peer.
inline uint64_t After(uint64_t id) { return id == UINT64_MAX ? id : id + 1; }

}  // namespace bulk

// Buffers of received blobs, reused once the tensors decoded from them die:
// fresh pages for every large blob cost the kernel a fault and a zeroing
// each (64 MiB: a third of the transfer). Keeps at most kKeep buffers and
// kKeepBytes; a kept buffer serves a blob of at least half its size.
class BulkChannel::BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr size_t kKeep = 8;
  static constexpr size_t kKeepBytes = size_t{256} << 20;

  std::shared_ptr<char> Allocate(uint64_t size) {
    const size_t rounded =
        (std::max<uint64_t>(size, 1) + bulk::kAlign - 1) / bulk::kAlign * bulk::kAlign;
    char* p = nullptr;
    size_t capacity = rounded;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->second >= rounded && it->second / 2 <= rounded) {
          p = it->first;
          capacity = it->second;
          kept_bytes_ -= capacity;
          free_.erase(it);
          break;
        }
      }
    }
    if (p == nullptr) p = static_cast<char*>(std::aligned_alloc(bulk::kAlign, rounded));
    if (p == nullptr) return nullptr;
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<char>(p, [pool, capacity](char* q) {
      if (auto alive = pool.lock(); alive != nullptr && alive->Keep(q, capacity)) return;
      std::free(q);
    });
  }

  ~BufferPool() {
    for (auto& [p, capacity] : free_) std::free(p);
  }

 private:
  bool Keep(char* p, size_t capacity) {
    if (capacity < (size_t{1} << 20)) return false;
    absl::MutexLock lock(&mu_);
    if (free_.size() >= kKeep || kept_bytes_ + capacity > kKeepBytes) return false;
    free_.emplace_back(p, capacity);
    kept_bytes_ += capacity;
    return true;
  }

  absl::Mutex mu_;
  std::vector<std::pair<char*, size_t>> free_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

struct BulkChannel::Outgoing {
  enum class State { kIdle, kConnecting, kReady, kBroken };
  struct Item {
    uint64_t id;
    Blob blob;
    // A slice's stripe, its offset and the blob's total size; 0, 0 and the
    // size for a blob sent whole (B10).
    uint64_t stripe = 0, offset = 0, total = 0;
  };
  int lane = 0;
  std::string address;
  std::string identity;
  State state = State::kIdle;
  absl::Time retry_at;
  bool stop = false;
  int fd = -1;                     // set by the writer once connected; shutdown(2) by Close
  bool ended = false;              // the connection's acknowledgements ended (B8)
  bool progressed = false;         // the connection had a record acknowledged (B8)
  bool handshake_failing = false;  // said once until a connection succeeds (B9)
  uint64_t next_id = 1;
  uint64_t next_stripe = 1;  // lane 0's: the peer's stripes (B10)
  std::deque<Item> queue;
  std::deque<Item> sent;  // written, not acknowledged yet (B8)
  std::thread thread;
};

struct BulkChannel::Incoming {
  int fd = -1;
  int peer = -1;
  int lane = 0;
  bool done = false;
  bool superseded = false;  // a newer connection from its sender came (B7)
  std::thread thread;
};

struct BulkChannel::Arrivals {
  struct Arrived {
    std::shared_ptr<char> data;  // a stripe's: its whole buffer (B10)
    uint64_t size = 0;
    uint64_t stripe = 0, offset = 0, total = 0;
  };
  // A part of a stripe read (owner null) or being read by `owner`.
  struct Taken {
    uint64_t begin, end;
    const Incoming* owner;
  };
  // A striped blob's buffer, filled by its slices on every lane (B10).
  struct Stripe {
    std::shared_ptr<char> data;
    uint64_t total = 0;
    int lane = 0;       // the lane of its first slice, charged its total (B5)
    uint64_t done = 0;  // bytes of the slices read in full
    std::vector<Taken> taken;
    std::vector<std::pair<int, uint64_t>> slices;  // (lane, id) of those read
  };
  struct Lane {
    absl::flat_hash_map<uint64_t, Arrived> blobs;
    bool seen = false;       // a connection of the sender's incarnation came on it
    int live = 0;            // connections from the sender on this lane now
    absl::Time lost_since;   // when `live` last fell to 0 (B6)
    uint64_t floor = 0;      // below it, nothing more arrives (B6, B7)
    uint64_t next_id = 0;    // below it, a record is a resend (B8)
    uint64_t unclaimed = 0;  // charged for what it read and no frame claimed (B5)
  };
  Lane lanes[kMaxLanes];
  absl::flat_hash_map<uint64_t, std::shared_ptr<Stripe>> stripes;
  // Stripes whose frame failed (the latest kMaxFailed): their later slices
  // are dropped as read.
  std::deque<uint64_t> failed;
  uint64_t epoch = 1;    // counts the sender's incarnations (Import's wait_epoch)
  std::string identity;  // of the sender's incarnation that sent `blobs`
  std::vector<std::function<void()>> waiters;

  static constexpr size_t kMaxFailed = 256;

  // What a record or stripe of `bytes` costs the budget: at least a page,
  // so that tiny records cannot hold memory the budget does not see.
  static uint64_t ChargeOf(uint64_t bytes) { return std::max<uint64_t>(bytes, 4096); }

  // Forgets a stripe and every slice of it read so far; its charge (B5)
  // goes back to its lane's budget.
  void DropStripe(uint64_t id) {
    auto it = stripes.find(id);
    if (it == stripes.end()) return;
    for (const auto& [lane, slice] : it->second->slices) lanes[lane].blobs.erase(slice);
    lanes[it->second->lane].unclaimed -= ChargeOf(it->second->total);
    stripes.erase(it);
  }
  void Failed(uint64_t stripe) {
    DropStripe(stripe);
    if (std::find(failed.begin(), failed.end(), stripe) != failed.end()) return;
    failed.push_back(stripe);
    if (failed.size() > kMaxFailed) failed.pop_front();
  }
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_CHANNEL_TCP_BULK_CHANNEL_INTERNAL_H_
