// Helpers shared by the libFuzzer targets in fuzz/ and by the seed generator
// (fuzz/make_seeds.cc): a reader that splits one fuzz input into the fields a
// target needs, the matching writer that builds seeds in the same layout,
// and FUZZ_CHECK for the targets' own invariants.
//
// Every reader call succeeds: past the end of the input, numbers read as 0
// and byte strings as empty, so any input is a valid sequence of fields. All
// numbers are little-endian.
//
// Thread-safety: plain values; each object is used by one thread.
#ifndef BATON_FUZZ_FUZZ_INPUT_H_
#define BATON_FUZZ_FUZZ_INPUT_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

// Aborts (a crash libFuzzer reports and saves) when a target's invariant
// does not hold.
#define FUZZ_CHECK(cond)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: fuzz invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

namespace baton::fuzz {

class FuzzReader {
 public:
  FuzzReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return size_ - pos_; }

  uint8_t U8() { return static_cast<uint8_t>(Number(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Number(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Number(4)); }
  uint64_t U64() { return Number(8); }

  // Up to `n` bytes (fewer at the end of the input).
  std::string Bytes(size_t n) {
    n = std::min(n, remaining());
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }
  // A u16 length, then that many bytes.
  std::string Chunk() { return Bytes(U16()); }
  std::string Rest() { return Bytes(remaining()); }

 private:
  uint64_t Number(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes && pos_ < size_; ++i) {
      v |= static_cast<uint64_t>(data_[pos_++]) << (8 * i);
    }
    return v;
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

class FuzzWriter {
 public:
  FuzzWriter& U8(uint8_t v) { return Number(v, 1); }
  FuzzWriter& U16(uint16_t v) { return Number(v, 2); }
  FuzzWriter& U32(uint32_t v) { return Number(v, 4); }
  FuzzWriter& U64(uint64_t v) { return Number(v, 8); }
  FuzzWriter& Bytes(const std::string& s) {
    out_ += s;
    return *this;
  }
  // The layout FuzzReader::Chunk reads; `s` must be shorter than 64 KiB.
  FuzzWriter& Chunk(const std::string& s) {
    if (s.size() > 0xffff) {
      std::fprintf(stderr, "FuzzWriter::Chunk: %zu bytes do not fit a u16 length\n", s.size());
      std::abort();
    }
    U16(static_cast<uint16_t>(s.size()));
    return Bytes(s);
  }
  const std::string& str() const { return out_; }

 private:
  FuzzWriter& Number(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  std::string out_;
};

}  // namespace baton::fuzz

#endif  // BATON_FUZZ_FUZZ_INPUT_H_
