#include "rpc/internal/flow_control.h"

#include <optional>

#include <utility>

#include "absl/strings/str_cat.h"

namespace baton::rpc::internal {
namespace {

// A limit <= 0 means none.
bool Over(int64_t value, int64_t limit) { return limit > 0 && value > limit; }

std::string LimitsText(const FlowLimits& l) {
  return absl::StrCat("max_calls_in_flight=", l.max_calls, ", max_bytes_in_flight=", l.max_bytes);
}

}  // namespace

// ---- CallWindow ----

CallWindow::CallWindow(std::vector<FlowLimits> limits)
    : peers_(static_cast<int>(limits.size())), limits_(std::move(limits)), slots_(peers_) {}

void CallWindow::SetLimits(int peer, FlowLimits limits) {
  if (peer < 0 || peer >= peers_) return;
  absl::MutexLock lock(&mu_);
  limits_[peer] = limits;
}

bool CallWindow::FitsLocked(int peer, int64_t bytes) const {
  const Slot& s = slots_[peer];
  if (s.calls == 0) return true;  // a call larger than the byte window goes alone
  const FlowLimits& l = limits_[peer];
  return !Over(s.calls + 1, l.max_calls) && !Over(s.bytes + bytes, l.max_bytes);
}

absl::Status CallWindow::Acquire(int peer, int64_t bytes, absl::Time deadline, bool may_wait) {
  if (peer < 0 || peer >= peers_) {
    return absl::InvalidArgumentError(absl::StrCat("no peer ", peer));
  }
  // Declared before the lock, so it ends after the lock is released.
  std::optional<Executor::BlockingScope> blocking;
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::CancelledError("the agent is shutting down");
  if (!FitsLocked(peer, bytes)) {
    ++waited_;
    if (may_wait) blocking.emplace();  // a pool thread lends its place (E2)
    auto room = [this, peer, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || FitsLocked(peer, bytes);
    };
    if (!may_wait || !mu_.AwaitWithDeadline(absl::Condition(&room), deadline)) {
      ++refused_;
      const Slot& s = slots_[peer];
      return absl::ResourceExhaustedError(absl::StrCat(
          s.calls, " calls (", s.bytes, " request bytes) already in flight to this worker",
          may_wait ? " until the call's deadline" : " and this thread may not wait for room",
          "; the window (AgentOptions ", LimitsText(limits_[peer]),
          ") bounds what a slow worker holds"));
    }
    if (closed_) return absl::CancelledError("the agent is shutting down");
  }
  Slot& s = slots_[peer];
  ++s.calls;
  s.bytes += bytes;
  return absl::OkStatus();
}

void CallWindow::Release(int peer, int64_t bytes) {
  if (peer < 0 || peer >= peers_) return;
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[peer];
  --s.calls;
  s.bytes -= bytes;
}

void CallWindow::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

CallWindow::Stats CallWindow::stats() const {
  absl::MutexLock lock(&mu_);
  Stats st;
  for (const Slot& s : slots_) {
    st.calls_in_flight += s.calls;
    st.bytes_in_flight += s.bytes;
  }
  st.calls_waited = waited_;
  st.calls_refused = refused_;
  return st;
}

std::vector<CallWindow::PeerUsage> CallWindow::PerPeer() const {
  absl::MutexLock lock(&mu_);
  std::vector<PeerUsage> out;
  out.reserve(slots_.size());
  for (const Slot& s : slots_) out.push_back({s.calls, s.bytes});
  return out;
}

// ---- RequestGate ----

RequestGate::RequestGate(int peers, FlowLimits limits, Executor* executor, int fanout)
    : state_(std::make_shared<State>(peers, limits, executor, fanout < 1 ? 1 : fanout)) {}

absl::Status RequestGate::Submit(int peer, int64_t bytes, absl::AnyInvocable<void()> task) {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  if (peer < 0 || peer >= static_cast<int>(st.peers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown caller id ", peer));
  }
  if (st.closed) return absl::UnavailableError("the worker is shutting down");
  Peer& p = st.peers[peer];
  if (p.calls > 0 &&
      (Over(p.calls + 1, st.limits.max_calls) || Over(p.bytes + bytes, st.limits.max_bytes))) {
    ++st.refused;
    return absl::ResourceExhaustedError(
        absl::StrCat("the caller already has ", p.calls, " requests (", p.bytes,
                     " bytes) queued or running here, the most this worker holds for one caller (",
                     LimitsText(st.limits), "); the caller sends more than its window allows"));
  }
  p.queue.push_back(std::move(task));
  if (p.scheduled < st.fanout) {
    // Submitting under the lock orders it before Close(): once Close()
    // returned, no runner is submitted any more.
    if (!st.executor->Submit([state = state_, peer] { RunOne(state, peer); })) {
      p.queue.pop_back();
      return absl::UnavailableError("the worker is shutting down");
    }
    ++p.scheduled;
  }
  ++p.calls;
  p.bytes += bytes;
  return absl::OkStatus();
}

void RequestGate::RunOne(const std::shared_ptr<State>& state, int peer) {
  State& st = *state;
  absl::AnyInvocable<void()> task;
  {
    absl::MutexLock lock(&st.mu);
    Peer& p = st.peers[peer];
    --p.scheduled;
    if (p.queue.empty()) return;
    task = std::move(p.queue.front());
    p.queue.pop_front();
    // Keep up to `fanout` of this peer's requests waiting for a thread.
    while (!st.closed && p.scheduled < st.fanout &&
           static_cast<size_t>(p.scheduled) < p.queue.size()) {
      if (!st.executor->Submit([state, peer] { RunOne(state, peer); })) {
        st.closed = true;  // the executor was closed under us
        break;
      }
      ++p.scheduled;
    }
  }
  task();
  task = nullptr;
  // Closed (the executor takes no more runners): the last runner of this
  // peer runs what is left of its queue.
  while (true) {
    {
      absl::MutexLock lock(&st.mu);
      Peer& p = st.peers[peer];
      if (!st.closed || p.scheduled > 0 || p.queue.empty()) return;
      task = std::move(p.queue.front());
      p.queue.pop_front();
    }
    task();
    task = nullptr;
  }
}

void RequestGate::Finish(int peer, int64_t bytes) {
  absl::MutexLock lock(&state_->mu);
  if (peer < 0 || peer >= static_cast<int>(state_->peers.size())) return;
  Peer& p = state_->peers[peer];
  --p.calls;
  p.bytes -= bytes;
}

void RequestGate::Close() {
  absl::MutexLock lock(&state_->mu);
  state_->closed = true;
}

RequestGate::Stats RequestGate::stats() const {
  absl::MutexLock lock(&state_->mu);
  Stats st;
  for (const Peer& p : state_->peers) {
    st.held += p.calls;
    st.queued += static_cast<int64_t>(p.queue.size());
  }
  st.refused = state_->refused;
  return st;
}

std::vector<RequestGate::PeerLoad> RequestGate::PerPeer() const {
  absl::MutexLock lock(&state_->mu);
  std::vector<PeerLoad> out;
  out.reserve(state_->peers.size());
  for (const Peer& p : state_->peers) {
    out.push_back({p.calls, static_cast<int64_t>(p.queue.size())});
  }
  return out;
}

}  // namespace baton::rpc::internal
