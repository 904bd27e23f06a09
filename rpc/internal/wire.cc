#include "rpc/internal/wire.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace baton::rpc::internal {
namespace {

void ReleaseOwner(void* user_data) { delete static_cast<std::shared_ptr<const void>*>(user_data); }

void FillSizes(Frame& frame) {
  for (const auto& [k, v] : frame.payload.extensions) (*frame.header.mutable_extensions())[k] = v;
  frame.header.set_payload_size(frame.payload.bytes.size());
  frame.header.clear_blob_sizes();
  for (const auto& b : frame.payload.blobs) frame.header.add_blob_sizes(b.size());
}

// What a serialized FrameHeader lists, counted without parsing it, so that
// a header cannot make the receiver allocate for entries that the frame's
// bytes could never use (each entry of a list costs 1-2 bytes on the wire
// but 8-100 bytes once parsed).
struct HeaderCounts {
  uint64_t payload_size = 0;
  uint64_t blob_sizes = 0;
  uint64_t shm_blobs = 0;
  uint64_t tcp_blobs = 0;
  uint64_t extensions = 0;
  uint64_t notes = 0;
};

bool ReadWireVarint(const uint8_t*& p, const uint8_t* end, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;
}

// False if the bytes are not a well-formed message at the top level.
bool CountHeader(const char* data, size_t n, HeaderCounts* c) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(data);
  const uint8_t* const end = p + n;
  // Field numbers of FrameHeader (proto/rpc.proto).
  constexpr uint64_t kPayloadSize = 9, kBlobSizes = 10, kExtensions = 11, kShmBlobs = 12,
                     kNotes = 17, kTcpBlobs = 18;
  while (p < end) {
    uint64_t tag = 0;
    if (!ReadWireVarint(p, end, &tag)) return false;
    const uint64_t field = tag >> 3;
    switch (tag & 7) {
      case 0: {  // varint
        uint64_t v = 0;
        if (!ReadWireVarint(p, end, &v)) return false;
        if (field == kPayloadSize) c->payload_size = v;
        if (field == kBlobSizes) ++c->blob_sizes;
        break;
      }
      case 1:  // fixed64
        if (end - p < 8) return false;
        p += 8;
        break;
      case 5:  // fixed32
        if (end - p < 4) return false;
        p += 4;
        break;
      case 2: {  // length-delimited
        uint64_t len = 0;
        if (!ReadWireVarint(p, end, &len) || len > static_cast<uint64_t>(end - p)) return false;
        if (field == kBlobSizes) {
          // Packed: one varint per entry, each ending in a byte below 0x80.
          for (uint64_t i = 0; i < len; ++i) c->blob_sizes += (p[i] & 0x80) == 0;
        }
        if (field == kShmBlobs) ++c->shm_blobs;
        if (field == kTcpBlobs) ++c->tcp_blobs;
        if (field == kExtensions) ++c->extensions;
        if (field == kNotes) ++c->notes;
        p += len;
        break;
      }
      default: return false;
    }
  }
  return true;
}

