// The bulk channel's receiving side (bulk_channel.h): each connection's
// reader (B2, B5-B10) and Import.
#include "rpc/channel/tcp/bulk_channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#include "rpc/channel/tcp/bulk_channel_internal.h"
#include "rpc/channel/tcp/connection.h"
#include "rpc/channel/tcp/socket_io.h"

namespace baton::rpc::internal {

using bulk::After;
using bulk::Hello;
using bulk::kMagic;
using bulk::kMaxHelloField;
using bulk::kVersion;
using bulk::RecordHeader;
using tcp::NoDelay;
using tcp::SameBytes;
using tcp::SetTimeout;
using tcp::Tolerate;

void BulkChannel::ReadLoop(std::shared_ptr<Incoming> in) {
  tcp::BlockSigpipeOnThisThread();  // TLS writes (connection.h)
  const int fd = in->fd;
  SetTimeout(fd, options_.handshake_timeout);
  std::unique_ptr<tcp::Connection> conn;
  if (tls_ == nullptr) {
    conn = tcp::PlainConnection(fd);
  } else {  // the job's TLS: mutual TLS 1.3 before the hello, or no connection (B9)
    auto secured = tcp::TlsServerConnection(fd, tls_, options_.handshake_timeout);
    if (secured.ok()) {
      conn = *std::move(secured);
      conn->SetTimeout(options_.handshake_timeout);
    }
  }
  Hello hello{};
  std::string token, identity;
  bool ok = conn != nullptr && conn->ReadAll(&hello, sizeof hello) && hello.magic == kMagic &&
            hello.version == kVersion && hello.token_len <= kMaxHelloField &&
            hello.identity_len <= kMaxHelloField &&
            hello.lane < static_cast<uint32_t>(options_.lanes);
  if (ok) {
    token.resize(hello.token_len);
    identity.resize(hello.identity_len);
    ok = conn->ReadAll(token.data(), token.size()) &&
         conn->ReadAll(identity.data(), identity.size()) && SameBytes(token, options_.job_token);
  }
  absl::StatusOr<int> peer = ok ? authenticate_(identity) : absl::UnauthenticatedError("hello");
  const int lane_index = static_cast<int>(hello.lane);
  std::shared_ptr<Arrivals> arr;
  std::vector<std::function<void()>> wake;  // waits the new floor ends
  {
    absl::MutexLock lock(&mu_);
    --handshaking_;
    if (closed_ || !peer.ok() || *peer < 0) {
      ++stats_.connections_refused;
      conn.reset();
      shutdown(fd, SHUT_RDWR);
      close(fd);
      in->fd = -1;
      in->done = true;
      return;
    }
    auto& slot = arrivals_[*peer];
    if (slot == nullptr) slot = std::make_shared<Arrivals>();
    arr = slot;
    const bool restarted = arr->identity != identity;
    if (restarted) {  // B6: a new incarnation of the sender
      for (Arrivals::Lane& lane : arr->lanes) {
        lane.blobs.clear();
        lane.floor = 0;
        lane.next_id = 0;
        lane.unclaimed = 0;
        lane.seen = false;
      }
      arr->stripes.clear();
      arr->failed.clear();
      arr->identity = identity;
      ++arr->epoch;  // the waits begun before fail (Import)
      wake.swap(arr->waiters);
    }
    // B7: the sender left its earlier connections of this lane (they broke,
    // or it was told another address): what they still carry and it did
    // not resend (B8) is lost with them, and the ids below first_id that
    // have not arrived will not. A new incarnation ends the old one's
    // connections on every lane (B6): nothing they still bring is kept.
    for (const auto& other : in_) {
      if (other != in && other->peer == *peer && (other->lane == lane_index || restarted) &&
          !other->done && other->fd >= 0) {
        other->superseded = true;  // reads nothing more (it may be in a budget wait)
        shutdown(other->fd, SHUT_RDWR);
      }
    }
    Arrivals::Lane& lane = arr->lanes[lane_index];
    if (hello.first_id > lane.floor) {
      lane.floor = hello.first_id;
      for (auto& w : arr->waiters) wake.push_back(std::move(w));
      arr->waiters.clear();
    }
    ++lane.live;
    lane.seen = true;
    in->peer = *peer;
    in->lane = lane_index;
  }
  for (auto& w : wake) w();  // they take the lock (Import)
  conn->SetTimeout(absl::ZeroDuration());
  NoDelay(fd);
  Tolerate(fd, options_.silence_timeout);
  const char ack = 1;
  bool reading = conn->WriteAll({{const_cast<char*>(&ack), 1}});
  Arrivals::Lane& lane = arr->lanes[lane_index];  // guarded by mu_
  while (reading) {
    RecordHeader h{};
    if (!conn->ReadAll(&h, sizeof h) || h.size > options_.max_blob_bytes ||
        h.total > options_.max_blob_bytes || h.size > h.total || h.offset > h.total - h.size ||
        (h.stripe == 0 && (h.offset != 0 || h.total != h.size)) || (h.stripe != 0 && h.size == 0)) {
      break;
    }
    // B8: an id already passed is a resend of a record read before; B6:
    // one below the floor belongs to frames that failed. Decided again
    // after each wait: another connection may have brought it meanwhile.
    auto fresh = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return h.id >= lane.next_id && h.id >= lane.floor;
    };
    bool keep;
    std::shared_ptr<Arrivals::Stripe> stripe;  // B10: the slice's
    std::shared_ptr<char> data;
    {
      absl::MutexLock lock(&mu_);
      auto find_stripe = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Arrivals::Stripe* {
        auto it = arr->stripes.find(h.stripe);
        return h.stripe == 0 || it == arr->stripes.end() ? nullptr : it->second.get();
      };
      // B5: wait while what this lane read and no frame claimed is over the
      // budget. A whole record is charged its size, a stripe its total once,
      // when its first slice comes (its other slices wait for nothing). A
      // lane holding nothing unclaimed always reads one more: each lane
      // delivers in frame order, so the oldest frame's records are never
      // held back behind later ones. B10: a slice also waits while a part
      // of its stripe it overlaps is still being read by a connection of
      // its lane that the sender left (the slice is a resend of that part).
      auto dropped = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !fresh() || (h.stripe != 0 && std::find(arr->failed.begin(), arr->failed.end(),
                                                       h.stripe) != arr->failed.end());
      };
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (closed_ || in->superseded || dropped()) return true;
        if (const Arrivals::Stripe* s = find_stripe(); s != nullptr) {
          return std::none_of(s->taken.begin(), s->taken.end(), [&](const auto& t) {
            return t.owner != nullptr && t.owner->superseded && h.offset < t.end &&
                   t.begin < h.offset + h.size;
          });
        }
        return lane.unclaimed == 0 ||
               lane.unclaimed + Arrivals::ChargeOf(h.stripe != 0 ? h.total : h.size) <=
                   options_.unclaimed_budget;
      };
      mu_.Await(absl::Condition(&room));
      if (closed_ || in->superseded) break;
      keep = !dropped();
      if (keep && h.stripe != 0) {
        auto& slot = arr->stripes[h.stripe];
        if (slot == nullptr) {
          slot = std::make_shared<Arrivals::Stripe>();
          slot->total = h.total;
          slot->lane = lane_index;
          slot->data = buffers_->Allocate(h.total);
          if (slot->data == nullptr) {
            arr->stripes.erase(h.stripe);
            break;
          }
          lane.unclaimed += Arrivals::ChargeOf(h.total);
        }
        stripe = slot;
        const uint64_t begin = h.offset, end = h.offset + h.size;
        // A slice that overlaps another, names another total, comes after
        // its stripe was complete or makes it more slices than lanes breaks
        // the protocol (B10).
        const bool overlaps =
            std::any_of(stripe->taken.begin(), stripe->taken.end(),
                        [&](const auto& t) { return begin < t.end && t.begin < end; });
        if (stripe->total != h.total || stripe->done == stripe->total || overlaps ||
            stripe->taken.size() >= static_cast<size_t>(kMaxLanes)) {
          break;
        }
        stripe->taken.push_back({begin, end, in.get()});
        data = stripe->data;
      }
    }
    if (!keep) {
      if (!conn->Discard(h.size)) break;
    } else {
      if (stripe == nullptr) data = buffers_->Allocate(h.size);
      const bool read = data != nullptr && conn->ReadAll(data.get() + h.offset, h.size);
      std::vector<std::function<void()>> wake;
      {
        absl::MutexLock lock(&mu_);
        auto it = stripe == nullptr ? arr->stripes.end() : arr->stripes.find(h.stripe);
        const bool current =
            stripe == nullptr || (it != arr->stripes.end() && it->second == stripe);
        const bool stored =
            read && !in->superseded && fresh() && current &&
            lane.blobs.emplace(h.id, Arrivals::Arrived{data, h.size, h.stripe, h.offset, h.total})
                .second;
        // The part this reader took (its stripe is current: only it
        // releases that part).
        auto taken = stripe == nullptr
                         ? std::vector<Arrivals::Taken>::iterator()
                         : std::find_if(stripe->taken.begin(), stripe->taken.end(),
                                        [&](const auto& t) { return t.owner == in.get(); });
        if (stripe != nullptr && current && taken != stripe->taken.end()) {
          if (stored) {
            taken->owner = nullptr;  // read
            stripe->done += h.size;
            stripe->slices.emplace_back(lane_index, h.id);
          } else {
            // Not kept: its part may come again (B8); a stripe left with
            // nothing read or being read goes, with its charge.
            stripe->taken.erase(taken);
            if (stripe->taken.empty()) arr->DropStripe(h.stripe);
          }
        }
        if (!read || in->superseded) break;
        if (stored) {
          lane.next_id = After(h.id);
          if (stripe == nullptr) lane.unclaimed += Arrivals::ChargeOf(h.size);
          ++stats_.blobs_received;
          stats_.bytes_received += h.size;
          wake.swap(arr->waiters);
        }
      }
      for (auto& w : wake) w();
    }
    // B8: acknowledged once read (kept or dropped).
    if (!conn->WriteAll({{&h.id, sizeof h.id}})) break;
  }
  conn.reset();  // before Ended closes the socket
  Ended(in);
}

