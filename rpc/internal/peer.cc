#include "rpc/internal/peer.h"

#include <algorithm>

#include "rpc/transport.h"

namespace baton::rpc::internal {

void Peer::Reset(int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  incarnation_ = incarnation;
  dead_ = 0;
  address_incarnation_ = incarnation;
  identity_key_.clear();
  key_incarnation_ = 0;
  refreshing_ = false;
  next_refresh_ = absl::InfinitePast();
  probing_ = false;
  silent_since_ = absl::InfiniteFuture();
  redeliver_.clear();
  redelivering_ = false;
  address_stale_.store(false, std::memory_order_release);
}

Peer::Incarnations Peer::incarnations() const {
  absl::MutexLock lock(&mu_);
  return Incarnations{incarnation_, dead_, address_incarnation_};
}

bool Peer::known_dead() const { return incarnations().latest_dead(); }

Peer::Note Peer::NoteIncarnation(int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (incarnation < incarnation_) return Note::kOlder;
  if (incarnation == incarnation_) return Note::kSame;
  incarnation_ = incarnation;
  if (incarnation_ > address_incarnation_) address_stale_.store(true, std::memory_order_release);
  next_refresh_ = absl::InfinitePast();  // its new address is in the store
  return Note::kNewer;
}

void Peer::Admit(int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  incarnation_ = std::max(incarnation_, incarnation);
  address_incarnation_ = std::max(address_incarnation_, incarnation);
}

bool Peer::MarkDead(int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (dead_ >= incarnation) return false;
  dead_ = incarnation;
  return true;
}

bool Peer::ShouldFollow(int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (incarnation > address_incarnation_) return true;
  address_stale_.store(false, std::memory_order_release);
  return false;
}

void Peer::Followed(int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  address_incarnation_ = incarnation;
}

void Peer::SetIdentity(std::string key, int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  identity_key_ = std::move(key);
  key_incarnation_ = incarnation;
}

std::pair<std::string, int64_t> Peer::identity() const {
  absl::MutexLock lock(&mu_);
  return {identity_key_, key_incarnation_};
}

std::string Peer::KeyOf(int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  return key_incarnation_ == incarnation ? identity_key_ : std::string();
}

bool Peer::BeginRefresh(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (refreshing_ || now < next_refresh_) return false;
  refreshing_ = true;
  next_refresh_ = now + absl::Milliseconds(500);
  return true;
}

void Peer::EndRefresh() {
  absl::MutexLock lock(&mu_);
  refreshing_ = false;
}

Peer::Suspicion Peer::Suspect(int64_t* incarnation) {
  absl::MutexLock lock(&mu_);
  *incarnation = incarnation_;
  if (dead_ >= incarnation_) return Suspicion::kReportedAlready;
  if (probing_) return Suspicion::kProbing;
  probing_ = true;
  return Suspicion::kProbeNow;
}

absl::Time Peer::EndProbe(const absl::Status& result, absl::Time sent) {
  absl::MutexLock lock(&mu_);
  probing_ = false;
  if (result.ok()) {
    silent_since_ = absl::InfiniteFuture();
    return absl::InfiniteFuture();
  }
  if (!IsSilence(result)) return absl::InfiniteFuture();
  silent_since_ = std::min(silent_since_, sent);
  return silent_since_;
}

bool Peer::probing() const {
  absl::MutexLock lock(&mu_);
  return probing_;
}

bool Peer::AddCall(uint64_t id, PendingCall& call) {
  absl::MutexLock lock(&mu_);
  if (calls_closed_) return false;
  calls_.insert_or_assign(id, std::move(call));
  return true;
}

std::optional<PendingCall> Peer::TakeCall(uint64_t id, bool keep_undo) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return std::nullopt;
  std::optional<PendingCall> call(std::move(it->second));
  calls_.erase(it);
  if (keep_undo && !call->undo.empty() && !call->known_unread()) {
    late_undo_[id] = std::move(call->undo);
    call->undo.clear();
    late_order_.push_back(id);
    if (late_order_.size() > kMaxLateUndo) {
      late_undo_.erase(late_order_.front());
      late_order_.pop_front();
    }
  }
  return call;
}

std::vector<std::function<void()>> Peer::TakeLateUndo(uint64_t id) {
  absl::MutexLock lock(&mu_);
  std::vector<std::function<void()>> undo;
  auto it = late_undo_.find(id);
  if (it == late_undo_.end()) return undo;
  undo.swap(it->second);
  late_undo_.erase(it);
  // Its place in late_order_ goes when it comes to the front (erasing an
  // id that is no longer there is harmless).
  return undo;
}

std::vector<std::pair<uint64_t, std::string>> Peer::CallsOnStream(uint64_t stream_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, std::string>> out;
  for (const auto& [id, call] : calls_) {
    if (call.stream_id == stream_id || call.stream_id == 0) out.emplace_back(id, call.function);
  }
  return out;
}

std::vector<std::pair<uint64_t, PendingCall>> Peer::CloseCalls() {
  absl::MutexLock lock(&mu_);
  calls_closed_ = true;
  std::vector<std::pair<uint64_t, PendingCall>> out;
  out.reserve(calls_.size());
  for (auto& [id, call] : calls_) out.emplace_back(id, std::move(call));
  calls_.clear();
  return out;
}

size_t Peer::pending_calls() const {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

Peer::Redelivery Peer::QueueRedelivery(uint64_t id, int max_deliveries, bool unread) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return Redelivery::kGone;
  PendingCall& call = it->second;
  if (call.resend == nullptr || call.deliveries >= max_deliveries) return Redelivery::kRefused;
  call.stream_id = PendingCall::kAwaitingRedelivery;
  call.unread = unread;
  redeliver_.push_back(id);
  if (redelivering_) return Redelivery::kQueued;
  redelivering_ = true;
  return Redelivery::kStartTask;
}

std::vector<uint64_t> Peer::TakeRedeliveries() {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  ids.swap(redeliver_);
  if (ids.empty()) redelivering_ = false;
  return ids;
}

std::vector<uint64_t> Peer::DropRedeliveries() {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  ids.swap(redeliver_);
  redelivering_ = false;
  return ids;
}

}  // namespace baton::rpc::internal
