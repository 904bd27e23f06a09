// libFuzzer target: packet and frame parsing (rpc/internal/wire.cc), what a
// peer's bytes on the per-peer stream and on the same-host rings go through
// first.
//
// Input: u8 cut, how the packet is cut into gRPC slices (0: one slice, n:
// slices of n bytes, so frames straddle slice boundaries); u8 mode; then for
// an even mode the packet's bytes, and for an odd mode up to 4 frames built
// from fields, so that the sizes a header declares come straight from the
// input: u8 kind, u64 payload_size, u8 number of blob sizes (at most 4) and
// u64 each, u8 number of shared-memory entries (at most 2) with u32 index and
// u64 size each, the extension's value (u16 length and bytes), then the bytes
// after the header (u16 length and bytes).
//
// Checks, besides the sanitizers: ParsePacket either fails or returns frames
// whose payload and blobs have the sizes their headers declare, with no more
// blobs than the payload can name (5 bytes a tensor); framing
// those frames again (AppendFrame) produces FrameSize bytes that parse back
// to the same frames.
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpc/grpc.h>
#include <grpcpp/impl/grpc_library.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "rpc/internal/wire.h"

namespace baton::rpc::internal {
namespace {

grpc::ByteBuffer ToPacket(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  if (piece == 0) piece = bytes.size();
  for (size_t off = 0; off < bytes.size(); off += piece) {
    slices.emplace_back(bytes.data() + off, std::min(piece, bytes.size() - off));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// A packet of frames whose headers hold sizes from the input.
std::string BuildPacket(fuzz::FuzzReader& in) {
  std::string packet;
  for (int n = 0; n < 4 && !in.empty(); ++n) {
    proto::FrameHeader h;
    h.set_kind(static_cast<proto::FrameHeader::Kind>(in.U8() % 2));
    h.set_id(n);
    h.set_payload_size(in.U64());
    for (int i = in.U8() % 5; i > 0; --i) h.add_blob_sizes(in.U64());
    for (int i = in.U8() % 3; i > 0; --i) {
      proto::ShmBlob* e = h.add_shm_blobs();
      e->set_index(in.U32());
      e->set_size(in.U64());
    }
    (*h.mutable_extensions())["x"] = in.Chunk();
    const std::string header = h.SerializeAsString();
    const uint32_t len = static_cast<uint32_t>(header.size());
    packet.append(reinterpret_cast<const char*>(&len), 4);
    packet += header;
    packet += in.Chunk();
  }
  return packet;
}

std::string Contents(const Blob& b) {
  std::string out(b.size(), '\0');
  b.CopyTo(out.data());
  return out;
}

void CheckSizes(const Frame& f) {
  FUZZ_CHECK(f.payload.bytes.size() == f.header.payload_size());
  FUZZ_CHECK(f.payload.blobs.size() == static_cast<size_t>(f.header.blob_sizes_size()));
  for (int i = 0; i < f.header.blob_sizes_size(); ++i) {
    FUZZ_CHECK(f.payload.blobs[i].size() == f.header.blob_sizes(i));
  }
  FUZZ_CHECK(f.payload.extensions.size() == f.header.extensions().size());
  // What a header lists is paid for by the frame's bytes: every blob is
  // named by a tensor of at least 5 payload bytes.
  FUZZ_CHECK(f.payload.blobs.size() * 5 <= f.payload.bytes.size());
}

void CheckSame(const Frame& a, const Frame& b) {
  FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(a.header, b.header));
  FUZZ_CHECK(a.payload.bytes == b.payload.bytes);
  FUZZ_CHECK(a.payload.blobs.size() == b.payload.blobs.size());
  for (size_t i = 0; i < a.payload.blobs.size(); ++i) {
    FUZZ_CHECK(Contents(a.payload.blobs[i]) == Contents(b.payload.blobs[i]));
  }
  FUZZ_CHECK(a.payload.extensions == b.payload.extensions);
}

}  // namespace
}  // namespace baton::rpc::internal

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static grpc::internal::GrpcLibraryInitializer init;
  init.summon();
  grpc_init();
  // Malformed UTF-8 in string fields is an expected parse failure here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::rpc::internal;
  baton::fuzz::FuzzReader in(data, size);
  const size_t piece = in.U8();
  const bool structured = (in.U8() & 1) != 0;
  grpc::ByteBuffer packet = ToPacket(structured ? BuildPacket(in) : in.Rest(), piece);
  std::vector<Frame> frames;
  if (!ParsePacket(&packet, PacketSource::kGrpc, &frames).ok()) return 0;
  std::vector<grpc::Slice> slices;
  for (const Frame& f : frames) {
    CheckSizes(f);
    const size_t expected = FrameSize(f);
    FUZZ_CHECK(AppendFrame(f, &slices) == expected);
  }
  grpc::ByteBuffer again(slices.data(), slices.size());
  std::vector<Frame> reparsed;
  FUZZ_CHECK(ParsePacket(&again, PacketSource::kGrpc, &reparsed).ok());
  FUZZ_CHECK(reparsed.size() == frames.size());
  for (size_t i = 0; i < frames.size(); ++i) CheckSame(frames[i], reparsed[i]);
  return 0;
}
