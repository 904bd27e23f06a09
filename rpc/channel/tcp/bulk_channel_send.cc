// The bulk channel's sending side (bulk_channel.h): Export, each lane's
// writer and its connections (B1-B3, B7-B10).
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

using bulk::Hello;
using bulk::kMagic;
using bulk::kStripeAlign;
using bulk::kVersion;
using bulk::RecordHeader;
using bulk::SliceOf;
using tcp::Connect;
using tcp::NoDelay;
using tcp::Tolerate;

void BulkChannel::Export(int peer, Frame& frame) {
  if (!Wants(frame)) return;
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  auto it = out_.find(peer);
  if (it == out_.end()) return;
  std::vector<Outgoing*> ready;
  for (const std::shared_ptr<Outgoing>& out : it->second) {
    if (out->state == Outgoing::State::kReady) {
      ready.push_back(out.get());
      continue;
    }
    const bool start = out->state == Outgoing::State::kIdle ||
                       (out->state == Outgoing::State::kBroken && absl::Now() >= out->retry_at);
    if (start) {
      // The last writer has set kBroken and takes no lock again: the join
      // is short.
      if (out->thread.joinable()) out->thread.join();
      out->state = Outgoing::State::kConnecting;
      out->thread = std::thread([this, out] { WriteLoop(out); });
    }
  }
  if (ready.empty()) return;
  Outgoing& first = *it->second[0];
  auto add = [&](Outgoing& out, size_t index, Blob blob, uint64_t stripe, uint64_t offset,
                 uint64_t total) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    proto::TcpBlob* entry = frame.header.add_tcp_blobs();
    entry->set_index(static_cast<uint32_t>(index));
    entry->set_id(out.next_id);
    entry->set_size(blob.size());
    entry->set_lane(static_cast<uint32_t>(out.lane));
    entry->set_offset(offset);
    entry->set_stripe(stripe);
    out.queue.push_back({out.next_id++, std::move(blob), stripe, offset, total});
  };
  for (size_t i = 0; i < frame.payload.blobs.size(); ++i) {
    Blob& blob = frame.payload.blobs[i];
    const size_t size = blob.size();
    // Over max_blob_bytes: the receiver would refuse the record (B5).
    if (size < options_.min_bytes || size > options_.max_blob_bytes) continue;
    // With two lanes up or more, a blob of stripe_min_bytes or more is cut
    // into at most one 4 KiB-aligned slice per lane that is up (B10).
    if (ready.size() > 1 && size >= options_.stripe_min_bytes) {
      const uint64_t stripe = first.next_stripe++;
      const size_t per_lane = (size + ready.size() - 1) / ready.size();
      const size_t slice =
          std::max<size_t>(1, (per_lane + kStripeAlign - 1) / kStripeAlign) * kStripeAlign;
      for (size_t k = 0, offset = 0; offset < size; ++k, offset += slice) {
        add(*ready[k], i, SliceOf(blob, offset, std::min(slice, size - offset)), stripe, offset,
            size);
      }
    } else {
      Outgoing* least = *std::min_element(ready.begin(), ready.end(), [](auto* a, auto* b) {
        return a->queue.size() + a->sent.size() < b->queue.size() + b->sent.size();
      });
      add(*least, i, std::move(blob), 0, 0, size);
    }
    // The frame carries it empty (B3): a moved-from Blob's state is not
    // specified, so empty it on purpose.
    blob.pieces.clear();  // NOLINT(bugprone-use-after-move)
    blob.owner.reset();
  }
}

void BulkChannel::WriteLoop(std::shared_ptr<Outgoing> out) {
  tcp::BlockSigpipeOnThisThread();  // TLS writes (connection.h)
  // B8: after a connection that was up broke, connections follow every
  // retry_after while records wait, until this time.
  absl::Time resume_until = absl::InfinitePast();
  for (;;) {
    const ConnectionEnd end = RunConnection(out);
    std::deque<Outgoing::Item> given_up;  // its memory goes after the lock
    absl::MutexLock lock(&mu_);
    if (end == ConnectionEnd::kStopped || out->stop || closed_) return;
    // What was not acknowledged goes first on the next connection.
    while (!out->sent.empty()) {
      out->queue.push_front(std::move(out->sent.back()));
      out->sent.pop_back();
    }
    const absl::Time now = absl::Now();
    // The window starts at the first break and again after each connection
    // that got a record through: one the receiver always refuses does not
    // keep the sender trying.
    if (end == ConnectionEnd::kBroke && (out->progressed || resume_until == absl::InfinitePast())) {
      resume_until = now + options_.silence_timeout / 2;
    }
    if (out->queue.empty() || now >= resume_until) {
      // Nothing to resume, or given up: the next connection (on the next
      // export) names the next new id, and the peer's waits below it end.
      given_up.swap(out->queue);
      out->state = Outgoing::State::kBroken;
      out->retry_at = now + options_.retry_after;
      return;
    }
    auto stopping = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return out->stop || closed_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.retry_after);
    if (out->stop || closed_) return;
  }
}

