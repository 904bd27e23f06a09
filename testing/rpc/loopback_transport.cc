// The in-process loopback network transport (loopback_transport.h).
#include "testing/rpc/loopback_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton::rpc::testing {

// One transport's state, shared with the frames and reply channels that
// name it, so that it outlives a transport destroyed while frames are queued.
struct LoopbackNetwork::Endpoint {
  std::string address;
  std::string token;

  mutable absl::Mutex mu;
  int rank ABSL_GUARDED_BY(mu) = -1;
  bool serving ABSL_GUARDED_BY(mu) = true;  // false after StopServer or Kill
  bool closed ABSL_GUARDED_BY(mu) = false;  // no sends after CloseStreams
  bool killed ABSL_GUARDED_BY(mu) = false;
  struct Peer {
    std::string address;
    std::string identity;
  };
  absl::flat_hash_map<int, Peer> peers ABSL_GUARDED_BY(mu);        // by rank
  absl::flat_hash_map<int, uint64_t> streams ABSL_GUARDED_BY(mu);  // rank -> open stream
  uint64_t next_stream ABSL_GUARDED_BY(mu) = 1;

  // Held while the handler runs; the transport clears it when destroyed.
  absl::Mutex handler_mu;
  TransportHandler* handler ABSL_GUARDED_BY(handler_mu) = nullptr;

  bool is_killed() const {
    absl::MutexLock lock(&mu);
    return killed;
  }
  // Whether its server takes incoming streams (their requests and replies).
  bool is_serving() const {
    absl::MutexLock lock(&mu);
    return serving && !killed;
  }
  // Whether its outgoing streams are open (their responses and endings).
  bool is_open() const {
    absl::MutexLock lock(&mu);
    return !closed && !killed;
  }
};

namespace {

enum class PendingKind { kRequest, kResponse, kClose, kPeerLost };

}  // namespace

class LoopbackTransport : public NetworkTransport {
 public:
  LoopbackTransport(LoopbackNetwork* net, std::shared_ptr<LoopbackNetwork::Endpoint> ep)
      : net_(net), ep_(std::move(ep)) {}

  ~LoopbackTransport() override {
    {
      absl::MutexLock lock(&ep_->mu);
      ep_->serving = false;
      ep_->closed = true;
    }
    absl::MutexLock lock(&ep_->handler_mu);
    ep_->handler = nullptr;
  }

  const std::string& address() const override { return ep_->address; }

  // Identities are not checked here (workers of one process, one trust).
  // Another address or identity for a known peer retires its stream: the
  // next send opens a new one (replies on the old one still arrive).
  void AddPeer(int id, const std::string& address, const std::string& identity) override {
    absl::MutexLock lock(&ep_->mu);
    auto [it, added] = ep_->peers.try_emplace(id);
    if (!added && (it->second.address != address || it->second.identity != identity)) {
      ep_->streams.erase(id);
    }
    it->second = {address, identity};
    if (address == ep_->address) ep_->rank = id;
  }

  bool connected(int peer) const override {
    absl::MutexLock lock(&ep_->mu);
    return !ep_->closed && ep_->peers.contains(peer);
  }

  absl::StatusOr<uint64_t> Send(int peer, Frame frame) override;

  // After it returns, no response or stream ending reaches the handler.
  absl::Status CloseStreams(bool /*cancel*/, absl::Duration /*timeout*/) override {
    {
      absl::MutexLock lock(&ep_->mu);
      ep_->closed = true;
      ep_->streams.clear();
    }
    WaitHandlerIdle();
    return absl::OkStatus();
  }

  // After it returns, no request or lost peer reaches the handler, and the
  // reply channels of its requests are gone.
  void StopServer(absl::Duration /*grace*/) override {
    {
      absl::MutexLock lock(&ep_->mu);
      ep_->serving = false;
    }
    WaitHandlerIdle();
  }

  int live_streams() const override {
    absl::MutexLock lock(&ep_->mu);
    return static_cast<int>(ep_->streams.size());
  }

 private:
  // Waits for a callback under way on the delivery thread (Deliver checks
  // the endpoint's state under handler_mu, so later ones see the change).
  // On the delivery thread itself (closing from a callback) there is none.
  void WaitHandlerIdle() {
    if (std::this_thread::get_id() == net_->thread_.get_id()) return;
    absl::MutexLock lock(&ep_->handler_mu);
  }

  LoopbackNetwork* const net_;
  const std::shared_ptr<LoopbackNetwork::Endpoint> ep_;
};

