#include "ps/internal/shared_tables.h"

#include <unistd.h>

#include <cstring>
#include <random>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rpc/channel/shm/shm_channel.h"

namespace baton::ps::internal {
namespace {

constexpr uint64_t kBoardMagic = 0x445241424D505342;  // "BSPMBARD"
constexpr uint64_t kBoxMagic = 0x58424D4441524742;    // "BGRADMBX"
constexpr size_t kHeaderBytes = 4096;
constexpr int64_t kChunkAlign = 64;

uint64_t NewNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (static_cast<uint64_t>(getpid()) << 16);
}

// The copies below run while another process (or, in tests, another
// thread) may write the same bytes; the sequence counts decide afterwards
// whether the copy is kept (SD1). Not a data race the program acts on, so
// ThreadSanitizer is told to ignore it.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BATON_SEQLOCK_COPY __attribute__((no_sanitize("thread")))
#endif
#endif
#ifndef BATON_SEQLOCK_COPY
#define BATON_SEQLOCK_COPY
#endif

BATON_SEQLOCK_COPY void CopyBytes(void* dst, const void* src, size_t n) {
  std::memcpy(dst, src, n);
}

// Whether `t` may be copied to or from table `table`'s chunk of `l`: a
// contiguous host tensor of the chunk's numel and element size.
absl::Status CheckChunk(const DenseLayout& l, int table, const at::Tensor& t,
                        absl::string_view what) {
  if (table < 0 || table >= static_cast<int>(l.offset.size()) || l.offset[table] < 0 ||
      !t.defined() || !t.is_cpu() || !t.is_contiguous() || t.numel() != l.numel[table] ||
      t.scalar_type() != l.dtype[table]) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": table ", table, " has no chunk of ", t.defined() ? t.numel() : 0,
                     " elements of ", t.defined() ? c10::toString(t.scalar_type()) : "none",
                     " here, or the tensor is not a contiguous host tensor"));
  }
  return absl::OkStatus();
}

}  // namespace

DenseLayout MakeDenseLayout(const PsSpec& spec, const ShardPlan& plan, int server) {
  DenseLayout l;
  l.offset.assign(spec.tables.size(), -1);
  l.numel.assign(spec.tables.size(), 0);
  l.dtype.assign(spec.tables.size(), at::kFloat);
  for (size_t i = 0; i < spec.tables.size(); ++i) {
    if (spec.tables[i].kind != TableKind::kDense) continue;
    const DenseChunk c = plan.ChunkOf(static_cast<int>(i), server);
    if (c.size() == 0) continue;
    l.offset[i] = l.bytes;
    l.numel[i] = c.size();
    l.dtype[i] = spec.tables[i].dtype;
    const int64_t n = c.size() * static_cast<int64_t>(c10::elementSize(spec.tables[i].dtype));
    l.bytes += (n + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  }
  return l;
}

// ---- SharedSegment ----

SharedSegment::SharedSegment(Parts parts, DenseLayout layout)
    : segment_(std::move(parts.segment)),
      announced_(std::move(parts.announced)),
      layout_(std::move(layout)),
      marker_(std::move(parts.marker)) {}

SharedSegment::~SharedSegment() {
  if (marker_ != nullptr) segment_.Unlink();  // the creator's
}

absl::StatusOr<SharedSegment::Parts> SharedSegment::CreateParts(const std::string& name,
                                                                int64_t buffer_bytes,
                                                                size_t total) {
  const std::string prefix = rpc::internal::ShmChannel::ObjectPrefix(getpid());
  ASSIGN_OR_RETURN(auto marker, rpc::internal::LivenessMarker::Create(prefix));
  Parts parts;
  parts.marker = std::move(marker);
  parts.announced.nonce = NewNonce();
  parts.announced.bytes = buffer_bytes;
  parts.announced.name = absl::StrCat(prefix, name, ".", absl::Hex(parts.announced.nonce));
  auto seg = ShmSegment::Create(parts.announced.name, total, /*populate=*/true);
  if (!seg.ok()) return seg.status();
  parts.segment = *std::move(seg);
  return parts;
}

absl::StatusOr<SharedSegment::Parts> SharedSegment::OpenParts(const SharedName& announced,
                                                              const DenseLayout& layout,
                                                              size_t total, uint64_t magic,
                                                              absl::string_view what) {
  if (announced.bytes != layout.bytes) {
    return absl::FailedPreconditionError(absl::StrCat(what, " ", announced.name, ": announced ",
                                                      announced.bytes, " bytes per buffer, ",
                                                      "this side's layout has ", layout.bytes));
  }
  ASSIGN_OR_RETURN(auto seg, ShmSegment::Open(announced.name, total));
  // Every header starts with the magic number, the nonce and the size.
  uint64_t head[3];
  std::memcpy(head, seg.data(), sizeof(head));
  if (head[0] != magic || head[1] != announced.nonce ||
      head[2] != static_cast<uint64_t>(announced.bytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", announced.name,
                     ": the object holds another segment than the one announced (another host's "
                     "object of the same name, or a stale one)"));
  }
  Parts parts;
  parts.segment = std::move(seg);
  parts.announced = announced;
  return parts;
}

