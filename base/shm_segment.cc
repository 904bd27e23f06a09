#include "base/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

absl::Status Errno(int err, const std::string& name, absl::string_view what) {
  const std::string msg =
      absl::StrCat("shared-memory object '", name, "': ", what, ": ", std::strerror(err));
  switch (err) {
    case EEXIST: return absl::AlreadyExistsError(msg);
    case ENOENT: return absl::NotFoundError(msg);
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE: return absl::ResourceExhaustedError(msg);
    default: return absl::InternalError(msg);
  }
}

absl::StatusOr<void*> Map(int fd, const std::string& name, size_t bytes, bool populate) {
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (addr == MAP_FAILED) return Errno(errno, name, "mmap");
  return addr;
}

}  // namespace

absl::StatusOr<ShmSegment> ShmSegment::Create(const std::string& name, size_t bytes,
                                              bool populate) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Errno(errno, name, "create");
  absl::Status s;
  // posix_fallocate both sizes the object and reserves its pages.
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    s = Errno(err, name, absl::StrCat("reserving ", bytes, " bytes"));
  }
  absl::StatusOr<void*> addr = s.ok() ? Map(fd, name, bytes, populate) : s;
  close(fd);
  if (!addr.ok()) {
    shm_unlink(name.c_str());
    return addr.status();
  }
  return ShmSegment(name, *addr, bytes);
}

absl::StatusOr<ShmSegment> ShmSegment::Open(const std::string& name, size_t bytes, bool populate) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return Errno(errno, name, "open");
  struct stat st {};
  absl::StatusOr<void*> addr;
  if (fstat(fd, &st) != 0) {
    addr = Errno(errno, name, "fstat");
  } else if (static_cast<size_t>(st.st_size) < bytes) {
    addr = absl::FailedPreconditionError(absl::StrCat("shared-memory object '", name, "' holds ",
                                                      st.st_size, " bytes, ", bytes, " expected"));
  } else {
    addr = Map(fd, name, bytes, populate);
  }
  close(fd);
  if (!addr.ok()) return addr.status();
  return ShmSegment(name, *addr, bytes);
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void ShmSegment::Unlink() const {
  if (!name_.empty()) shm_unlink(name_.c_str());
}

}  // namespace baton