// Checks what a header lists against the bytes that came with it, before
// anything is allocated for it. Every blob is named by a tensor in the
// payload, whose encoding takes at least kMinTensorBytes (tag, dtype,
// requires_grad, rank and blob index; rpc/codec.cc), and a shared-memory
// blob is one of the blobs.
absl::Status CheckHeaderCounts(const char* data, size_t n, size_t left) {
  constexpr uint64_t kMinTensorBytes = 5;
  constexpr uint64_t kMaxExtensions = 64;
  HeaderCounts c;
  if (!CountHeader(data, n, &c)) return absl::DataLossError("malformed frame header");
  if (c.payload_size > left) {
    return absl::DataLossError(absl::StrCat("frame declares a payload of ", c.payload_size,
                                            " bytes but the packet has ", left, " left"));
  }
  if (c.blob_sizes > c.payload_size / kMinTensorBytes) {
    return absl::DataLossError(
        absl::StrCat("frame header lists ", c.blob_sizes, " blobs, but its payload of ",
                     c.payload_size, " bytes can name at most ", c.payload_size / kMinTensorBytes));
  }
  if (c.shm_blobs > c.blob_sizes) {
    return absl::DataLossError(absl::StrCat("frame header lists ", c.shm_blobs,
                                            " shared-memory blobs but only ", c.blob_sizes,
                                            " blobs"));
  }
  if (c.tcp_blobs > c.blob_sizes * kMaxBulkLanes) {
    return absl::DataLossError(absl::StrCat("frame header lists ", c.tcp_blobs,
                                            " bulk-channel entries but only ", c.blob_sizes,
                                            " blobs (at most ", kMaxBulkLanes, " slices each)"));
  }
  if (c.extensions > kMaxExtensions) {
    return absl::DataLossError(absl::StrCat("frame header lists ", c.extensions,
                                            " extensions; at most ", kMaxExtensions,
                                            " are allowed"));
  }
  if (c.notes > kMaxReplyNotes) {
    return absl::DataLossError(absl::StrCat(
        "frame header lists ", c.notes, " reply notes; at most ", kMaxReplyNotes, " are allowed"));
  }
  return absl::OkStatus();
}

// Reads across the slices of one packet.
class SliceReader {
 public:
  explicit SliceReader(std::shared_ptr<std::vector<grpc::Slice>> slices)
      : slices_(std::move(slices)) {
    for (const auto& s : *slices_) left_ += s.size();
    Skip();
  }

  size_t left() const { return left_; }

  bool done() const { return index_ >= slices_->size(); }

  bool Copy(void* dst, size_t n) {
    char* out = static_cast<char*>(dst);
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = (*slices_)[index_];
      const size_t take = std::min(n, s.size() - offset_);
      std::memcpy(out, s.begin() + offset_, take);
      out += take;
      n -= take;
      Advance(take);
    }
    return true;
  }

  // Pointer to `n` contiguous bytes if they lie in the current slice.
  const char* Peek(size_t n) const {
    if (done()) return nullptr;
    const grpc::Slice& s = (*slices_)[index_];
    if (s.size() - offset_ < n) return nullptr;
    return reinterpret_cast<const char*>(s.begin()) + offset_;
  }

  bool Reference(size_t n, Blob* blob) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = (*slices_)[index_];
      const size_t take = std::min(n, s.size() - offset_);
      blob->pieces.emplace_back(reinterpret_cast<const char*>(s.begin()) + offset_, take);
      n -= take;
      Advance(take);
    }
    blob->owner = slices_;
    return true;
  }

  void Advance(size_t n) {
    offset_ += n;
    left_ -= n;
    Skip();
  }

 private:
  void Skip() {
    while (index_ < slices_->size() && offset_ >= (*slices_)[index_].size()) {
      offset_ = 0;
      ++index_;
    }
  }
  std::shared_ptr<std::vector<grpc::Slice>> slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
  size_t left_ = 0;
};

}  // namespace

size_t FrameSize(const Frame& frame) {
  Frame copy;
  copy.header = frame.header;
  copy.header.set_payload_size(frame.payload.bytes.size());
  for (const auto& [k, v] : frame.payload.extensions) (*copy.header.mutable_extensions())[k] = v;
  copy.header.clear_blob_sizes();
  size_t blobs = 0;
  for (const auto& b : frame.payload.blobs) {
    copy.header.add_blob_sizes(b.size());
    blobs += b.size();
  }
  return 4 + copy.header.ByteSizeLong() + frame.payload.bytes.size() + blobs;
}

