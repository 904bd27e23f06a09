#include "rpc/internal/wire.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace baton::rpc::internal {
namespace {

void ReleaseOwner(void* user_data) {
  delete static_cast<std::shared_ptr<const void>*>(user_data);
}

void FillSizes(Frame& frame) {
  for (const auto& [k, v] : frame.payload.extensions) (*frame.header.mutable_extensions())[k] = v;
  frame.header.set_payload_size(frame.payload.bytes.size());
  frame.header.clear_blob_sizes();
  for (const auto& b : frame.payload.blobs) frame.header.add_blob_sizes(b.size());
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
  frame.header.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(head.data() + 4));
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
      out->emplace_back(const_cast<char*>(piece.data()), piece.size(),
                        &ReleaseOwner, new std::shared_ptr<const void>(blob.owner));
    }
  }
  return total;
}

absl::Status ParsePacket(grpc::ByteBuffer* packet, std::vector<Frame>* out) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  grpc::Status dumped = packet->Dump(slices.get());
  if (!dumped.ok()) {
    return absl::DataLossError(absl::StrCat("unreadable packet: ",
                                            dumped.error_message()));
  }
  SliceReader reader(slices);
  while (!reader.done()) {
    uint32_t header_len = 0;
    if (!reader.Copy(&header_len, 4)) {
      return absl::DataLossError("truncated frame length");
    }
    if (header_len > reader.left()) return absl::DataLossError("truncated frame header");
    if (header_len > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
      return absl::DataLossError(absl::StrCat("frame header of ", header_len,
                                              " bytes exceeds 2 GiB"));
    }
    Frame frame;
    bool parsed = false;
    if (const char* p = reader.Peek(header_len)) {
      parsed = frame.header.ParseFromArray(p, static_cast<int>(header_len));
      reader.Advance(header_len);
    } else {
      std::string buf(header_len, '\0');
      if (!reader.Copy(buf.data(), header_len)) {
        return absl::DataLossError("truncated frame header");
      }
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
    if (absl::Status s = declare(frame.header.payload_size(), "a payload"); !s.ok()) return s;
    for (int i = 0; i < frame.header.blob_sizes_size(); ++i) {
      absl::Status s = declare(frame.header.blob_sizes(i), absl::StrCat("blob ", i));
      if (!s.ok()) return s;
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
    }
    for (const auto& [k, v] : frame.header.extensions()) frame.payload.extensions[k] = v;
    out->push_back(std::move(frame));
  }
  return absl::OkStatus();
}

}  // namespace baton::rpc::internal
