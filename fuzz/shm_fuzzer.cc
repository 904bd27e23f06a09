// libFuzzer target: ShmBlob descriptors (rpc/channel/shm/shm_channel.*), the
// entries of FrameHeader.shm_blobs that make a worker read a blob out of a
// peer's shared-memory segment. A hostile peer controls them all; it must not
// make the worker map, read or write anything but a segment the peer owns
// (name), within that segment (size, capacity), at the generation it wrote
// (generation).
//
// Setup: a sending channel (the peer) and a receiving one in this process,
// and decoys next to the peer's segments: objects named like a same-host
// transport hub, a link and a probe of this process, and a segment of a
// process in another PID namespace.
//
// Input: u8 flags (bit 0: the receiver names the sender, as
// Import(frame, sender_prefix)), u8 number of blobs (1-3), per blob a u16
// (bit 15 set: a large blob of kMinBytes + 64 * low byte bytes, which the
// sender exports to a segment; else a small blob of low byte bytes that stays
// on the stream), then up to 8 edits of the descriptors, each u8 entry, u8
// operation and its argument (see Edit below).
//
// Checks, besides the sanitizers: no decoy changes; a frame the receiver
// accepts names only the sender's segments (when the sender is known), at
// their current generation, and each blob holds exactly the segment's bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fuzz/fuzz_input.h"
#include "rpc/channel/shm/shm_channel.h"

namespace baton::rpc::internal {
namespace {

constexpr size_t kHeaderBytes = 64;
constexpr size_t kDecoyBytes = (size_t{2} << 20) + kHeaderBytes;
constexpr size_t kCheckedBytes = 4096;

struct Decoy {
  std::string name;
  bool foreign_segment = false;  // named like a segment of another namespace
  const char* base = nullptr;    // read-only mapping
  std::string original;          // its first kCheckedBytes
};

struct State {
  ShmChannel sender;
  ShmChannel receiver;
  ShmChannel cleanup;  // releases what the fuzzed frame left busy
  std::string prefix;
  std::vector<Decoy> decoys;
  std::set<std::string> segments;  // every segment the sender ever used
  std::map<std::string, std::pair<const char*, size_t>> mapped;
};

State* state = nullptr;

// Maps the whole object `name` read-only; its size goes to *bytes.
const char* MapReadOnly(const std::string& name, size_t* bytes) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    *bytes = static_cast<size_t>(st.st_size);
    p = mmap(nullptr, *bytes, PROT_READ, MAP_SHARED, fd, 0);
  }
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<const char*>(p);
}