absl::StatusOr<bool> BulkChannel::Import(int peer, Frame& frame, std::function<void()> ready,
                                         uint64_t* wait_epoch) {
  const auto& entries = frame.header.tcp_blobs();
  if (entries.empty()) return true;
  // Each blob's entries by offset: one whole record, or the slices of a
  // stripe (B10) covering it exactly once.
  std::vector<std::vector<const proto::TcpBlob*>> parts(frame.payload.blobs.size());
  absl::flat_hash_set<std::pair<uint32_t, uint64_t>> ids;
  auto bad = [&](const proto::TcpBlob& e, absl::string_view why) {
    return absl::DataLossError(absl::StrCat("bad bulk-channel entry (blob ", e.index(), " of ",
                                            frame.payload.blobs.size(), ", lane ", e.lane(),
                                            ", id ", e.id(), ", ", e.size(), " bytes at ",
                                            e.offset(), ") from worker ", peer, ": ", why));
  };
  for (const proto::TcpBlob& e : entries) {
    if (e.index() >= frame.payload.blobs.size() || frame.payload.blobs[e.index()].size() != 0) {
      return bad(e, "no such blob, or it did not travel empty");
    }
    if (e.lane() >= kMaxLanes || !ids.insert({e.lane(), e.id()}).second) {
      return bad(e, "no such lane, or its id named twice");
    }
    if (e.size() > options_.max_blob_bytes || e.offset() > options_.max_blob_bytes ||
        parts[e.index()].size() >= kMaxLanes) {
      return bad(e, "too large, or in too many slices");
    }
    parts[e.index()].push_back(&e);
  }
  std::vector<uint64_t> totals(parts.size(), 0);
  for (size_t i = 0; i < parts.size(); ++i) {
    std::sort(parts[i].begin(), parts[i].end(),
              [](const auto* a, const auto* b) { return a->offset() < b->offset(); });
    for (const proto::TcpBlob* e : parts[i]) {
      if (e->offset() != totals[i] || (e->size() == 0 && parts[i].size() > 1) ||
          e->stripe() != parts[i][0]->stripe() || (e->stripe() == 0) != (parts[i].size() == 1)) {
        return bad(*e, "slices that do not cover the blob once, or of different stripes");
      }
      totals[i] += e->size();
    }
    if (totals[i] > options_.max_blob_bytes) return bad(*parts[i][0], "too large");
  }
  absl::MutexLock lock(&mu_);
  auto it = arrivals_.find(peer);
  std::shared_ptr<Arrivals> arr = it == arrivals_.end() ? nullptr : it->second;
  if (closed_ || arr == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("no bulk connection from worker ", peer, " brings blob id ", entries[0].id()));
  }
  // A frame that cannot complete leaves nothing behind: what of it arrived
  // is released (it no longer counts against the budget, B5), stripes with
  // all of their slices.
  auto fail = [&](absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const proto::TcpBlob& e : entries) {
      // A stripe goes with its slices, and those still to come are dropped.
      if (e.stripe() != 0) arr->Failed(e.stripe());
      auto& blobs = arr->lanes[e.lane()].blobs;
      auto node = blobs.find(e.id());
      if (node == blobs.end()) continue;
      if (node->second.stripe != 0) {
        arr->Failed(node->second.stripe);
      } else {
        arr->lanes[e.lane()].unclaimed -= Arrivals::ChargeOf(node->second.size);
        blobs.erase(node);
      }
    }
    return s;
  };
  if (wait_epoch != nullptr) {
    if (*wait_epoch == 0) *wait_epoch = arr->epoch;
    if (*wait_epoch != arr->epoch) {
      // What its ids name now is the new incarnation's: left alone.
      return absl::UnavailableError(absl::StrCat(
          "worker ", peer, " restarted before the frame's bulk blobs arrived (blob id ",
          entries[0].id(), ")"));
    }
  }
  for (const proto::TcpBlob& e : entries) {
    Arrivals::Lane& lane = arr->lanes[e.lane()];
    if (lane.blobs.contains(e.id())) continue;
    if (!lane.seen) {  // the sender names only lanes it has connected (B10)
      return fail(
          absl::UnavailableError(absl::StrCat("no bulk connection from worker ", peer, " on lane ",
                                              e.lane(), " brings blob id ", e.id())));
    }
    if (e.id() < lane.floor) {
      return fail(absl::UnavailableError(
          absl::StrCat("worker ", peer, " gave up blob id ", e.id(), " on the bulk channel")));
    }
    if (Abandoned(*arr, static_cast<int>(e.lane()))) {
      // B6: what these frames wanted is dropped if it comes after all.
      for (const proto::TcpBlob& f : entries) {
        Arrivals::Lane& l = arr->lanes[f.lane()];
        l.floor = std::max(l.floor, After(f.id()));
      }
      return fail(absl::UnavailableError(
          absl::StrCat("the bulk connection from worker ", peer, " ended before blob id ", e.id(),
                       " arrived, and it did not resume within ",
                       absl::FormatDuration(options_.silence_timeout))));
    }
    if (e.id() < lane.next_id) {
      return fail(absl::DataLossError(absl::StrCat("bulk blob id ", e.id(), " from worker ", peer,
                                                   " was claimed by another frame")));
    }
    arr->waiters.push_back(std::move(ready));
    return false;
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) continue;
    const Arrivals::Arrived& head = arr->lanes[parts[i][0]->lane()].blobs.at(parts[i][0]->id());
    for (const proto::TcpBlob* e : parts[i]) {
      const Arrivals::Arrived& got = arr->lanes[e->lane()].blobs.at(e->id());
      // One whole record, or every slice of one stripe (B10).
      const bool fits = got.size == e->size() && got.offset == e->offset() &&
                        got.total == totals[i] && got.stripe == e->stripe();
      if (!fits) {
        return fail(absl::DataLossError(absl::StrCat(
            "bulk blob id ", e->id(), " (lane ", e->lane(), ") from worker ", peer, " has ",
            got.size, " bytes at ", got.offset, " of ", got.total, " (stripe ", got.stripe,
            "); its frame says ", e->size(), " at ", e->offset(), " of ", totals[i])));
      }
    }
    if (head.stripe != 0) {
      const Arrivals::Stripe& stripe = *arr->stripes.at(head.stripe);
      if (stripe.slices.size() != parts[i].size()) {
        return fail(absl::DataLossError(
            absl::StrCat("bulk stripe ", head.stripe, " from worker ", peer, " has ",
                         stripe.slices.size(), " slices; its frame names ", parts[i].size())));
      }
    }
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) continue;
    auto& head_lane = arr->lanes[parts[i][0]->lane()].blobs;
    const Arrivals::Arrived head = head_lane.at(parts[i][0]->id());
    if (head.stripe != 0) {
      arr->DropStripe(head.stripe);  // its slices, and its charge
    } else {
      head_lane.erase(parts[i][0]->id());
      arr->lanes[parts[i][0]->lane()].unclaimed -= Arrivals::ChargeOf(head.size);
    }
    Blob& blob = frame.payload.blobs[i];
    blob.pieces.clear();
    blob.pieces.emplace_back(head.data.get(), head.total);
    blob.owner = head.data;
  }
  return true;
}

}  // namespace baton::rpc::internal
