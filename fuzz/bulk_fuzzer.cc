// libFuzzer target: the receiving end of the network bulk channel
// (rpc/channel/tcp/bulk_channel.*): what a peer's bytes on its bulk
// connection and the FrameHeader.tcp_blobs entries of its frames make a
// worker read, allocate and hand out. A hostile peer controls both.
//
// Setup: one receiving channel in this process (max_blob_bytes 4096), whose
// authenticator accepts identities "w0#<anything>" as worker 0 (each input
// presents another, so it starts from nothing: B6 drops what an earlier
// incarnation left).
//
// Input: u8 flags (bit 0: the hello carries the job token, else another;
// bit 1: a wrong magic; bit 2: the identity proves no worker; bit 3: lane 1,
// else lane 0; bit 4: a lane beyond the channel's two), u16 length and that
// many bytes written after the hello (records: id, size, stripe, offset,
// total, u64 each, then the bytes; or anything), then up to 4 frames to
// import, each u8 number of entries (1-3) and per entry u8 index, u8 id,
// u16 size, u16 offset and u8 stripe (mod 8; on the hello's lane), and u8
// number of blobs the frame has (0-3), of which those not named travel with
// 8 bytes.
//
// The input's bytes are written, the connection half-closed, and the
// channel's end of it read until it closes, so every record is read before
// any frame is imported.
//
// Checks, besides the sanitizers: a frame's import fails or fills exactly
// the blobs it names, each with the bytes of the record of that id that a
// correct reader keeps from the input (records up to the first bad one; one
// whose id is below one kept before is a resend, dropped: B8), or for a
// stripe (B10) the bytes of its slices in the order of their offsets, and a
// record's bytes are handed out once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_input.h"
#include "rpc/channel/tcp/bulk_channel.h"

