#include "comm/internal/shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/host.h"
#include "base/shm_segment.h"
#include "base/status.h"

namespace baton::comm::internal {
namespace {

struct alignas(64) PaddedCounter {
  std::atomic<uint32_t> v;
  char pad[64 - sizeof(std::atomic<uint32_t>)];
};

constexpr size_t kHeaderBytes = 4096;  // slots start page-aligned
constexpr int kSpins = 1000;           // ~50 us of pause before sleeping on the futex

bool AtLeast(uint32_t v, uint32_t g) { return static_cast<int32_t>(v - g) >= 0; }

void FutexWait(std::atomic<uint32_t>* a, uint32_t expected, absl::Duration d) {
  timespec ts = absl::ToTimespec(d);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* a) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(a), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Ranks that print the same string share this host's /dev/shm.
std::string ShmIdentity() {
  const char* env = std::getenv("BATON_COMM_SHM");
  if (env != nullptr && std::string(env) == "0") return "off";
  const std::string boot_id = BootId();
  struct stat shm {};
  struct stat mnt {};
  if (boot_id.empty() || stat("/dev/shm", &shm) != 0 || stat("/proc/self/ns/mnt", &mnt) != 0) {
    return absl::StrCat("unavailable:", getpid());  // never equal across processes
  }
  return absl::StrCat(boot_id, ":", shm.st_dev, ":", shm.st_ino, ":", mnt.st_ino);
}

}  // namespace

struct ShmAllReduce::Header {
  PaddedCounter arrive[kMaxRanks];
  PaddedCounter done[kMaxRanks];
};
static_assert(sizeof(ShmAllReduce::Header) <= kHeaderBytes, "header too large");

absl::StatusOr<std::unique_ptr<ShmAllReduce>> ShmAllReduce::Create(const BackendContext& ctx) {
  if (ctx.size < 2 || ctx.size > kMaxRanks) return nullptr;
  store::Store& store = *ctx.store;
  const std::string key = absl::StrCat(ctx.prefix, "shm/");
  const std::string where = absl::StrCat("shared-memory setup of group '", ctx.group_name, "'");
  auto get = [&](const std::string& k) -> absl::StatusOr<std::string> {
    return store.Get(k, ctx.timeout);
  };
  // 1. Same host and /dev/shm everywhere (and nobody turned it off)?
  const std::string me = ShmIdentity();
  if (absl::Status s = store.Set(absl::StrCat(key, "host/", ctx.rank), me); !s.ok()) {
    return Annotate(s, where);
  }
  bool same = me != "off";
  for (int k = 0; k < ctx.size; ++k) {
    auto v = get(absl::StrCat(key, "host/", k));
    if (!v.ok()) return Annotate(v.status(), where);
    same = same && *v == me;
  }
  if (!same) return nullptr;
  // 2. Rank 0 creates the segment; everyone maps it and says whether it could.
  const size_t bytes = kHeaderBytes + static_cast<size_t>(ctx.size) * kSlotBytes;
  std::string name;
  ShmSegment segment;
  if (ctx.rank == 0) {
    // Created with its pages reserved: a /dev/shm too small for them (a
    // container's default 64 MB, say) means Gloo, not SIGBUS on first touch.
    auto created =
        ShmSegment::Create(absl::StrCat("/baton-ar-", getpid(), "-", RandomHex(8)), bytes);
    if (created.ok()) {
      segment = *std::move(created);
      name = segment.name();
    }
    if (absl::Status s = store.Set(absl::StrCat(key, "name"), name); !s.ok()) {
      segment.Unlink();
      return Annotate(s, where);
    }
  } else {
    auto v = get(absl::StrCat(key, "name"));
    if (!v.ok()) return Annotate(v.status(), where);
    name = *v;
    if (!name.empty()) {
      auto opened = ShmSegment::Open(name, bytes);
      if (opened.ok()) segment = *std::move(opened);
    }
  }
  if (name.empty()) return nullptr;  // rank 0 could not create it: Gloo for all
  const bool mapped = segment.mapped();
  absl::Status s = store.Set(absl::StrCat(key, "ok/", ctx.rank), mapped ? "1" : "0");
  bool all = mapped && s.ok();
  for (int k = 0; k < ctx.size && s.ok(); ++k) {
    auto v = get(absl::StrCat(key, "ok/", k));
    if (!v.ok()) s = v.status();
    all = all && v.ok() && *v == "1";
  }
  // Every rank has mapped it (or given up): nothing needs the name any more.
  if (ctx.rank == 0) segment.Unlink();
  if (!s.ok()) return Annotate(s, where);
  if (!all) return nullptr;
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(ctx.rank, ctx.size, std::move(segment)));
}