// ---- ParameterBoard ----

struct ParameterBoard::Header {
  uint64_t magic;
  uint64_t nonce;
  uint64_t bytes;
  alignas(64) std::atomic<int64_t> current;  // buffer readers go to; -1: none yet
  struct alignas(64) Buffer {
    std::atomic<uint64_t> seq;  // odd while written
    std::atomic<int64_t> version;
  } buffers[2];
};
static_assert(std::atomic<int64_t>::is_always_lock_free);

ParameterBoard::Header* ParameterBoard::header() const {
  static_assert(sizeof(Header) <= kHeaderBytes);
  return static_cast<Header*>(segment_.data());
}
char* ParameterBoard::buffer(int b) const {
  return static_cast<char*>(segment_.data()) + kHeaderBytes + b * layout_.bytes;
}

absl::StatusOr<std::unique_ptr<ParameterBoard>> ParameterBoard::Create(const DenseLayout& layout,
                                                                       int server) {
  auto parts =
      CreateParts(absl::StrCat("psboard", server), layout.bytes, kHeaderBytes + 2 * layout.bytes);
  if (!parts.ok()) return parts.status();
  auto* h = new (parts->segment.data()) Header;
  h->magic = kBoardMagic;
  h->nonce = parts->announced.nonce;
  h->bytes = layout.bytes;
  h->current.store(-1, std::memory_order_relaxed);
  for (auto& b : h->buffers) {
    b.seq.store(0, std::memory_order_relaxed);
    b.version.store(-1, std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_release);
  return std::unique_ptr<ParameterBoard>(new ParameterBoard(*std::move(parts), layout));
}

absl::StatusOr<std::unique_ptr<ParameterBoard>> ParameterBoard::Open(const SharedName& announced,
                                                                     const DenseLayout& layout) {
  auto parts =
      OpenParts(announced, layout, kHeaderBytes + 2 * layout.bytes, kBoardMagic, "parameter board");
  if (!parts.ok()) return parts.status();
  return std::unique_ptr<ParameterBoard>(new ParameterBoard(*std::move(parts), layout));
}

int64_t ParameterBoard::version() const {
  const int64_t b = header()->current.load(std::memory_order_acquire);
  return b < 0 ? -1 : header()->buffers[b].version.load(std::memory_order_acquire);
}

void ParameterBoard::Publish(int64_t version, const std::vector<at::Tensor>& chunks) {
  Header* h = header();
  const int64_t current = h->current.load(std::memory_order_relaxed);
  const int b = current == 0 ? 1 : 0;  // the buffer readers are not sent to
  auto& buf = h->buffers[b];
  const uint64_t seq = buf.seq.load(std::memory_order_relaxed);
  buf.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < chunks.size() && i < layout_.offset.size(); ++i) {
    if (layout_.offset[i] < 0 || !chunks[i].defined()) continue;
    const at::Tensor c = chunks[i].contiguous();
    CopyBytes(buffer(b) + layout_.offset[i], c.data_ptr(), c.nbytes());
  }
  buf.version.store(version, std::memory_order_relaxed);
  buf.seq.store(seq + 2, std::memory_order_release);
  h->current.store(b, std::memory_order_release);
}

