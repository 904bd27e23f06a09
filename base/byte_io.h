// Little-endian byte writer and bounds-checked reader for wire
// forms and checkpoints (optimizer options and state, parameter-server
// checkpoints).
//
// Thread-safety: not thread-safe; each object is used by one thread.
#ifndef BATON_BASE_BYTE_IO_H_
#define BATON_BASE_BYTE_IO_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace baton {

class ByteWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void F64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    U64(bits);
  }
  void Raw(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }

  std::string Release() { return std::move(out_); }

 private:
  std::string out_;
};

// Every read returns false (and reads nothing) when too few bytes are left.
class ByteReader {
 public:
  explicit ByteReader(absl::string_view in) : in_(in) {}

  bool U8(uint8_t* v) {
    if (in_.empty()) return false;
    *v = static_cast<uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return true;
  }
  bool U64(uint64_t* v) {
    if (in_.size() < 8) return false;
    uint64_t r = 0;
    for (int i = 0; i < 8; ++i) {
      r |= static_cast<uint64_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    }
    in_.remove_prefix(8);
    *v = r;
    return true;
  }
  bool I64(int64_t* v) {
    uint64_t u;
    if (!U64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool F64(double* v) {
    uint64_t bits;
    if (!U64(&bits)) return false;
    std::memcpy(v, &bits, sizeof(bits));
    return true;
  }
  // Points `out` at the next n bytes (valid while the input is).
  bool Raw(size_t n, absl::string_view* out) {
    if (in_.size() < n) return false;
    *out = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }

  size_t remaining() const { return in_.size(); }

 private:
  absl::string_view in_;
};

}  // namespace baton

#endif  // BATON_BASE_BYTE_IO_H_