// Where a request's reply goes: back to the caller, as the callee it called.
class LoopbackReplyChannel : public ReplyChannel {
 public:
  LoopbackReplyChannel(LoopbackNetwork* net, std::shared_ptr<LoopbackNetwork::Endpoint> callee,
                       std::shared_ptr<LoopbackNetwork::Endpoint> caller, int callee_rank,
                       int caller_rank, uint64_t stream_id, std::string function)
      : net_(net),
        callee_(std::move(callee)),
        caller_(std::move(caller)),
        callee_rank_(callee_rank),
        caller_rank_(caller_rank),
        stream_id_(stream_id),
        function_(std::move(function)) {}

  // False once the stream is gone: the callee's server stopped, or the
  // caller closed its streams, or either was killed.
  bool Send(Frame frame) override {
    if (!callee_->is_serving() || !caller_->is_open()) return false;
    LoopbackNetwork::Pending p;
    p.from = callee_;
    p.to = caller_;
    p.from_rank = callee_rank_;
    p.to_rank = caller_rank_;
    p.stream_id = stream_id_;
    p.kind = static_cast<int>(PendingKind::kResponse);
    FrameInfo info;
    info.from = callee_rank_;
    info.to = caller_rank_;
    info.request = false;
    info.function = function_;
    info.call_id = frame.header.id();
    p.frame = std::move(frame);
    net_->Submit(std::move(p), std::move(info));
    return true;
  }

 private:
  LoopbackNetwork* const net_;
  const std::shared_ptr<LoopbackNetwork::Endpoint> callee_;
  const std::shared_ptr<LoopbackNetwork::Endpoint> caller_;
  const int callee_rank_;
  const int caller_rank_;
  const uint64_t stream_id_;
  const std::string function_;
};

absl::StatusOr<uint64_t> LoopbackTransport::Send(int peer, Frame frame) {
  std::string address;
  uint64_t stream = 0;
  int self_rank;
  {
    absl::MutexLock lock(&ep_->mu);
    if (ep_->closed || ep_->killed) {
      return absl::UnavailableError(
          absl::StrCat("loopback transport of ", ep_->address, " is closed"));
    }
    auto it = ep_->peers.find(peer);
    if (it == ep_->peers.end()) {
      return absl::UnavailableError(absl::StrCat("no address known for worker ", peer));
    }
    address = it->second.address;
    self_rank = ep_->rank;
  }
  std::shared_ptr<LoopbackNetwork::Endpoint> target = net_->EndpointAt(address);
  if (target == nullptr || target->is_killed()) {
    return absl::UnavailableError(absl::StrCat("connection to ", address, " (worker ", peer,
                                               ") refused: the worker is dead"));
  }
  {
    absl::MutexLock lock(&ep_->mu);
    auto [it, inserted] = ep_->streams.try_emplace(peer, 0);
    if (inserted) it->second = ep_->next_stream++;
    stream = it->second;
  }
  LoopbackNetwork::Pending p;
  p.from = ep_;
  p.to = std::move(target);
  p.from_rank = frame.header.caller_id() >= 0 ? frame.header.caller_id() : self_rank;
  p.to_rank = peer;
  p.stream_id = stream;
  p.kind = static_cast<int>(PendingKind::kRequest);
  FrameInfo info;
  info.from = p.from_rank;
  info.to = peer;
  info.request = true;
  info.function = frame.header.function();
  info.call_id = frame.header.id();
  p.frame = std::move(frame);
  net_->Submit(std::move(p), std::move(info));
  return stream;
}

LoopbackNetwork::LoopbackNetwork() : thread_([this] { Run(); }) {}

LoopbackNetwork::~LoopbackNetwork() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

NetworkTransportFactory LoopbackNetwork::Factory() {
  return [this](const NetworkTransportOptions& options, TransportHandler* handler) {
    return Start(options, handler);
  };
}

absl::StatusOr<std::unique_ptr<NetworkTransport>> LoopbackNetwork::Start(
    const NetworkTransportOptions& options, TransportHandler* handler) {
  auto ep = std::make_shared<Endpoint>();
  ep->token = options.job_token;
  {
    absl::MutexLock lock(&ep->handler_mu);
    ep->handler = handler;
  }
  {
    absl::MutexLock lock(&mu_);
    ep->address = absl::StrCat("loopback:", next_address_++);
    endpoints_[ep->address] = ep;
  }
  return std::unique_ptr<NetworkTransport>(new LoopbackTransport(this, std::move(ep)));
}

std::shared_ptr<LoopbackNetwork::Endpoint> LoopbackNetwork::EndpointAt(
    const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = endpoints_.find(address);
  return it == endpoints_.end() ? nullptr : it->second;
}

void LoopbackNetwork::SetRule(FrameRule rule) {
  absl::MutexLock lock(&mu_);
  rule_ = std::move(rule);
}

