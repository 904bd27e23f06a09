#include "data/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace baton::data {
namespace {

// The buffer for the data starts at this size and doubles as bytes arrive,
// so a header that overstates its size does not allocate what it declares.
constexpr size_t kInitialChunk = size_t{1} << 20;
// Largest single gzread() call (its length is an unsigned int).
constexpr size_t kMaxReadCall = size_t{1} << 24;

const char* IdxTypeName(uint8_t code) {
  switch (code) {
    case 0x08: return "uint8";
    case 0x09: return "int8";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

// A gzip (or plain) file open for reading. Not thread-safe; one per call.
class GzFile {
 public:
  static absl::StatusOr<GzFile> Open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      const std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
      if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
      if (err == EACCES || err == EPERM) {
        return absl::PermissionDeniedError(msg);
      }
      return absl::UnavailableError(msg);
    }
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not an IDX file"));
    }
    gzFile gz = ::gzdopen(fd, "rb");
    if (gz == nullptr) {
      ::close(fd);
      return absl::ResourceExhaustedError(absl::StrCat(path, ": cannot allocate a zlib reader"));
    }
    ::gzbuffer(gz, 1 << 17);
    return GzFile(path, gz);
  }

  GzFile(GzFile&& other) noexcept
      : path_(std::move(other.path_)), gz_(std::exchange(other.gz_, nullptr)) {}
  GzFile& operator=(GzFile&&) = delete;
  ~GzFile() {
    if (gz_ != nullptr) ::gzclose_r(gz_);
  }

  // Reads up to `n` bytes into `buf`; fewer only at the end of the data.
  // A corrupt or cut-off gzip stream is DATA_LOSS.
  absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      const unsigned len = static_cast<unsigned>(std::min(n - got, kMaxReadCall));
      const int r = ::gzread(gz_, buf + got, len);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      // gzread() returns 0 both at a clean end and when the stream stops
      // early (Z_BUF_ERROR), so the error state decides.
      int errnum = Z_OK;
      const char* what = ::gzerror(gz_, &errnum);
      if (errnum == Z_OK) break;
      if (errnum == Z_BUF_ERROR) {
        return absl::DataLossError(
            absl::StrCat(path_, ": corrupt gzip stream: it ends early (", what, ")"));
      }
      if (errnum == Z_ERRNO) {
        return absl::DataLossError(absl::StrCat(path_, ": read error: ", std::strerror(errno)));
      }
      return absl::DataLossError(absl::StrCat(path_, ": corrupt gzip stream: ", what));
    }
    return got;
  }

 private:
  GzFile(std::string path, gzFile gz) : path_(std::move(path)), gz_(gz) {}

  std::string path_;
  gzFile gz_;
};

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Product of dims, saturating at UINT64_MAX.
uint64_t SaturatingProduct(const std::vector<uint32_t>& dims) {
  if (std::find(dims.begin(), dims.end(), 0u) != dims.end()) return 0;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t total = 1;
  for (uint32_t d : dims) {
    if (total > kMax / d) return kMax;
    total *= d;
  }
  return total;
}

}  // namespace

std::string IdxDimsText(const std::vector<uint32_t>& dims) { return absl::StrJoin(dims, "x"); }

absl::StatusOr<IdxArray> ReadIdxUint8(const std::string& path, int rank,
                                      const IdxReadOptions& options) {
  if (path.empty()) {
    return absl::InvalidArgumentError("ReadIdxUint8: empty path");
  }
  if (rank < 1 || rank > 255) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": rank must be in [1, 255], got ", rank));
  }
  if (options.max_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": max_bytes must be positive"));
  }
  ASSIGN_OR_RETURN(GzFile file, GzFile::Open(path));

  // Magic: 0x00 0x00 <type code> <number of dims>.
  uint8_t magic[4];
  absl::StatusOr<size_t> got = file.Read(magic, sizeof(magic));
  if (!got.ok()) return got.status();
  if (*got < sizeof(magic)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header: the file holds ", *got,
                                            " bytes, fewer than the 4-byte magic"));
  }
  const uint32_t magic_value = BigEndian32(magic);
  const uint32_t expected_magic = (uint32_t{kIdxTypeUint8} << 8) | static_cast<uint32_t>(rank);
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::DataLossError(
        absl::StrFormat("%s: bad magic 0x%08x: an IDX file starts with two zero bytes "
                        "(expected 0x%08x)",
                        path, magic_value, expected_magic));
  }
  if (magic[2] != kIdxTypeUint8) {
    return absl::DataLossError(
        absl::StrFormat("%s: unsupported type code 0x%02x (%s) in magic 0x%08x: only 0x08 "
                        "(uint8) is supported",
                        path, int{magic[2]}, IdxTypeName(magic[2]), magic_value));
  }
  if (magic[3] != rank) {
    return absl::DataLossError(
        absl::StrFormat("%s: bad magic 0x%08x: the header declares %d dimension(s), "
                        "expected %d (0x%08x)",
                        path, magic_value, int{magic[3]}, rank, expected_magic));
  }

  // Dimensions: `rank` big-endian uint32 values.
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(rank);
  std::vector<uint8_t> raw_dims(4 * static_cast<size_t>(rank));
  got = file.Read(raw_dims.data(), raw_dims.size());
  if (!got.ok()) return got.status();
  if (*got < raw_dims.size()) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated header: ", rank, " dimension(s) need a ", header_bytes,
                     "-byte header but the file holds ", 4 + *got, " bytes"));
  }
  IdxArray array;
  array.dims.resize(static_cast<size_t>(rank));
  for (int i = 0; i < rank; ++i) {
    array.dims[static_cast<size_t>(i)] = BigEndian32(&raw_dims[4 * i]);
  }
  const std::string shape = absl::StrCat(IdxDimsText(array.dims), " ", options.noun);
  const uint64_t total = SaturatingProduct(array.dims);
  if (total > options.max_bytes) {
    const std::string size = total == std::numeric_limits<uint64_t>::max()
                                 ? "more than 2^64 bytes"
                                 : absl::StrCat(total, " bytes");
    return absl::DataLossError(absl::StrCat(path, ": header declares ", shape, " (", size,
                                            "), above the limit of ", options.max_bytes, " bytes"));
  }

  // Data: exactly `total` bytes. The buffer grows with what is read.
  size_t filled = 0;
  while (filled < total) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(total, std::max(kInitialChunk, 2 * filled)));
    array.values.resize(want);
    got = file.Read(array.values.data() + filled, want - filled);
    if (!got.ok()) return got.status();
    filled += *got;
    if (filled < want) break;
  }
  if (filled < total) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header declares ", shape, " (",
                                            total, " bytes) but the file holds only ", filled,
                                            " bytes after the ", header_bytes, "-byte header"));
  }

  // Nothing may follow the data.
  uint64_t trailing = 0;
  uint8_t scratch[1 << 16];
  while (true) {
    got = file.Read(scratch, sizeof(scratch));
    if (!got.ok()) return got.status();
    trailing += *got;
    if (*got < sizeof(scratch)) break;
  }
  if (trailing > 0) {
    return absl::DataLossError(absl::StrCat(path, ": ", trailing, " trailing bytes after the ",
                                            total, " data bytes of the declared ", shape));
  }
  return array;
}

}  // namespace baton::data