// "/baton.<digits>.<digits>.s<digits>": how every segment is named.
bool LooksLikeSegment(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  auto digits = [](absl::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return parts.size() == 4 && parts[0] == "/baton" && digits(parts[1]) && digits(parts[2]) &&
         parts[3].size() > 1 && parts[3][0] == 's' && digits(parts[3].substr(1));
}

void MakeDecoy(const std::string& name, bool foreign_segment) {
  shm_unlink(name.c_str());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(ftruncate(fd, kDecoyBytes) == 0);
  // A zero "generation" word, then a pattern a stray write would change.
  std::string contents(kDecoyBytes, '\xa5');
  std::memset(contents.data(), 0, 8);
  FUZZ_CHECK(pwrite(fd, contents.data(), contents.size(), 0) ==
             static_cast<ssize_t>(contents.size()));
  close(fd);
  Decoy d;
  d.name = name;
  d.foreign_segment = foreign_segment;
  size_t bytes = 0;
  d.base = MapReadOnly(name, &bytes);
  FUZZ_CHECK(d.base != nullptr && bytes == kDecoyBytes);
  d.original.assign(d.base, kCheckedBytes);
  state->decoys.push_back(std::move(d));
}

void RemoveDecoys() {
  if (state == nullptr) return;
  for (const Decoy& d : state->decoys) shm_unlink(d.name.c_str());
  state->sender.Close();
  state->receiver.Close();
  state->cleanup.Close();
}

// The sender's segment `name`, mapped read-only, and its size.
std::pair<const char*, size_t> Segment(const std::string& name) {
  auto it = state->mapped.find(name);
  if (it != state->mapped.end()) return it->second;
  size_t bytes = 0;
  const char* base = MapReadOnly(name, &bytes);
  FUZZ_CHECK(base != nullptr);
  return state->mapped[name] = {base, bytes};
}

std::string Contents(const Blob& b) {
  std::string out(b.size(), '\0');
  b.CopyTo(out.data());
  return out;
}

Blob BlobOf(std::string bytes) {
  auto owner = std::make_shared<std::string>(std::move(bytes));
  Blob b;
  if (!owner->empty()) b.pieces.emplace_back(owner->data(), owner->size());
  b.owner = owner;
  return b;
}

// One edit of the exported descriptors, as a hostile sender would make it.
void Edit(fuzz::FuzzReader& in, Frame& frame) {
  auto* entries = frame.header.mutable_shm_blobs();
  const int which = in.U8() % (entries->size() + 1);
  if (which == entries->size()) {  // a new entry, a copy of the first or blank
    proto::ShmBlob* added = entries->Add();
    if (entries->size() > 1) *added = entries->Get(0);
  }
  proto::ShmBlob& e = *entries->Mutable(which);
  const auto small = [&in] { return static_cast<int64_t>(static_cast<int8_t>(in.U8())); };
  switch (in.U8() % 13) {
    case 0: e.set_index(in.U32()); break;
    case 1: e.set_size(in.U64()); break;
    case 2: e.set_size(e.size() + small()); break;
    case 3: e.set_capacity(in.U64()); break;
    case 4: {
      const int shift = small();
      e.set_capacity(shift >= 0 ? e.capacity() << (shift % 64) : e.capacity() >> (-shift % 64));
      break;
    }
    case 5: e.set_generation(in.U64()); break;
    case 6: e.set_generation(e.generation() + small()); break;
    case 7: e.set_name(state->decoys[in.U8() % state->decoys.size()].name); break;
    case 8: e.set_name(in.Chunk()); break;
    case 9: e.set_name(absl::StrCat(state->prefix, in.Chunk())); break;
    case 10: e.set_name(absl::StrCat(e.name(), in.Chunk())); break;
    case 11: entries->DeleteSubrange(which, 1); break;
    case 12: {
      auto& blobs = frame.payload.blobs;
      if (!blobs.empty()) blobs[in.U8() % blobs.size()] = BlobOf(in.Chunk());
      break;
    }
  }
}

void Setup() {
  ShmChannel::Sweep();  // what crashed runs of this target left behind
  state = new State();
  state->prefix = ShmChannel::ObjectPrefix(getpid());
  MakeDecoy(absl::StrCat(state->prefix, "hub.fuzz"), false);
  MakeDecoy(absl::StrCat(state->prefix, "l1.fuzz"), false);
  MakeDecoy(absl::StrCat(state->prefix, "p999"), false);
  MakeDecoy(absl::StrCat("/baton.1.", getpid(), ".s7"), true);
  std::atexit(RemoveDecoys);
}

int FuzzOne(const uint8_t* data, size_t size) {
  static uint64_t counter = 0;
  baton::fuzz::FuzzReader in(data, size);
  const bool name_sender = (in.U8() & 1) != 0;
  const int blobs = 1 + in.U8() % 3;
  Frame frame;
  for (int i = 0; i < blobs; ++i) {
    const uint16_t spec = in.U16();
    const size_t n =
        (spec & 0x8000) != 0 ? ShmChannel::kMinBytes + 64 * (spec & 0xff) : (spec & 0xff);
    std::string bytes(n, '\0');
    for (size_t k = 0; k < n; k += 512) bytes[k] = static_cast<char>(++counter);
    frame.payload.blobs.push_back(BlobOf(std::move(bytes)));
  }
  state->sender.Export(frame, absl::Now() + absl::Seconds(10));
  for (const proto::ShmBlob& e : frame.header.shm_blobs()) state->segments.insert(e.name());
  const Frame exported = frame;
  for (int edits = in.U8() % 9; edits > 0; --edits) Edit(in, frame);

  const absl::Status s =
      name_sender ? state->receiver.Import(frame, state->prefix) : state->receiver.Import(frame);

  for (const Decoy& d : state->decoys) {
    FUZZ_CHECK(std::memcmp(d.base, d.original.data(), kCheckedBytes) == 0);
  }
  if (s.ok()) {
    for (const proto::ShmBlob& e : frame.header.shm_blobs()) {
      FUZZ_CHECK(LooksLikeSegment(e.name()));
      // Without the sender's name, a segment of another process is accepted.
      if (!name_sender && state->segments.count(e.name()) == 0) continue;
      FUZZ_CHECK(state->segments.count(e.name()) == 1);
      const auto [seg, bytes] = Segment(e.name());
      uint64_t write_gen = 0;
      std::memcpy(&write_gen, seg, sizeof(write_gen));
      FUZZ_CHECK(e.generation() == write_gen);
      FUZZ_CHECK(kHeaderBytes + e.size() <= bytes);
      const Blob& b = frame.payload.blobs[e.index()];
      FUZZ_CHECK(b.size() == e.size());
      FUZZ_CHECK(Contents(b) == std::string(seg + kHeaderBytes, e.size()));
    }
  }
  // An honest receiver of each exported entry pins and releases whatever the
  // fuzzed receiver left unpinned (one frame per entry: an entry the fuzzed
  // frame pinned fails its pin here and goes when `frame` goes), so every
  // segment is free again and the sender's pool stays small.
  for (const proto::ShmBlob& e : exported.header.shm_blobs()) {
    Frame honest;
    honest.payload.blobs = exported.payload.blobs;
    *honest.header.add_shm_blobs() = e;
    (void)state->cleanup.Import(honest, state->prefix);
  }
  return 0;
}

}  // namespace
}  // namespace baton::rpc::internal

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  baton::rpc::internal::Setup();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return baton::rpc::internal::FuzzOne(data, size);
}