void LoopbackNetwork::Submit(Pending p, FrameInfo info) {
  info.frame = &p.frame;  // the frame the rule may look at is the one delivered
  FrameRule rule;
  {
    absl::MutexLock lock(&mu_);
    rule = rule_;
  }
  const Fate fate = rule ? rule(info) : Fate::Deliver();
  {
    absl::MutexLock lock(&mu_);
    switch (fate.action) {
      case Fate::kDrop: ++stats_.dropped; return;
      case Fate::kHold:
        held_.push_back(std::move(p));
        stats_.held = static_cast<int64_t>(held_.size());
        return;
      case Fate::kDeliver:
        if (fate.delay > absl::ZeroDuration()) ++stats_.delayed;
        if (fate.call_id != 0 && !info.request) p.frame.header.set_id(fate.call_id);
        p.due = absl::Now() + fate.delay;
        Enqueue(std::move(p));
        break;
    }
  }
  cv_.SignalAll();
}

void LoopbackNetwork::Enqueue(Pending p) {
  p.seq = next_seq_++;
  const auto key = std::make_pair(p.due, p.seq);
  queue_.emplace(key, std::move(p));
}

size_t LoopbackNetwork::ReleaseHeld(bool reverse) {
  size_t n;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Pending> held;
    held.swap(held_);
    stats_.held = 0;
    if (reverse) std::reverse(held.begin(), held.end());
    n = held.size();
    const absl::Time now = absl::Now();
    for (auto& p : held) {
      p.due = now;
      Enqueue(std::move(p));
    }
  }
  cv_.SignalAll();
  return n;
}

absl::Status LoopbackNetwork::Kill(int rank) {
  std::shared_ptr<Endpoint> victim;
  std::vector<std::shared_ptr<Endpoint>> others;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [address, ep] : endpoints_) {
      absl::MutexLock elock(&ep->mu);
      if (ep->rank == rank && !ep->killed && victim == nullptr) {
        victim = ep;
      } else {
        others.push_back(ep);
      }
    }
    if (victim == nullptr) {
      return absl::NotFoundError(absl::StrCat("no live loopback transport has rank ", rank));
    }
    {
      absl::MutexLock elock(&victim->mu);
      victim->killed = true;
      victim->serving = false;
    }
    // Its frames, queued or held, are lost.
    auto involves = [&victim](const Pending& p) { return p.from == victim || p.to == victim; };
    for (auto it = queue_.begin(); it != queue_.end();) {
      const auto k = static_cast<PendingKind>(it->second.kind);
      if (k != PendingKind::kClose && k != PendingKind::kPeerLost && involves(it->second)) {
        ++stats_.dropped;
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    const size_t before = held_.size();
    held_.erase(std::remove_if(held_.begin(), held_.end(), involves), held_.end());
    stats_.dropped += static_cast<int64_t>(before - held_.size());
    stats_.held = static_cast<int64_t>(held_.size());
  }
  const absl::Status cause =
      absl::UnavailableError(absl::StrCat("worker ", rank, " at ", victim->address, " was killed"));
  // Every stream to the victim ends, and so does each of its own. Workers
  // that only served the victim see its incoming stream cancelled.
  for (const auto& ep : others) {
    uint64_t stream = 0;
    {
      absl::MutexLock lock(&ep->mu);
      auto peer = ep->peers.find(rank);
      if (peer == ep->peers.end() || peer->second.address != victim->address) continue;
      auto it = ep->streams.find(rank);
      if (it != ep->streams.end()) stream = it->second;
    }
    if (stream != 0) {
      CloseStream(ep, rank, stream, cause);
    } else {
      Pending p;
      p.from = ep;
      p.to_rank = rank;
      p.kind = static_cast<int>(PendingKind::kPeerLost);
      p.cause = absl::UnavailableError(
          absl::StrCat("the stream from worker ", rank, " was cancelled (killed)"));
      {
        absl::MutexLock lock(&mu_);
        p.due = absl::Now();
        Enqueue(std::move(p));
      }
      cv_.SignalAll();
    }
  }
  std::vector<std::pair<int, uint64_t>> own;
  {
    absl::MutexLock lock(&victim->mu);
    for (const auto& [peer, stream] : victim->streams) own.emplace_back(peer, stream);
  }
  for (const auto& [peer, stream] : own) {
    CloseStream(
        victim, peer, stream,
        absl::UnavailableError(absl::StrCat("this worker (", victim->address, ") was killed")));
  }
  return absl::OkStatus();
}

