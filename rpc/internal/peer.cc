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

bool Peer::QueueRedelivery(uint64_t id) {
  absl::MutexLock lock(&mu_);
  redeliver_.push_back(id);
  if (redelivering_) return false;  // its task takes it
  redelivering_ = true;
  return true;
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
