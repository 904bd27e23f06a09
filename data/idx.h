// IDX reader: loads one N-dimensional uint8 array from an IDX file (the
// format of MNIST and Fashion-MNIST), gzipped or not.
//
// Contract: ReadIdxUint8() reads the whole file into memory and validates it
// completely before returning: the magic (two zero bytes, the type code 0x08
// for uint8, the number of dimensions), the big-endian uint32 dimensions, and
// that exactly product(dims) data bytes follow the header, with nothing after
// them. Files ending in ".gz" or not are both accepted: zlib reads a file
// without a gzip header as it is. Every error is a status whose message starts
// with the file path and says what was wrong:
//   NOT_FOUND         the file does not exist;
//   PERMISSION_DENIED the file cannot be opened for another reason;
//   DATA_LOSS         malformed content: corrupt gzip stream, truncated
//                     header or data, bad magic, unsupported type code,
//                     wrong number of dimensions, declared size above the
//                     limit, trailing bytes;
//   INVALID_ARGUMENT  bad arguments (empty path, rank out of range, zero
//                     limit).
// Memory is bounded on any input: a declared size above options.max_bytes is
// rejected before anything is allocated, and the buffer grows (doubling from
// 1 MiB) with the bytes actually read, so a header that overstates its size
// costs at most about twice what the file really holds.
//
// Thread-safety: stateless; safe for concurrent use (each call opens its own
// file handle).
#ifndef BATON_DATA_IDX_H_
#define BATON_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::data {

// The IDX type code for unsigned bytes (third byte of the magic).
inline constexpr uint8_t kIdxTypeUint8 = 0x08;

// Default cap on the data size a header may declare: 1 GiB.
inline constexpr uint64_t kDefaultIdxMaxBytes = uint64_t{1} << 30;

struct IdxReadOptions {
  // Largest data size (product of dims) accepted, in bytes. REQUIRES: > 0.
  uint64_t max_bytes = kDefaultIdxMaxBytes;
  // What the elements are, for error messages ("images", "labels").
  std::string noun = "values";
};

// A dense row-major uint8 array.
struct IdxArray {
  std::vector<uint32_t> dims;   // host byte order, outermost first
  std::vector<uint8_t> values;  // product(dims) bytes
};

// Reads the uint8 IDX file at `path`, which must have exactly `rank`
// dimensions (magic 0x0000 08 <rank>: 0x00000803 for images, 0x00000801 for
// labels). REQUIRES: !path.empty(), 1 <= rank <= 255.
absl::StatusOr<IdxArray> ReadIdxUint8(const std::string& path, int rank,
                                      const IdxReadOptions& options = {});

// "60000x28x28" for error messages; "" for no dims.
std::string IdxDimsText(const std::vector<uint32_t>& dims);

}  // namespace baton::data

#endif  // BATON_DATA_IDX_H_