namespace baton::rpc::internal {
namespace {

constexpr uint64_t kMaxBlob = 4096;
constexpr char kToken[] = "fuzz-token";

// A record a correct reader keeps (B3, B10).
struct Kept {
  std::string bytes;
  uint64_t stripe = 0, offset = 0, total = 0;
};

BulkChannel* channel = nullptr;
uint64_t incarnation = 0;
// What the last accepted connection carried, and what frames took of it:
// a rejected hello leaves the last incarnation's blobs in place.
std::map<uint64_t, Kept>* current = nullptr;
std::set<uint64_t>* handed_out = nullptr;

int Connect() {
  const std::string& address = channel->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // libFuzzer's -timeout alarm (SIGALRM) interrupts system calls here:
  // connect, send and read carry on through EINTR.
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    FUZZ_CHECK(errno == EINTR);
    pollfd p{fd, POLLOUT, 0};
    int ready;
    do {
      ready = poll(&p, 1, 10000);
    } while (ready < 0 && errno == EINTR);
    int error = 0;
    socklen_t len = sizeof error;
    FUZZ_CHECK(ready == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0);
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// The records a correct reader keeps from `raw` (B3, B5, B8, B10): up to
// the first truncated, oversized or inconsistent one, or a slice that
// breaks its stripe (overlaps another, names another total, comes after
// the stripe was complete), without resends (an id below the next one
// expected).
std::map<uint64_t, Kept> Records(const std::string& raw) {
  std::map<uint64_t, Kept> out;
  struct Stripe {
    uint64_t total = 0, done = 0;
    std::vector<std::pair<uint64_t, uint64_t>> taken;
  };
  std::map<uint64_t, Stripe> stripes;
  uint64_t next = 0;
  size_t at = 0;
  while (raw.size() - at >= 40) {
    uint64_t id, size, stripe, offset, total;
    std::memcpy(&id, raw.data() + at, 8);
    std::memcpy(&size, raw.data() + at + 8, 8);
    std::memcpy(&stripe, raw.data() + at + 16, 8);
    std::memcpy(&offset, raw.data() + at + 24, 8);
    std::memcpy(&total, raw.data() + at + 32, 8);
    at += 40;
    if (size > kMaxBlob || total > kMaxBlob || size > total || offset > total - size ||
        (stripe == 0 && (offset != 0 || total != size)) || (stripe != 0 && size == 0)) {
      break;
    }
    const bool fresh = id >= next;
    if (fresh && stripe != 0) {
      Stripe& s = stripes[stripe];
      if (s.taken.empty()) s.total = total;
      bool overlaps = false;
      for (const auto& [b, e] : s.taken) overlaps = overlaps || (offset < e && b < offset + size);
      if (s.total != total || s.done == s.total || overlaps) break;
      s.taken.emplace_back(offset, offset + size);
    }
    if (raw.size() - at < size) break;
    if (fresh) {
      out[id] = Kept{raw.substr(at, size), stripe, offset, total};
      if (stripe != 0) stripes[stripe].done += size;
      next = id + 1;
    }
    at += size;
  }
  return out;
}

}  // namespace
}  // namespace baton::rpc::internal

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace baton::rpc::internal;
  BulkChannelOptions o;
  o.job_token = kToken;
  o.max_blob_bytes = kMaxBlob;
  o.unclaimed_budget = 64 << 20;  // never waited for: the input is at most 64 KiB
  o.handshake_timeout = absl::Seconds(5);
  auto c = BulkChannel::Start(o, [](const std::string& identity) -> absl::StatusOr<int> {
    if (absl::StartsWith(identity, "w0#")) return 0;
    return absl::PermissionDeniedError("no such worker");
  });
  FUZZ_CHECK(c.ok());
  channel = c->release();  // lives for the process
  current = new std::map<uint64_t, Kept>();
  handed_out = new std::set<uint64_t>();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::rpc::internal;
  baton::fuzz::FuzzReader in(data, size);
  const uint8_t flags = in.U8();
  const std::string raw = in.Bytes(in.U16());
  const std::string token = (flags & 1) ? kToken : "not the token";
  const std::string identity = (flags & 4) ? "stranger" : absl::StrCat("w0#", ++incarnation);
  const uint32_t lane = ((flags >> 3) & 1) + ((flags & 16) ? 2 : 0);
  const uint32_t hello[4] = {(flags & 2) ? 0x11111111u : 0x424e5442u, 3,
                             static_cast<uint32_t>(token.size()),
                             static_cast<uint32_t>(identity.size())};
  std::string bytes(reinterpret_cast<const char*>(hello), sizeof hello);
  const uint64_t first_id = 0;
  bytes.append(reinterpret_cast<const char*>(&first_id), sizeof first_id);
  const uint32_t lane_field[2] = {lane, 0};
  bytes.append(reinterpret_cast<const char*>(lane_field), sizeof lane_field);
  bytes += token + identity + raw;
  const int fd = Connect();
  // The channel may close before it read everything (a bad hello or
  // record): a failed write is part of the game.
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t w = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    at += static_cast<size_t>(w);
  }
  shutdown(fd, SHUT_WR);
  // Until the channel closed its end: it read every record (or stopped).
  char sink[256];
  for (;;) {
    const ssize_t r = read(fd, sink, sizeof sink);
    if (r > 0 || (r < 0 && errno == EINTR)) continue;
    FUZZ_CHECK(r == 0 || errno == ECONNRESET);
    break;
  }
  close(fd);
  if ((flags & 23) == 1) {  // accepted: a new incarnation, its records only
    *current = Records(raw);
    handed_out->clear();
  }
  for (int frames = 0; frames < 4 && !in.empty(); ++frames) {
    baton::rpc::Frame f;
    const int entries = 1 + in.U8() % 3;
    for (int e = 0; e < entries; ++e) {
      baton::proto::TcpBlob* t = f.header.add_tcp_blobs();
      t->set_index(in.U8() % 4);
      t->set_id(in.U8());
      t->set_size(in.U16());
      t->set_offset(in.U16());
      t->set_stripe(in.U8() % 8);
      t->set_lane(lane);
    }
    const int blobs = in.U8() % 4;
    std::vector<std::shared_ptr<std::string>> keep;
    for (int b = 0; b < blobs; ++b) {
      baton::rpc::Blob blob;
      bool named = false;
      for (const auto& t : f.header.tcp_blobs())
        named = named || t.index() == static_cast<uint32_t>(b);
      if (!named) {
        keep.push_back(std::make_shared<std::string>(8, 'x'));
        blob.pieces.emplace_back(keep.back()->data(), 8);
        blob.owner = keep.back();
      }
      f.payload.blobs.push_back(std::move(blob));
    }
    absl::StatusOr<bool> got = channel->Import(0, f, [] {});
    if (!got.ok() || !*got) continue;
    // Each named blob: its records' bytes by offset (one whole record, or
    // every slice of one stripe).
    std::map<uint32_t, std::map<uint64_t, const Kept*>> parts;
    for (const auto& t : f.header.tcp_blobs()) {
      auto it = current->find(t.id());
      FUZZ_CHECK(it != current->end());
      FUZZ_CHECK(handed_out->insert(t.id()).second);
      FUZZ_CHECK(it->second.bytes.size() == t.size() && it->second.offset == t.offset() &&
                 it->second.stripe == t.stripe());
      FUZZ_CHECK(parts[t.index()].emplace(t.offset(), &it->second).second);
    }
    for (const auto& [index, slices] : parts) {
      std::string want;
      for (const auto& [offset, kept] : slices) {
        FUZZ_CHECK(offset == want.size());
        FUZZ_CHECK(kept->stripe == slices.begin()->second->stripe);
        want += kept->bytes;
      }
      FUZZ_CHECK(want.size() == slices.begin()->second->total);
      const baton::rpc::Blob& blob = f.payload.blobs[index];
      FUZZ_CHECK(blob.size() == want.size());
      FUZZ_CHECK(blob.size() == 0 || std::memcmp(blob.contiguous(), want.data(), want.size()) == 0);
    }
  }
  return 0;
}
