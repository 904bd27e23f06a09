#include "rpc/channel/shm/shm_channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/shm_segment.h"
#include "base/status_macros.h"

namespace baton::rpc::internal {
namespace {

// Object names are /baton.<ns>.<pid>.<kind><k>: unique per process, so the
// counter is too (several agents of one process each have a channel; the
// names they share are the process's, as its pid is).
std::atomic<uint64_t> next_object{0};

constexpr char kPrefix[] = "baton.";
constexpr size_t kHeaderBytes = 64;
constexpr size_t kMinSegment = 1 << 20;

bool IsDecimal(absl::string_view s) {
  return !s.empty() && s.size() <= 20 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct alignas(64) SegmentHeader {
  std::atomic<uint64_t> write_gen;
  std::atomic<uint64_t> released_gen;
  // Who may use generation g (S2, S3): 2g while the sender holds it for a
  // receiver, 2g+1 once the receiver pinned it, 0 once the sender reclaimed
  // it unpinned. Changed only by compare-and-swap after Export's store.
  std::atomic<uint64_t> claim;
  // The pinning receiver: its pid and the inode of its PID namespace.
  std::atomic<int64_t> holder_pid;
  std::atomic<uint64_t> holder_pid_namespace;
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);

// The inode of this process's PID namespace (0 if unknown): pids are only
// comparable within one namespace.
uint64_t PidNamespaceInode() {
  static const uint64_t ino = [] {
    struct stat st {};
    return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  }();
  return ino;
}

// The same, as it appears in object names.
const std::string& PidNamespace() {
  static const std::string ns = std::to_string(PidNamespaceInode());
  return ns;
}

// S3: whether the receiver that pinned a segment is known to be gone. Only
// a holder of this PID namespace can be judged; any other is taken as alive
// (its segment waits for its release: a leak, never a reuse under it).
bool HolderGone(const SegmentHeader& h) {
  const int64_t pid = h.holder_pid.load(std::memory_order_acquire);
  if (pid <= 0 || h.holder_pid_namespace.load(std::memory_order_acquire) != PidNamespaceInode()) {
    return false;
  }
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

size_t RoundUpPow2(size_t n) {
  size_t c = kMinSegment;
  while (c < n) c <<= 1;
  return c;
}

}  // namespace

struct ShmChannel::Segment {
  std::string name;
  size_t capacity = 0;
  ShmSegment memory;
  uint64_t generation = 0;
  absl::Time busy_until = absl::InfinitePast();
  SegmentHeader* header() { return static_cast<SegmentHeader*>(memory.data()); }
  char* data() { return static_cast<char*>(memory.data()) + kHeaderBytes; }
};

// A peer's segment, mapped to read from.
struct ShmChannel::Mapping {
  ShmSegment memory;
};

ShmChannel::ShmChannel() : pid_(static_cast<int>(getpid())) {
  // S5: marked alive before any object exists (without a marker, a sweep
  // from another PID namespace leaves this channel's objects alone).
  auto marker = LivenessMarker::Create(ObjectPrefix(pid_));
  if (marker.ok()) alive_ = *std::move(marker);
}

ShmChannel::~ShmChannel() { Close(); }

ShmChannel::Segment* ShmChannel::Acquire(size_t size, absl::Time expiry) {
  const absl::Time now = absl::Now();
  Segment* best = nullptr;
  for (auto& s : segments_) {
    if (s->capacity < size || (best != nullptr && s->capacity >= best->capacity)) continue;
    SegmentHeader* h = s->header();
    bool free = h->released_gen.load(std::memory_order_acquire) == s->generation;
    if (!free && s->busy_until < now) {
      // S3: past its holder's deadline. Unpinned, the sender takes it back
      // (a late receiver's pin then fails); pinned, only if the receiver is
      // gone.
      uint64_t held = 2 * s->generation;
      free = h->claim.compare_exchange_strong(held, 0, std::memory_order_acq_rel) ||
             (held == 2 * s->generation + 1 && HolderGone(*h));
    }
    if (free) best = s.get();
  }
  if (best == nullptr) {
    const size_t capacity = RoundUpPow2(size);
    if (pool_bytes_ + capacity > kPoolBytes) return nullptr;
    auto seg = std::make_unique<Segment>();
    seg->name = absl::StrCat(ObjectPrefix(pid_), "s", next_object.fetch_add(1));
    seg->capacity = capacity;
    auto memory = ShmSegment::Create(seg->name, kHeaderBytes + capacity, /*populate=*/true);
    if (!memory.ok()) return nullptr;
    seg->memory = *std::move(memory);
    pool_bytes_ += capacity;
    segments_.push_back(std::move(seg));
    best = segments_.back().get();
  }
  best->generation += 1;
  best->busy_until = expiry;
  SegmentHeader* h = best->header();
  h->holder_pid.store(0, std::memory_order_relaxed);
  h->claim.store(2 * best->generation, std::memory_order_relaxed);
  // Publish the new generation before touching the data (a receiver of an
  // older one that has not pinned yet sees it changed).
  h->write_gen.store(best->generation, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return best;
}

void ShmChannel::Export(Frame& frame, absl::Time expiry) {
  auto& blobs = frame.payload.blobs;
  for (size_t i = 0; i < blobs.size(); ++i) {
    const size_t size = blobs[i].size();
    if (size < kMinBytes) continue;
    Segment* seg;
    {
      absl::MutexLock lock(&mu_);
      seg = Acquire(size, expiry);
    }
    if (seg == nullptr) continue;  // stays on the stream
    // The segment is ours until released or expired; copy outside the lock.
    blobs[i].CopyTo(seg->data());
    bytes_out_.fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    proto::ShmBlob* sb = frame.header.add_shm_blobs();
    sb->set_index(static_cast<uint32_t>(i));
    sb->set_name(seg->name);
    sb->set_size(size);
    sb->set_generation(seg->generation);
    sb->set_capacity(seg->capacity);
    blobs[i] = Blob();
  }
}

absl::StatusOr<std::shared_ptr<ShmChannel::Mapping>> ShmChannel::Map(const std::string& name,
                                                                     uint64_t capacity) {
  absl::MutexLock lock(&map_mu_);
  auto it = mappings_.find(name);
  if (it != mappings_.end() && it->second->memory.size() >= kHeaderBytes + capacity) {
    return it->second;
  }
  auto memory = ShmSegment::Open(name, kHeaderBytes + capacity, /*populate=*/true);
  if (!memory.ok()) {
    return absl::DataLossError(
        absl::StrCat("cannot map shared-memory segment: ", memory.status().message()));
  }
  auto m = std::make_shared<Mapping>();
  m->memory = *std::move(memory);
  mappings_[name] = m;
  return m;
}

bool ShmChannel::IsSegmentName(absl::string_view name, absl::string_view owner_prefix) {
  if (!owner_prefix.empty() && !absl::StartsWith(name, owner_prefix)) return false;
  // "/baton" "<ns>" "<pid>" "s<k>": nothing else, no empty or non-digit
  // parts (so no NUL byte or '/' either).
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  return parts.size() == 4 && parts[0] == "/baton" && IsDecimal(parts[1]) && IsDecimal(parts[2]) &&
         absl::StartsWith(parts[3], "s") && IsDecimal(parts[3].substr(1));
}

absl::Status ShmChannel::Import(Frame& frame, absl::string_view sender_prefix) {
  auto& blobs = frame.payload.blobs;
  for (const proto::ShmBlob& sb : frame.header.shm_blobs()) {
    std::string bad;
    if (sb.index() >= blobs.size()) {
      bad = absl::StrCat("blob ", sb.index(), " of a frame with ", blobs.size());
    } else if (blobs[sb.index()].size() != 0) {
      bad = absl::StrCat("blob ", sb.index(), " also travels on the stream");
    } else if (!IsSegmentName(sb.name(), sender_prefix)) {
      bad = sender_prefix.empty()
                ? std::string("not a segment name")
                : absl::StrCat("not a segment of the sender ('", sender_prefix, "s<k>')");
    } else if (sb.size() < kMinBytes || sb.size() > sb.capacity()) {
      bad = absl::StrCat("size ", sb.size(), " outside [", kMinBytes, ", capacity ", sb.capacity(),
                         "]");
    } else if (sb.capacity() < kMinSegment || sb.capacity() > kPoolBytes ||
               (sb.capacity() & (sb.capacity() - 1)) != 0) {
      bad = absl::StrCat("capacity ", sb.capacity(), " is not a segment's");
    } else if (sb.generation() == 0) {
      bad = "generation 0 was never written";
    }
    if (!bad.empty()) {
      return absl::DataLossError(
          absl::StrCat("bad shared-memory blob entry '", absl::CHexEscape(sb.name()), "': ", bad));
    }
    ASSIGN_OR_RETURN(std::shared_ptr<Mapping> m, Map(sb.name(), sb.capacity()));
    auto* header = static_cast<SegmentHeader*>(m->memory.data());
    const char* src = static_cast<const char*>(m->memory.data()) + kHeaderBytes;
    const uint64_t gen = sb.generation();
    // S2: pin the generation; the sender reclaimed it if the pin fails.
    uint64_t held = 2 * gen;
    if (header->write_gen.load(std::memory_order_acquire) != gen ||
        !header->claim.compare_exchange_strong(held, 2 * gen + 1, std::memory_order_acq_rel)) {
      return absl::DataLossError(absl::StrCat("shared-memory segment '", sb.name(),
                                              "' was reclaimed by its sender (generation ", gen,
                                              "); the call outlived its deadline"));
    }
    // Only the receiver that pinned it names itself (a late one whose pin
    // failed must not): until then the sender sees no holder to judge.
    header->holder_pid_namespace.store(PidNamespaceInode(), std::memory_order_relaxed);
    header->holder_pid.store(pid_, std::memory_order_release);
    // The blob is the segment's bytes, until its last user lets go: then
    // the sender may reuse the segment.
    Blob& b = blobs[sb.index()];
    b.pieces.clear();
    b.pieces.emplace_back(src, sb.size());
    b.owner = std::shared_ptr<const void>(src, [m, header, gen](const void*) {
      header->released_gen.store(gen, std::memory_order_release);
    });
  }
  return absl::OkStatus();
}

void ShmChannel::Close() {
  std::vector<std::unique_ptr<Segment>> segments;
  {
    absl::MutexLock lock(&mu_);
    segments.swap(segments_);
    pool_bytes_ = 0;
  }
  for (auto& s : segments) s->memory.Unlink();
  {
    absl::MutexLock lock(&map_mu_);
    mappings_.clear();
  }
  RemoveProbe();
}

std::string ShmChannel::ObjectPrefix(int pid) {
  return absl::StrCat("/", kPrefix, PidNamespace(), ".", pid, ".");
}

absl::StatusOr<std::unique_ptr<LivenessMarker>> LivenessMarker::Create(const std::string& prefix) {
  static std::atomic<uint64_t> next{0};
  const std::string suffix = absl::StrCat(getpid(), "-", next.fetch_add(1));
  // Created under a name Sweep() ignores, locked, then renamed: the marker
  // is never visible unlocked.
  const std::string hidden = absl::StrCat("/dev/shm/.baton-alive-", suffix);
  const std::string name = absl::StrCat(prefix, "alive.", suffix);
  const int fd = open(hidden.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("open(", hidden, "): ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 ||
      rename(hidden.c_str(), absl::StrCat("/dev/shm", name).c_str()) != 0) {
    const std::string why = std::strerror(errno);
    unlink(hidden.c_str());
    close(fd);
    return absl::UnavailableError(absl::StrCat("liveness marker ", name, ": ", why));
  }
  return std::unique_ptr<LivenessMarker>(new LivenessMarker(fd, name));
}

LivenessMarker::~LivenessMarker() {
  shm_unlink(name_.c_str());
  close(fd_);  // drops the lock
}

namespace {

// Whether the marker `name` (in /dev/shm) is held by a live process.
bool MarkerHeld(const std::string& name) {
  const int fd = open(absl::StrCat("/dev/shm/", name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // gone meanwhile: its holder released it
  const bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);
  return held;
}

}  // namespace

int ShmChannel::Sweep() {
  // baton.<ns>.<pid>.<kind><n>, grouped by creator (<ns>.<pid>).
  struct Creator {
    std::vector<std::string> objects;
    std::vector<std::string> markers;
  };
  std::map<std::string, Creator> creators;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    if (!absl::StartsWith(e->d_name, kPrefix)) continue;
    std::vector<std::string> parts = absl::StrSplit(e->d_name, '.');
    int pid = 0;
    if (parts.size() < 4 || !absl::SimpleAtoi(parts[2], &pid) || pid <= 0) continue;
    Creator& c = creators[absl::StrCat(parts[1], ".", parts[2])];
    (parts[3] == "alive" ? c.markers : c.objects).push_back(e->d_name);
  }
  closedir(d);
  int removed = 0;
  const std::string ns = PidNamespace();
  for (const auto& [key, c] : creators) {
    const std::string creator_ns = key.substr(0, key.find('.'));
    const int pid = std::atoi(key.c_str() + key.find('.') + 1);
    bool dead;
    if (!c.markers.empty()) {
      dead = std::none_of(c.markers.begin(), c.markers.end(), MarkerHeld);
    } else if (creator_ns == ns) {
      dead = kill(pid, 0) != 0 && errno == ESRCH;
    } else {
      dead = false;  // another namespace's pid, and no marker: cannot judge
    }
    if (!dead) continue;
    for (const std::string& name : c.objects) {
      if (shm_unlink(absl::StrCat("/", name).c_str()) == 0) ++removed;
    }
    for (const std::string& name : c.markers) shm_unlink(absl::StrCat("/", name).c_str());
  }
  return removed;
}

absl::StatusOr<std::string> ShmChannel::CreateProbe(const std::string& token) {
  const std::string name = absl::StrCat(ObjectPrefix(pid_), "p", next_object.fetch_add(1));
  auto probe = ShmSegment::Create(name, token.size());
  if (!probe.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot create a shared-memory object in /dev/shm: ",
                                               probe.status().message()));
  }
  std::memcpy(probe->data(), token.data(), token.size());
  absl::MutexLock lock(&mu_);
  probe_ = name;
  return name;
}

bool ShmChannel::CheckProbe(const std::string& name, const std::string& token) {
  if (!absl::StartsWith(name, absl::StrCat("/", kPrefix))) return false;
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  std::string buf(token.size(), '\0');
  const bool ok =
      pread(fd, buf.data(), buf.size(), 0) == static_cast<ssize_t>(buf.size()) && buf == token;
  close(fd);
  return ok;
}

void ShmChannel::RemoveProbe() {
  std::string probe;
  {
    absl::MutexLock lock(&mu_);
    probe.swap(probe_);
  }
  if (!probe.empty()) shm_unlink(probe.c_str());
}

size_t ShmChannel::busy_segments() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& s : segments_) {
    n += s->header()->released_gen.load(std::memory_order_acquire) != s->generation;
  }
  return n;
}

}  // namespace baton::rpc::internal