absl::Status LoopbackNetwork::TimeOutStreams(int a, int b) {
  std::shared_ptr<Endpoint> ends[2];
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [address, ep] : endpoints_) {
      absl::MutexLock elock(&ep->mu);
      if (ep->killed) continue;
      if (ep->rank == a && ends[0] == nullptr) ends[0] = ep;
      if (ep->rank == b && ends[1] == nullptr) ends[1] = ep;
    }
  }
  if (ends[0] == nullptr || ends[1] == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no live loopback transport has rank ", ends[0] == nullptr ? a : b));
  }
  const int ranks[2] = {a, b};
  for (int side = 0; side < 2; ++side) {
    const int other = ranks[1 - side];
    uint64_t stream = 0;
    {
      absl::MutexLock lock(&ends[side]->mu);
      auto it = ends[side]->streams.find(other);
      if (it != ends[side]->streams.end()) stream = it->second;
    }
    if (stream != 0) {
      CloseStream(ends[side], other, stream,
                  absl::UnavailableError(absl::StrCat("loopback stream to worker ", other,
                                                      ": recvmsg:Connection timed out")));
    }
  }
  return absl::OkStatus();
}

bool LoopbackNetwork::killed(int rank) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [address, ep] : endpoints_) {
    absl::MutexLock elock(&ep->mu);
    if (ep->rank == rank && ep->killed) return true;
  }
  return false;
}

void LoopbackNetwork::CloseStream(const std::shared_ptr<Endpoint>& from, int to_rank,
                                  uint64_t stream_id, const absl::Status& cause) {
  Pending p;
  p.from = from;
  p.to_rank = to_rank;
  p.stream_id = stream_id;
  p.kind = static_cast<int>(PendingKind::kClose);
  p.cause = cause;
  {
    absl::MutexLock lock(&mu_);
    p.due = absl::Now();
    Enqueue(std::move(p));
  }
  cv_.SignalAll();
}

LoopbackStats LoopbackNetwork::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool LoopbackNetwork::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !delivering_; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void LoopbackNetwork::Run() {
  for (;;) {
    Pending p;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        if (stop_) return;
        if (queue_.empty()) {
          cv_.Wait(&mu_);
          continue;
        }
        const absl::Time due = queue_.begin()->first.first;
        if (due > absl::Now()) {
          cv_.WaitWithDeadline(&mu_, due);
          continue;
        }
        break;
      }
      p = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
      delivering_ = true;
    }
    Deliver(std::move(p));
    absl::MutexLock lock(&mu_);
    delivering_ = false;
  }
}

void LoopbackNetwork::Deliver(Pending p) {
  // Each callback checks its endpoint's state under handler_mu, which
  // CloseStreams() and StopServer() take after changing it: none runs after
  // they returned.
  const auto kind = static_cast<PendingKind>(p.kind);
  if (kind == PendingKind::kPeerLost) {
    absl::MutexLock lock(&p.from->handler_mu);
    if (p.from->handler != nullptr && p.from->is_serving()) {
      p.from->handler->OnPeerLost(p.to_rank, p.cause);
    }
    return;
  }
  if (kind == PendingKind::kClose) {
    absl::MutexLock lock(&p.from->handler_mu);
    {
      absl::MutexLock elock(&p.from->mu);
      auto it = p.from->streams.find(p.to_rank);
      if (it == p.from->streams.end() || it->second != p.stream_id) return;  // closed already
      p.from->streams.erase(it);
    }
    if (p.from->handler != nullptr) {
      p.from->handler->OnStreamClosed(p.to_rank, p.stream_id, p.cause);
    }
    return;
  }
  if (p.from->is_killed() || p.to->is_killed()) {
    absl::MutexLock lock(&mu_);
    ++stats_.dropped;
    return;
  }
  if (kind == PendingKind::kRequest) {
    {
      absl::MutexLock lock(&p.to->handler_mu);
      if (p.to->is_serving() && p.to->token == p.from->token) {
        {
          absl::MutexLock slock(&mu_);
          ++stats_.delivered;
        }
        auto channel = std::make_shared<LoopbackReplyChannel>(
            this, p.to, p.from, p.to_rank, p.from_rank, p.stream_id, p.frame.header.function());
        if (p.to->handler != nullptr) {
          p.to->handler->OnRequest(std::move(channel), std::move(p.frame));
        }
        return;
      }
    }
    if (!p.to->is_serving()) {
      CloseStream(p.from, p.to_rank, p.stream_id,
                  absl::UnavailableError(absl::StrCat("connection to ", p.to->address,
                                                      " refused: its server stopped")));
    } else {
      CloseStream(p.from, p.to_rank, p.stream_id,
                  absl::UnauthenticatedError(
                      absl::StrCat("worker at ", p.to->address, " rejected the job token")));
    }
    return;
  }
  absl::MutexLock lock(&p.to->handler_mu);
  if (!p.to->is_open()) {  // the caller closed its streams
    absl::MutexLock slock(&mu_);
    ++stats_.dropped;
    return;
  }
  {
    absl::MutexLock slock(&mu_);
    ++stats_.delivered;
  }
  if (p.to->handler != nullptr) p.to->handler->OnResponse(p.from_rank, std::move(p.frame));
}

}  // namespace baton::rpc::testing