size_t AppendFrame(Frame frame, std::vector<grpc::Slice>* out) {
  FillSizes(frame);
  const uint32_t header_len = static_cast<uint32_t>(frame.header.ByteSizeLong());
  std::string head;
  head.resize(4 + header_len + frame.payload.bytes.size());
  std::memcpy(head.data(), &header_len, 4);
  frame.header.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(head.data() + 4));
  if (!frame.payload.bytes.empty()) {
    std::memcpy(head.data() + 4 + header_len, frame.payload.bytes.data(),
                frame.payload.bytes.size());
  }
  size_t total = head.size();
  out->emplace_back(head);
  for (auto& blob : frame.payload.blobs) {
    for (const auto& piece : blob.pieces) {
      if (piece.empty()) continue;
      total += piece.size();
      out->emplace_back(const_cast<char*>(piece.data()), piece.size(), &ReleaseOwner,
                        new std::shared_ptr<const void>(blob.owner));
    }
  }
  return total;
}

absl::Status ParsePacket(grpc::ByteBuffer* packet, PacketSource source, std::vector<Frame>* out) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  grpc::Status dumped = packet->Dump(slices.get());
  if (!dumped.ok()) {
    return absl::DataLossError(absl::StrCat("unreadable packet: ", dumped.error_message()));
  }
  SliceReader reader(slices);
  while (!reader.done()) {
    uint32_t header_len = 0;
    if (!reader.Copy(&header_len, 4)) {
      return absl::DataLossError("truncated frame length");
    }
    if (header_len > reader.left()) return absl::DataLossError("truncated frame header");
    if (header_len > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
      return absl::DataLossError(
          absl::StrCat("frame header of ", header_len, " bytes exceeds 2 GiB"));
    }
    Frame frame;
    bool parsed = false;
    const size_t body_left = reader.left() - header_len;
    if (const char* p = reader.Peek(header_len)) {
      RETURN_IF_ERROR(CheckHeaderCounts(p, header_len, body_left));
      parsed = frame.header.ParseFromArray(p, static_cast<int>(header_len));
      reader.Advance(header_len);
    } else {
      std::string buf(header_len, '\0');
      if (!reader.Copy(buf.data(), header_len)) {
        return absl::DataLossError("truncated frame header");
      }
      RETURN_IF_ERROR(CheckHeaderCounts(buf.data(), header_len, body_left));
      parsed = frame.header.ParseFromString(buf);
    }
    if (!parsed) return absl::DataLossError("malformed frame header");
    // Each size is checked against what is left before it is added, so the
    // sum cannot wrap around.
    uint64_t declared = 0;
    const auto declare = [&](uint64_t n, absl::string_view what) {
      if (n > reader.left() - declared) {
        return absl::DataLossError(absl::StrCat(
            "frame declares ", what, " of ", n, " bytes but the packet has ",
            reader.left() - declared, " left after the ", declared, " declared before"));
      }
      declared += n;
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(declare(frame.header.payload_size(), "a payload"));
    for (int i = 0; i < frame.header.blob_sizes_size(); ++i) {
      const uint64_t size = frame.header.blob_sizes(i);
      if (size > reader.left() - declared) {
        return declare(size, absl::StrCat("blob ", i));  // names the blob
      }
      declared += size;
    }
    frame.payload.bytes.resize(frame.header.payload_size());
    if (!reader.Copy(frame.payload.bytes.data(), frame.header.payload_size())) {
      return absl::DataLossError("truncated frame payload");
    }
    frame.payload.blobs.resize(frame.header.blob_sizes_size());
    for (int i = 0; i < frame.header.blob_sizes_size(); ++i) {
      if (!reader.Reference(frame.header.blob_sizes(i), &frame.payload.blobs[i])) {
        return absl::DataLossError(absl::StrCat("truncated blob ", i));
      }
      frame.payload.blobs[i].written_by_grpc = source == PacketSource::kGrpc;
    }
    for (const auto& [k, v] : frame.header.extensions()) frame.payload.extensions[k] = v;
    out->push_back(std::move(frame));
  }
  return absl::OkStatus();
}

}  // namespace baton::rpc::internal
