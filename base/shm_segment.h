// ShmSegment: one named POSIX shared-memory object ("/name" in /dev/shm),
// mapped read-write. The one way baton creates and maps shared memory: the
// same-host transport's hubs and links, the bulk tensor channel's segments
// and probes, and the same-host all-reduce.
//
// Contract:
// - Create(name, bytes) creates the object (O_EXCL, mode 0600: only this
//   user's processes open it), gives it `bytes` bytes and reserves every
//   page (posix_fallocate), then maps it. A /dev/shm too small for it (a
//   container's default 64 MiB, say) is RESOURCE_EXHAUSTED here, never a
//   SIGBUS at the first touch. ALREADY_EXISTS if the name is taken; INTERNAL
//   otherwise. On any failure the name is removed again.
// - Open(name, bytes) maps an existing object: NOT_FOUND if there is none,
//   FAILED_PRECONDITION if it holds fewer than `bytes` bytes (a truncated
//   object would SIGBUS on access, so it is refused before anything is
//   mapped), INTERNAL otherwise. Every error names the object.
// - `populate` pre-faults the mapping (MAP_POPULATE): worth it for a segment
//   that is written whole soon after.
// - The mapping lives as long as the ShmSegment (move-only). Unlink()
//   removes the name; mappings stay valid, and the memory is freed when the
//   last one goes.
// - Limit: a process of the same user can still shrink the object after it
//   was mapped, and readers then fault. Sealing (F_SEAL_SHRINK) would
//   prevent it, but only memfds can be sealed and a memfd has no name that
//   a process in another PID namespace sharing /dev/shm could open, which
//   the same-host paths rely on (rpc/channel/shm/shm_channel.h, S4).
//
// Thread-safety: a ShmSegment is not synchronized; the memory it maps is
// shared, and its users bring their own protocol (seqlocks, futexes).
#ifndef BATON_BASE_SHM_SEGMENT_H_
#define BATON_BASE_SHM_SEGMENT_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace baton {

class ShmSegment {
 public:
  static absl::StatusOr<ShmSegment> Create(const std::string& name, size_t bytes,
                                           bool populate = false);
  static absl::StatusOr<ShmSegment> Open(const std::string& name, size_t bytes,
                                         bool populate = false);

  ShmSegment() = default;  // maps nothing
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();  // unmaps

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool mapped() const { return data_ != nullptr; }

  // Removes the name (not the mapping); ignores a name already gone.
  void Unlink() const;
  // Unmaps now (the destructor then does nothing).
  void Reset();

 private:
  ShmSegment(std::string name, void* data, size_t size)
      : name_(std::move(name)), data_(data), size_(size) {}

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace baton

#endif  // BATON_BASE_SHM_SEGMENT_H_
