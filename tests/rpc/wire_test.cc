// Packet and frame parsing (rpc/internal/wire.cc): frames survive being
// framed and parsed across any slicing, and hostile packets fail with
// DATA_LOSS instead of crashing or allocating what they declare.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/codec.h"
#include "rpc/internal/wire.h"

namespace baton::rpc::internal {
namespace {

std::string Contents(const Blob& b) {
  std::string out(b.size(), '\0');
  b.CopyTo(out.data());
  return out;
}

std::string Flatten(const std::vector<grpc::Slice>& slices) {
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a received packet cut into slices of `piece` bytes (0: one).
absl::Status Parse(const std::string& bytes, std::vector<Frame>* out, size_t piece = 0,
                   PacketSource source = PacketSource::kGrpc) {
  std::vector<grpc::Slice> slices;
  if (piece == 0) piece = std::max<size_t>(bytes.size(), 1);
  for (size_t off = 0; off < bytes.size(); off += piece) {
    slices.emplace_back(bytes.data() + off, std::min(piece, bytes.size() - off));
  }
  grpc::ByteBuffer packet(slices.data(), slices.size());
  return ParsePacket(&packet, source, out);
}

// A blob says whether gRPC wrote its bytes (ThreadSanitizer builds do not
// check the copy out of such a blob: Blob::written_by_grpc).
TEST(Wire, BlobsSayWhoWroteThem) {
  Frame a;
  a.header.set_kind(proto::FrameHeader::REQUEST);
  a.payload = *EncodeMessage(std::make_tuple(at::arange(10, at::kFloat)));
  std::vector<grpc::Slice> slices;
  AppendFrame(a, &slices);
  const std::string bytes = Flatten(slices);
  for (PacketSource source : {PacketSource::kGrpc, PacketSource::kBaton}) {
    std::vector<Frame> frames;
    ASSERT_TRUE(Parse(bytes, &frames, 0, source).ok());
    ASSERT_EQ(frames.size(), 1u);
    ASSERT_EQ(frames[0].payload.blobs.size(), 1u);
    EXPECT_EQ(frames[0].payload.blobs[0].written_by_grpc, source == PacketSource::kGrpc);
    EXPECT_EQ(Contents(frames[0].payload.blobs[0]), Contents(a.payload.blobs[0]));
  }
}

// A frame whose header is `header` as is, followed by `rest`.
std::string RawFrame(const proto::FrameHeader& header, const std::string& rest) {
  const std::string h = header.SerializeAsString();
  const uint32_t len = static_cast<uint32_t>(h.size());
  std::string out(reinterpret_cast<const char*>(&len), 4);
  return out + h + rest;
}

TEST(Wire, FramesSurviveAnySlicing) {
  Frame a;
  a.header.set_kind(proto::FrameHeader::REQUEST);
  a.header.set_id(7);
  a.header.set_function("add");
  a.payload = *EncodeMessage(std::make_tuple(at::arange(10, at::kFloat), std::string("x")));
  a.payload.extensions["ext"] = "value";
  Frame b;
  b.header.set_kind(proto::FrameHeader::RESPONSE);
  b.header.set_id(7);
  b.header.set_status_code(5);
  b.header.set_error_message("no such function");
  std::vector<grpc::Slice> slices;
  const size_t size_a = FrameSize(a);
  EXPECT_EQ(AppendFrame(a, &slices), size_a);
  AppendFrame(b, &slices);
  const std::string bytes = Flatten(slices);
  for (size_t piece : {0, 1, 3, 64}) {
    std::vector<Frame> frames;
    ASSERT_TRUE(Parse(bytes, &frames, piece).ok()) << piece;
    ASSERT_EQ(frames.size(), 2u);
    EXPECT_EQ(frames[0].header.function(), "add");
    EXPECT_EQ(frames[0].payload.bytes, a.payload.bytes);
    ASSERT_EQ(frames[0].payload.blobs.size(), 1u);
    EXPECT_EQ(Contents(frames[0].payload.blobs[0]), Contents(a.payload.blobs[0]));
    EXPECT_EQ(frames[0].payload.extensions.at("ext"), "value");
    EXPECT_EQ(frames[1].header.error_message(), "no such function");
  }
}

TEST(Wire, TruncatedOrMalformedPacketsAreDataLoss) {
  Frame f;
  f.payload.bytes = "payload";
  std::vector<grpc::Slice> slices;
  AppendFrame(f, &slices);
  const std::string bytes = Flatten(slices);
  for (size_t n = 1; n < bytes.size(); ++n) {
    std::vector<Frame> frames;
    EXPECT_EQ(Parse(bytes.substr(0, n), &frames).code(), absl::StatusCode::kDataLoss) << n;
  }
  std::vector<Frame> frames;
  const uint32_t len = 3;
  std::string garbage(reinterpret_cast<const char*>(&len), 4);
  garbage += "\xff\xff\xff";
  EXPECT_EQ(Parse(garbage, &frames).code(), absl::StatusCode::kDataLoss);
}

// Regression (fuzz/wire_fuzzer, corpus crash_declared_sizes_wrap_around): the
// payload and blob sizes a header declares were summed before being compared
// with the bytes present, so sizes that wrap around 2^64 passed the check
// and the parser then tried to allocate the payload's declared size (the
// process died with std::length_error).
TEST(Wire, DeclaredSizesThatWrapAroundAreDataLoss) {
  proto::FrameHeader h;
  h.set_payload_size(~uint64_t{0});
  h.add_blob_sizes(1);
  std::vector<Frame> frames;
  absl::Status s = Parse(RawFrame(h, "x"), &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "frame declares a payload of 18446744073709551615"))
      << s;
  proto::FrameHeader blobs;
  blobs.set_payload_size(10);  // room to name two tensors
  blobs.add_blob_sizes(uint64_t{1} << 63);
  blobs.add_blob_sizes(uint64_t{1} << 63);
  s = Parse(RawFrame(blobs, "0123456789xy"), &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "blob 0")) << s;
  // A large declared size with few bytes behind it allocates nothing.
  proto::FrameHeader big;
  big.set_payload_size(uint64_t{1} << 40);
  s = Parse(RawFrame(big, "abc"), &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(frames.empty());
}

// A header's lists are checked against the frame's bytes before anything is
// allocated for them: a packed list of millions of zero blob sizes (1 byte
// each on the wire, 8 once parsed and 40 as blobs) for a payload that can
// name one tensor is DATA_LOSS naming both counts; so are more shared-memory
// blobs than blobs, more extensions than the limit, and more reply notes
// than a reply may carry (rpc/function.h). A frame whose
// payload can name its blobs passes.
TEST(Wire, AHeaderListingMoreThanItsBytesCanUseIsDataLoss) {
  proto::FrameHeader h;
  h.set_payload_size(6);
  std::string head = h.SerializeAsString();
  constexpr size_t kEntries = size_t{1} << 20;
  head.push_back(static_cast<char>((10 << 3) | 2));  // blob_sizes, packed
  for (size_t n = kEntries;; n >>= 7) {
    head.push_back(static_cast<char>((n & 0x7f) | (n >= 0x80 ? 0x80 : 0)));
    if (n < 0x80) break;
  }
  head.append(kEntries, '\0');
  const uint32_t len = static_cast<uint32_t>(head.size());
  std::string packet(reinterpret_cast<const char*>(&len), 4);
  packet += head + "tensor";
  std::vector<Frame> frames;
  absl::Status s = Parse(packet, &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "frame header lists 1048576 blobs, but its payload "
                                "of 6 bytes can name at most 1"))
      << s;
  EXPECT_TRUE(frames.empty());