ShmAllReduce::ShmAllReduce(int rank, int size, ShmSegment segment)
    : rank_(rank),
      size_(size),
      segment_(std::move(segment)),
      base_(segment_.data()),
      header_(static_cast<Header*>(base_)) {}

ShmAllReduce::~ShmAllReduce() = default;

char* ShmAllReduce::slot(int k) const {
  return static_cast<char*>(base_) + kHeaderBytes + static_cast<size_t>(k) * kSlotBytes;
}

bool ShmAllReduce::WaitAll(std::atomic<uint32_t>* const* counters, uint32_t g, absl::Time deadline,
                           std::string* late) {
  for (int k = 0; k < size_; ++k) {
    std::atomic<uint32_t>* c = counters[k];
    int spins = 0;
    while (true) {
      const uint32_t v = c->load(std::memory_order_acquire);
      if (AtLeast(v, g)) break;
      if (aborted_.load(std::memory_order_relaxed)) return false;
      if (++spins < kSpins) {
        CpuRelax();
        continue;
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        std::vector<int> behind;
        for (int j = 0; j < size_; ++j) {
          if (!AtLeast(counters[j]->load(std::memory_order_acquire), g)) behind.push_back(j);
        }
        *late = absl::StrJoin(behind, ", ");
        return false;
      }
      FutexWait(c, v, std::min(deadline - now, absl::Milliseconds(5)));
    }
  }
  return true;
}

absl::Status ShmAllReduce::Fail(const std::string& late, const char* what) {
  // The round cannot be completed: the channel's counters no longer agree.
  aborted_.store(true);
  if (late.empty()) {
    return absl::CancelledError("the shared-memory all-reduce was aborted");
  }
  return absl::DeadlineExceededError(absl::StrCat("shared-memory all-reduce timed out: ranks ",
                                                  late, " did not ", what, " in time"));
}

absl::Status ShmAllReduce::Run(const at::Tensor& t, const ReduceFn& fn, absl::Time deadline) {
  if (aborted_.load()) {
    return absl::CancelledError("the shared-memory all-reduce channel was aborted");
  }
  std::atomic<uint32_t>* arrive[kMaxRanks];
  std::atomic<uint32_t>* done[kMaxRanks];
  for (int k = 0; k < size_; ++k) {
    arrive[k] = &header_->arrive[k].v;
    done[k] = &header_->done[k].v;
  }
  char* data = static_cast<char*>(t.data_ptr());
  const size_t esize = t.element_size();
  const size_t total = t.nbytes();
  const size_t chunk = (kSlotBytes / esize) * esize;
  for (size_t off = 0; off < total; off += chunk) {
    const size_t len = std::min(chunk, total - off);
    const uint32_t g = ++generation_;
    std::string late;
    // Step 1 (shm_allreduce.h): every rank finished reading the previous round's slots.
    if (!WaitAll(done, g - 1, deadline, &late)) {
      return Fail(late, "finish the previous round");
    }
    // Step 2: publish this rank's chunk.
    std::memcpy(slot(rank_), data + off, len);
    arrive[rank_]->store(g, std::memory_order_release);
    FutexWake(arrive[rank_]);
    // Step 3: fold every rank's chunk in rank order.
    if (!WaitAll(arrive, g, deadline, &late)) {
      return Fail(late, "arrive");
    }
    std::memcpy(data + off, slot(0), len);
    for (int k = 1; k < size_; ++k) fn(data + off, data + off, slot(k), len / esize);
    done[rank_]->store(g, std::memory_order_release);
    FutexWake(done[rank_]);
  }
  return absl::OkStatus();
}

}  // namespace baton::comm::internal