BulkChannel::ConnectionEnd BulkChannel::RunConnection(const std::shared_ptr<Outgoing>& out) {
  std::string address, identity;
  {
    absl::MutexLock lock(&mu_);
    out->state = Outgoing::State::kConnecting;
    address = out->address;
    identity = out->identity;
  }
  // The connect, and the TLS handshake after it, each within this.
  const absl::Duration handshake = std::min(options_.handshake_timeout, absl::Seconds(2));
  const int fd = Connect(address, handshake);
  if (fd < 0) return ConnectionEnd::kNotReady;
  NoDelay(fd);
  Tolerate(fd, options_.silence_timeout);
  uint64_t first_id;
  {
    absl::MutexLock lock(&mu_);  // from here Close() can interrupt the hello
    if (out->stop || closed_) {
      close(fd);
      return ConnectionEnd::kStopped;
    }
    out->fd = fd;
    out->ended = false;
    out->progressed = false;
    first_id = out->queue.empty() ? out->next_id : out->queue.front().id;
  }
  std::unique_ptr<tcp::Connection> conn;
  auto end = [&](ConnectionEnd how) {
    {
      absl::MutexLock lock(&mu_);
      out->fd = -1;
    }
    conn.reset();
    close(fd);
    return how;
  };
  if (tls_ == nullptr) {
    conn = tcp::PlainConnection(fd);
  } else {  // the job's TLS: mutual TLS 1.3, the receiver's name checked, before the hello (B9)
    auto secured = tcp::TlsClientConnection(fd, tls_, address, handshake);
    if (!secured.ok()) {
      bool say;
      {
        absl::MutexLock lock(&mu_);
        say = !out->handshake_failing;
        out->handshake_failing = true;
      }
      if (say) {
        options_.log.Warning(absl::StrCat("TLS to ", address, ": ", secured.status().message(),
                                          "; large tensors to it stay on the stream"));
      }
      return end(ConnectionEnd::kNotReady);
    }
    conn = *std::move(secured);
    conn->SetTimeout(handshake);
  }
  Hello hello{kMagic,
              kVersion,
              static_cast<uint32_t>(options_.job_token.size()),
              static_cast<uint32_t>(identity.size()),
              first_id,
              static_cast<uint32_t>(out->lane),
              0};
  char ack = 0;
  if (!conn->WriteAll({{&hello, sizeof hello},
                       {const_cast<char*>(options_.job_token.data()), options_.job_token.size()},
                       {identity.data(), identity.size()}}) ||
      !conn->ReadAll(&ack, 1) || ack != 1) {
    return end(ConnectionEnd::kNotReady);
  }
  conn->SetTimeout(absl::ZeroDuration());
  {
    absl::MutexLock lock(&mu_);
    if (out->stop || closed_) return end(ConnectionEnd::kStopped);
    out->state = Outgoing::State::kReady;
    out->handshake_failing = false;
  }
  std::thread acknowledgements([this, out, c = conn.get()] {
    tcp::BlockSigpipeOnThisThread();
    ReadAcknowledgements(out, c);
  });
  ConnectionEnd how = ConnectionEnd::kBroke;
  for (;;) {
    RecordHeader h{};
    Blob blob;  // shares the record's memory while it is written
    {
      absl::MutexLock lock(&mu_);
      auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return out->stop || closed_ || out->ended || !out->queue.empty();
      };
      mu_.Await(absl::Condition(&work));
      if (out->stop || closed_) {
        how = ConnectionEnd::kStopped;
        break;
      }
      if (out->ended) break;
      const Outgoing::Item& item = out->queue.front();
      blob = item.blob;
      h = {item.id, blob.size(), item.stripe, item.offset, item.total};
      out->sent.push_back(std::move(out->queue.front()));
      out->queue.pop_front();
    }
    std::vector<iovec> iov{{&h, sizeof h}};
    for (const auto& piece : blob.pieces) {
      if (!piece.empty()) iov.push_back({const_cast<char*>(piece.data()), piece.size()});
    }
    if (!conn->WriteAll(std::move(iov))) break;
    absl::MutexLock lock(&mu_);
    ++stats_.blobs_sent;
    stats_.bytes_sent += h.size;
  }
  {
    absl::MutexLock lock(&mu_);
    if (out->state == Outgoing::State::kReady) out->state = Outgoing::State::kConnecting;
  }
  shutdown(fd, SHUT_RDWR);
  acknowledgements.join();
  return end(how);
}

void BulkChannel::ReadAcknowledgements(const std::shared_ptr<Outgoing>& out,
                                       tcp::Connection* conn) {
  uint64_t id;
  while (conn->ReadAll(&id, sizeof id)) {
    std::vector<Outgoing::Item> done;  // their memory is released outside the lock
    absl::MutexLock lock(&mu_);
    while (!out->sent.empty() && out->sent.front().id <= id) {
      done.push_back(std::move(out->sent.front()));
      out->sent.pop_front();
      out->progressed = true;
    }
  }
  absl::MutexLock lock(&mu_);
  out->ended = true;
}

}  // namespace baton::rpc::internal