  proto::FrameHeader shm;
  shm.set_payload_size(5);
  shm.add_blob_sizes(0);
  shm.add_shm_blobs()->set_index(0);
  shm.add_shm_blobs()->set_index(0);
  s = Parse(RawFrame(shm, "12345"), &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "2 shared-memory blobs but only 1 blobs")) << s;

  proto::FrameHeader ext;
  for (int i = 0; i < 65; ++i) (*ext.mutable_extensions())[absl::StrCat("e", i)] = "";
  s = Parse(RawFrame(ext, ""), &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "65 extensions")) << s;

  // Empty reply notes: 2 bytes each on the wire, a message each once parsed.
  proto::FrameHeader notes;
  notes.set_kind(proto::FrameHeader::RESPONSE);
  for (size_t i = 0; i <= kMaxReplyNotes; ++i) notes.add_notes();
  s = Parse(RawFrame(notes, ""), &frames);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(kMaxReplyNotes + 1, " reply notes")))
      << s;
  notes.mutable_notes()->RemoveLast();
  s = Parse(RawFrame(notes, ""), &frames);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].header.notes_size(), static_cast<int>(kMaxReplyNotes));
  frames.clear();

  proto::FrameHeader ok;
  ok.set_payload_size(10);
  ok.add_blob_sizes(2);
  ok.add_blob_sizes(0);
  s = Parse(RawFrame(ok, "0123456789ab"), &frames);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].payload.blobs.size(), 2u);
}

}  // namespace
}  // namespace baton::rpc::internal