absl::StatusOr<int64_t> ParameterBoard::Read(
    int64_t min_version, const std::vector<std::pair<int, at::Tensor>>& into) const {
  for (const auto& [table, dst] : into) {
    RETURN_IF_ERROR(CheckChunk(layout_, table, dst, "parameter board read"));
  }
  const Header* h = header();
  for (int attempt = 0; attempt < kReadTries; ++attempt) {
    const int64_t b = h->current.load(std::memory_order_acquire);
    if (b < 0) break;
    const auto& buf = h->buffers[b];
    const uint64_t seq = buf.seq.load(std::memory_order_acquire);
    if (seq % 2 == 1) continue;  // the writer came round to it again
    const int64_t version = buf.version.load(std::memory_order_relaxed);
    if (version < min_version) break;  // SD2: not there (cannot happen with a live server)
    for (const auto& [table, dst] : into) {
      CopyBytes(dst.data_ptr(), buffer(static_cast<int>(b)) + layout_.offset[table], dst.nbytes());
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (buf.seq.load(std::memory_order_relaxed) == seq) return version;
  }
  return absl::UnavailableError(absl::StrCat("parameter board ", announced_.name,
                                             ": no whole version >= ", min_version, " to read"));
}

// ---- GradientBox ----

struct GradientBox::Header {
  uint64_t magic;
  uint64_t nonce;
  uint64_t bytes;
  alignas(64) std::atomic<uint64_t> written;   // the trainer's last generation
  alignas(64) std::atomic<uint64_t> released;  // the server's (SD3)
};

GradientBox::Header* GradientBox::header() const {
  static_assert(sizeof(Header) <= kHeaderBytes);
  return static_cast<Header*>(segment_.data());
}
char* GradientBox::data() const { return static_cast<char*>(segment_.data()) + kHeaderBytes; }

absl::StatusOr<std::unique_ptr<GradientBox>> GradientBox::Create(const DenseLayout& layout,
                                                                 int trainer, int server) {
  ASSIGN_OR_RETURN(auto parts, CreateParts(absl::StrCat("psgrad", trainer, "-", server),
                                           layout.bytes, kHeaderBytes + layout.bytes));
  auto* h = new (parts.segment.data()) Header;
  h->magic = kBoxMagic;
  h->nonce = parts.announced.nonce;
  h->bytes = layout.bytes;
  h->written.store(0, std::memory_order_relaxed);
  h->released.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  return std::unique_ptr<GradientBox>(new GradientBox(std::move(parts), layout));
}

absl::StatusOr<std::shared_ptr<GradientBox>> GradientBox::Open(const SharedName& announced,
                                                               const DenseLayout& layout) {
  ASSIGN_OR_RETURN(auto parts, OpenParts(announced, layout, kHeaderBytes + layout.bytes, kBoxMagic,
                                         "gradient box"));
  return std::shared_ptr<GradientBox>(new GradientBox(std::move(parts), layout));
}

bool GradientBox::Free() const {
  const Header* h = header();
  return h->released.load(std::memory_order_acquire) == h->written.load(std::memory_order_relaxed);
}

absl::StatusOr<uint64_t> GradientBox::Write(const std::vector<std::pair<int, at::Tensor>>& grads) {
  for (const auto& [table, g] : grads) {
    if (table < 0 || table >= static_cast<int>(layout_.offset.size()) ||
        layout_.offset[table] < 0 || !g.defined() || g.numel() != layout_.numel[table] ||
        g.scalar_type() != layout_.dtype[table]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient box ", announced_.name, ": no chunk of ", g.defined() ? g.numel() : 0,
          " elements of ", g.defined() ? c10::toString(g.scalar_type()) : "none", " for table ",
          table));
    }
  }
  Header* h = header();
  for (const auto& [table, g] : grads) {
    at::Tensor dst = at::from_blob(data() + layout_.offset[table], {layout_.numel[table]},
                                   at::TensorOptions().dtype(layout_.dtype[table]));
    dst.copy_(g.reshape(-1));
  }
  const uint64_t generation = h->written.load(std::memory_order_relaxed) + 1;
  h->written.store(generation, std::memory_order_release);
  return generation;
}

absl::StatusOr<std::vector<at::Tensor>> GradientBox::Views(const std::shared_ptr<GradientBox>& box,
                                                           uint64_t generation,
                                                           const std::vector<int>& tables,
                                                           const PsSpec& spec) {
  Header* h = box->header();
  if (generation == 0 || h->written.load(std::memory_order_acquire) != generation) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient box ", box->announced_.name, ": the push names generation ",
                     generation, ", the box holds ", h->written.load(std::memory_order_relaxed)));
  }
  // One hold for all the views: the generation is released when the last
  // of them is freed (SD3).
  struct Hold {
    std::shared_ptr<GradientBox> box;
    uint64_t generation = 0;
    ~Hold() {
      if (box != nullptr) box->header()->released.store(generation, std::memory_order_release);
    }
  };
  auto hold = std::make_shared<Hold>();
  hold->box = box;
  hold->generation = generation;
  std::vector<at::Tensor> views;
  for (int table : tables) {
    if (table < 0 || table >= static_cast<int>(box->layout_.offset.size()) ||
        box->layout_.offset[table] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("gradient box ", box->announced_.name,
                                                     ": no chunk of table ", table, " in it"));
    }
    views.push_back(at::from_blob(
        box->data() + box->layout_.offset[table], {box->layout_.numel[table]}, [hold](void*) {},
        at::TensorOptions().dtype(spec.tables[table].dtype)));
  }
  return views;
}

}  // namespace baton::ps::internal
