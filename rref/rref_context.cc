#include "rref/rref_context.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton::rref {

std::string GlobalId::ToString() const { return absl::StrCat(worker, ":", local); }

struct RRefContext::OwnerEntry {
  std::string type;
  rpc::Promise<rpc::AnyValue> value;
  bool created = false;
  absl::flat_hash_map<ForkId, Holder> forks;
  // Forks known to be deleted: tombstones for deletes that arrived first
  // (G3) and the record that makes repeated messages no-ops (G5).
  absl::flat_hash_set<ForkId> deleted;
  int local_refs = 0;
};

struct RRefContext::UserEntry {
  RRefId rref;
  int owner = -1;
  int64_t owner_incarnation = 0;  // as known when the entry was made
  bool handle_alive = true;
  // False for a remote() the owner never received (G8): nothing to delete.
  bool counted = true;
  absl::flat_hash_set<ForkId> pending_children;
};

RefHandle::RefHandle(std::shared_ptr<RRefContext> ctx, RRefId rref, ForkId fork, int owner,
                     std::string type)
    : ctx_(std::move(ctx)), rref_(rref), fork_(fork), owner_(owner), type_(std::move(type)) {}

std::shared_ptr<RefHandle> RefHandle::Failed(int owner, std::string type, absl::Status cause) {
  if (cause.ok()) cause = absl::InternalError("RefHandle::Failed with an OK status");
  auto handle = std::make_shared<RefHandle>(nullptr, RRefId{}, ForkId{}, owner, std::move(type));
  handle->created_.SetError(std::move(cause));
  return handle;
}

RefHandle::~RefHandle() {
  if (ctx_ != nullptr) ctx_->ReleaseHandle(*this);
}

bool RefHandle::is_owner() const { return ctx_ != nullptr && owner_ == ctx_->self(); }

RRefContext::RRefContext(int self, ControlSender* sender, int64_t incarnation,
                         std::function<int64_t(int)> incarnation_of)
    : self_(self),
      sender_(sender),
      incarnation_(incarnation),
      incarnation_of_(std::move(incarnation_of)) {}

Holder RRefContext::HolderOf(int worker) const {
  return Holder{worker, incarnation_of_ ? incarnation_of_(worker) : 0};
}

bool RRefContext::DeadLocked(const Holder& h) const {
  if (h.worker < 0) return false;
  auto it = dead_.find(h.worker);
  return it != dead_.end() && h.incarnation <= it->second;
}

RRefContext::~RRefContext() = default;

std::shared_ptr<RefHandle> RRefContext::CreateOwned(const std::string& type) {
  const RRefId id = NextId();
  {
    absl::MutexLock lock(&mu_);
    auto entry = std::make_shared<OwnerEntry>();
    entry->type = type;
    entry->local_refs = 1;
    owners_[id] = std::move(entry);
  }
  return std::make_shared<RefHandle>(shared_from_this(), id, ForkId{}, self_, type);
}

std::shared_ptr<RefHandle> RRefContext::CreateUserForRemote(int owner, const std::string& type) {
  const RRefId id = NextId();
  const ForkId fork = NextId();
  const Holder owner_now = HolderOf(owner);
  {
    absl::MutexLock lock(&mu_);
    auto entry = std::make_unique<UserEntry>();
    entry->rref = id;
    entry->owner = owner;
    entry->owner_incarnation = owner_now.incarnation;
    users_[fork] = std::move(entry);
  }
  auto handle = std::make_shared<RefHandle>(shared_from_this(), id, fork, owner, type);
  // The owner records this fork when it creates the value.
  handle->created().OnReady([weak = std::weak_ptr<RefHandle>(handle)](const auto& r) {
    if (!r.ok()) return;
    if (auto h = weak.lock()) h->MarkConfirmed();
  });
  return handle;
}

void RRefContext::OnRemoteCreate(RRefId rref, ForkId creator_fork, const std::string& type,
                                 Holder creator) {
  std::shared_ptr<OwnerEntry> freed;
  {
    absl::MutexLock lock(&mu_);
    if (owners_.contains(rref)) return;  // a repeated creation changes nothing (G5)
    auto entry = std::make_shared<OwnerEntry>();
    entry->type = type;
    if (DeadLocked(creator)) {
      entry->deleted.insert(creator_fork);  // G7: its creator died meanwhile
    } else {
      entry->forks.emplace(creator_fork, creator);
    }
    auto early = early_.find(rref);
    if (early != early_.end()) {  // messages that came before the creation apply now (G3)
      for (const auto& [fork, holder] : early->second.forks) entry->forks.emplace(fork, holder);
      for (const ForkId& d : early->second.deleted) {
        entry->forks.erase(d);
        entry->deleted.insert(d);
      }
      entry->local_refs += early->second.local_refs;
      if (early->second.value.has_value()) entry->value = *early->second.value;
      early_.erase(early);
    }
    owners_[rref] = std::move(entry);
    freed = MaybeFreeLocked(rref);
  }
}

void RRefContext::SetValue(RRefId rref, absl::StatusOr<rpc::AnyValue> value) {
  rpc::Promise<rpc::AnyValue> promise;
  {
    absl::MutexLock lock(&mu_);
    auto it = owners_.find(rref);
    if (it == owners_.end() || it->second->created) return;  // freed (G4): drop it
    it->second->created = true;
    promise = it->second->value;
  }
  promise.Set(std::move(value));
}

absl::StatusOr<rpc::Future<rpc::AnyValue>> RRefContext::OwnedValue(RRefId rref, bool* waits_early) {
  if (waits_early != nullptr) *waits_early = false;
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(rref);
  if (it != owners_.end()) return it->second->value.future();
  if (cleared_ || rref.worker == self_) {
    // Ids created here are entered at creation: unknown means freed.
    return absl::NotFoundError(absl::StrCat("RRef ", rref.ToString(), " is not owned by worker ",
                                            self_, " (already freed)"));
  }
  Early& e = early_[rref];
  if (!e.value.has_value()) e.value.emplace();
  ++e.waiters;
  if (waits_early != nullptr) *waits_early = true;
  return e.value->future();
}

void RRefContext::StopWaitingEarly(RRefId rref) {
  absl::MutexLock lock(&mu_);
  auto it = early_.find(rref);
  if (it == early_.end()) return;  // created meanwhile: the entry moved
  Early& e = it->second;
  if (e.waiters > 0) --e.waiters;
  if (e.waiters > 0) return;
  e.value.reset();
  if (e.forks.empty() && e.deleted.empty() && e.local_refs == 0) early_.erase(it);
}

ForkDescriptor RRefContext::Fork(const RefHandle& handle, int dest) {
  ForkDescriptor d;
  d.rref = handle.rref();
  d.fork = NextId();
  d.owner = handle.owner();
  d.parent = self_;
  d.type = handle.type();
  const Holder holder = HolderOf(dest);
  absl::MutexLock lock(&mu_);
  // G7: a fork sent to a dead worker is not counted (the message fails).
  if (DeadLocked(holder)) return d;
  if (handle.is_owner()) {
    // The owner forks directly: the fork is counted before it is sent. A
    // fork sent to the owner itself is counted too (G9): the message is in
    // flight while the sender may drop its own reference, and Adopt turns
    // the fork into a local reference when it arrives.
    auto it = owners_.find(d.rref);
    if (it != owners_.end()) {
      it->second->forks.emplace(d.fork, holder);
    } else {
      early_[d.rref].forks.emplace(d.fork, holder);  // G3: before creation
    }
  } else {
    // G2: the parent stays until the owner confirms the child.
    auto it = users_.find(handle.fork());
    if (it != users_.end()) {
      it->second->pending_children.insert(d.fork);
      child_parent_[d.fork] = Child{handle.fork(), holder, absl::Now()};
    }
  }
  return d;
}

std::shared_ptr<RefHandle> RRefContext::Adopt(const ForkDescriptor& d) {
  std::shared_ptr<RefHandle> handle;
  if (d.owner == self_) {
    {
      absl::MutexLock lock(&mu_);
      auto it = owners_.find(d.rref);
      if (it != owners_.end()) {
        ++it->second->local_refs;
        // G9: the owner's fork to itself becomes this local reference.
        if (d.parent == self_) it->second->forks.erase(d.fork);
      } else if (auto e = early_.find(d.rref); e != early_.end()) {
        ++e->second.local_refs;  // G3: sent back before creation
        if (d.parent == self_) e->second.forks.erase(d.fork);
      } else if (d.rref.worker != self_ || d.parent != self_) {
        ++early_[d.rref].local_refs;  // G3: sent back before creation
      } else {
        // G9: unreachable while the owner's fork to itself is counted; an id
        // made here and unknown is freed, so no early entry is made for it
        // (its calls fail with NOT_FOUND).
      }
    }
    handle = std::make_shared<RefHandle>(shared_from_this(), d.rref, ForkId{}, self_, d.type);
    handle->created_promise().SetValue();
    // A user sent the RRef back to its owner: it resolves to the owner's own
    // value, and the sender's child is confirmed at once, on the request's
    // reply where it can (G11).
    if (d.parent != self_ && !sender_->ChildAcceptOnReply(d.parent, d.rref, d.fork)) {
      Track(sender_->ChildAccept(d.parent, d.rref, d.fork));
    }
    return handle;
  }
  const Holder owner_now = HolderOf(d.owner);
  {
    absl::MutexLock lock(&mu_);
    auto entry = std::make_unique<UserEntry>();
    entry->rref = d.rref;
    entry->owner = d.owner;
    entry->owner_incarnation = owner_now.incarnation;
    users_[d.fork] = std::move(entry);
  }
  handle = std::make_shared<RefHandle>(shared_from_this(), d.rref, d.fork, d.owner, d.type);
  handle->created_promise().SetValue();
  if (d.parent != d.owner) {
    rpc::Future<void> request = sender_->ForkRequest(d.owner, d.rref, d.fork, d.parent);
    if (request.valid()) {
      // A function that received this fork runs once the owner answered the
      // ForkRequest: fork_answer_pending() says to wait for it (G12).
      handle->awaits_fork_answer_.store(true, std::memory_order_release);
      request.OnReady([weak = std::weak_ptr<RefHandle>(handle)](const auto& r) {
        auto h = weak.lock();
        if (h == nullptr) return;
        if (r.ok()) h->MarkConfirmed();
        h->fork_answered_.SetValue();
      });
    }
    Track(std::move(request));
  } else {
    handle->MarkConfirmed();  // the owner forked it and counts it already
  }
  return handle;
}

void RRefContext::Unfork(const ForkDescriptor& d) {
  if (d.parent != self_) return;
  std::shared_ptr<OwnerEntry> freed;
  RRefId del_rref;
  int del_owner = -1;
  ForkId parent;
  bool send = false;
  {
    absl::MutexLock lock(&mu_);
    if (d.owner == self_) {
      auto it = owners_.find(d.rref);
      if (it != owners_.end()) {
        if (it->second->forks.erase(d.fork) > 0) freed = MaybeFreeLocked(d.rref);
      } else if (auto e = early_.find(d.rref); e != early_.end()) {
        e->second.forks.erase(d.fork);
      }
    } else {
      auto cp = child_parent_.find(d.fork);
      if (cp == child_parent_.end()) return;  // confirmed, or already undone
      parent = cp->second.parent;
      child_parent_.erase(cp);
      auto it = users_.find(parent);
      if (it == users_.end()) return;
      it->second->pending_children.erase(d.fork);
      send = MaybeDeleteUserLocked(parent, &del_rref, &del_owner);
    }
  }
  if (send) Track(sender_->UserDelete(del_owner, del_rref, parent));
  // A freed value is destroyed here, unlocked.
}

void RRefContext::ForgetUncreated(ForkId fork) {
  absl::MutexLock lock(&mu_);
  auto it = users_.find(fork);
  if (it != users_.end()) it->second->counted = false;
}

absl::Status RRefContext::CheckOwner(const RefHandle& handle, absl::string_view owner_name) const {
  if (handle.is_owner()) return absl::OkStatus();
  const int owner = handle.owner();
  const int64_t now = incarnation_of_ ? incarnation_of_(owner) : 0;
  absl::MutexLock lock(&mu_);
  auto it = users_.find(handle.fork());
  if (it == users_.end()) return absl::OkStatus();
  const int64_t made_for = it->second->owner_incarnation;
  const bool dead = DeadLocked(Holder{owner, made_for});
  const bool replaced = made_for > 0 && now > made_for;
  if (!dead && !replaced) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "RRef ", handle.rref().ToString(), ": its owner, worker '", owner_name, "' (id ", owner,
      made_for > 0 ? absl::StrCat(", incarnation ", made_for) : std::string(), ")",
      ", died with its value",
      replaced ? absl::StrCat("; incarnation ", now, " of that rank rejoined the job without it")
               : std::string()));
}

void RRefContext::OnForkRequest(RRefId rref, ForkId fork, int parent, Holder holder) {
  std::shared_ptr<OwnerEntry> freed;
  {
    absl::MutexLock lock(&mu_);
    const bool dead = DeadLocked(holder);  // G7: it died meanwhile
    auto it = owners_.find(rref);
    if (it == owners_.end()) {
      Early& e = early_[rref];  // G3: before the owner created the value
      if (dead) {
        e.deleted.insert(fork);
      } else if (!e.deleted.contains(fork)) {
        e.forks.emplace(fork, holder);
      }
    } else if (dead) {
      it->second->deleted.insert(fork);
    } else if (!it->second->deleted.contains(fork)) {  // G3, G5
      it->second->forks.emplace(fork, holder);
    }
  }
  if (parent != self_) Track(sender_->ChildAccept(parent, rref, fork));
}

void RRefContext::SendChildAccept(int parent, RRefId rref, ForkId fork) {
  Track(sender_->ChildAccept(parent, rref, fork));
}

void RRefContext::OnChildAccept(RRefId rref, ForkId fork) {
  (void)rref;
  RRefId del_rref;
  int del_owner = -1;
  ForkId parent;
  bool send = false;
  {
    absl::MutexLock lock(&mu_);
    auto cp = child_parent_.find(fork);
    if (cp == child_parent_.end()) return;  // G5: already confirmed
    parent = cp->second.parent;
    child_parent_.erase(cp);
    auto it = users_.find(parent);
    if (it == users_.end()) return;
    it->second->pending_children.erase(fork);
    send = MaybeDeleteUserLocked(parent, &del_rref, &del_owner);
  }
  if (send) Track(sender_->UserDelete(del_owner, del_rref, parent));
}

void RRefContext::OnUserDelete(RRefId rref, ForkId fork) {
  std::shared_ptr<OwnerEntry> freed;
  {
    absl::MutexLock lock(&mu_);
    auto it = owners_.find(rref);
    if (it == owners_.end()) {
      Early& e = early_[rref];  // not created yet: a tombstone cancels the fork on arrival (G3)
      e.forks.erase(fork);
      e.deleted.insert(fork);
      return;
    }
    it->second->forks.erase(fork);
    it->second->deleted.insert(fork);
    freed = MaybeFreeLocked(rref);
  }
}

void RRefContext::ReleaseHandle(const RefHandle& h) {
  std::shared_ptr<OwnerEntry> freed;
  RRefId rref;
  int owner = -1;
  bool send = false;
  {
    absl::MutexLock lock(&mu_);
    if (h.is_owner()) {
      auto it = owners_.find(h.rref());
      if (it == owners_.end()) {
        auto e = early_.find(h.rref());
        if (e != early_.end() && e->second.local_refs > 0) --e->second.local_refs;
        return;
      }
      --it->second->local_refs;
      freed = MaybeFreeLocked(h.rref());
    } else {
      auto it = users_.find(h.fork());
      if (it == users_.end()) return;
      it->second->handle_alive = false;
      send = MaybeDeleteUserLocked(h.fork(), &rref, &owner);
    }
  }
  if (send) Track(sender_->UserDelete(owner, rref, h.fork()));
}

std::shared_ptr<RRefContext::OwnerEntry> RRefContext::MaybeFreeLocked(RRefId rref) {
  auto it = owners_.find(rref);
  if (it == owners_.end()) return nullptr;
  if (!it->second->forks.empty() || it->second->local_refs > 0) return nullptr;
  std::shared_ptr<OwnerEntry> out = std::move(it->second);
  owners_.erase(it);
  return out;
}

bool RRefContext::MaybeDeleteUserLocked(ForkId fork, RRefId* rref, int* owner) {
  auto it = users_.find(fork);
  if (it == users_.end()) return false;
  if (it->second->handle_alive || !it->second->pending_children.empty()) return false;
  *rref = it->second->rref;
  *owner = it->second->owner;
  // No UserDelete to an owner incarnation reported dead (G7).
  const bool owner_dead = DeadLocked(Holder{it->second->owner, it->second->owner_incarnation});
  // No UserDelete for a remote() whose creation never reached the owner (G8).
  const bool counted = it->second->counted;
  users_.erase(it);
  return counted && !owner_dead;
}

int RRefContext::OnPeerFailure(int worker, int64_t incarnation) {
  std::vector<std::shared_ptr<OwnerEntry>> freed;
  std::vector<std::pair<ForkId, std::pair<RRefId, int>>> deletes;
  int released = 0;
  {
    absl::MutexLock lock(&mu_);
    if (cleared_ || worker == self_) return 0;
    int64_t& dead = dead_[worker];
    dead = std::max(dead, incarnation);
    // The owner drops what the dead held; tombstones refuse its late
    // messages (G5 keeps them no-ops).
    std::vector<RRefId> touched;
    for (auto& [rref, entry] : owners_) {
      std::vector<ForkId> gone;
      for (const auto& [fork, holder] : entry->forks) {
        if (DeadLocked(holder)) gone.push_back(fork);
      }
      for (const ForkId& f : gone) {
        entry->forks.erase(f);
        entry->deleted.insert(f);
      }
      if (!gone.empty()) touched.push_back(rref);
      released += static_cast<int>(gone.size());
    }
    for (const RRefId& r : touched) {
      if (auto f = MaybeFreeLocked(r)) freed.push_back(std::move(f));
    }
    // Early entries: the dead's forks go; an entry of an RRef the dead
    // created that nothing else references goes too (its creation will not
    // come, or comes without a live creator).
    for (auto it = early_.begin(); it != early_.end();) {
      Early& e = it->second;
      for (auto f = e.forks.begin(); f != e.forks.end();) {
        if (DeadLocked(f->second)) {
          e.deleted.insert(f->first);
          e.forks.erase(f++);
          ++released;
        } else {
          ++f;
        }
      }
      const bool orphan = it->first.worker == worker && e.forks.empty() && e.local_refs == 0 &&
                          !e.value.has_value();
      if (orphan) {
        early_.erase(it++);
      } else {
        ++it;
      }
    }
    // Parents stop waiting for children forked to the dead (G2 no longer
    // holds them: nobody live references the value through that child).
    std::vector<ForkId> parents;
    for (auto it = child_parent_.begin(); it != child_parent_.end();) {
      if (DeadLocked(it->second.dest)) {
        auto user = users_.find(it->second.parent);
        if (user != users_.end()) user->second->pending_children.erase(it->first);
        parents.push_back(it->second.parent);
        child_parent_.erase(it++);
        ++released;
      } else {
        ++it;
      }
    }
    // Users of RRefs the dead owned: no confirmation will come.
    for (auto& [fork, entry] : users_) {
      if (!DeadLocked(Holder{entry->owner, entry->owner_incarnation})) continue;
      for (const ForkId& child : entry->pending_children) child_parent_.erase(child);
      released += static_cast<int>(entry->pending_children.size());
      entry->pending_children.clear();
      parents.push_back(fork);
    }
    for (const ForkId& p : parents) {
      RRefId r;
      int o = -1;
      if (MaybeDeleteUserLocked(p, &r, &o)) deletes.push_back({p, {r, o}});
    }
  }
  for (auto& [fork, ro] : deletes) Track(sender_->UserDelete(ro.second, ro.first, fork));
  // Freed values are destroyed here, unlocked.
  return released;
}

void RRefContext::Track(rpc::Future<void> f) {
  if (!f.valid()) return;
  {
    absl::MutexLock lock(&mu_);
    ++unanswered_;
  }
  f.OnReady([self = shared_from_this()](const auto&) {
    absl::MutexLock lock(&self->mu_);
    --self->unanswered_;
  });
}

absl::Status RRefContext::Settle(absl::Time deadline) {
  std::vector<std::pair<ForkId, std::pair<RRefId, int>>> deletes;
  {
    absl::MutexLock lock(&mu_);
    // Handles still alive at shutdown are released (G6).
    for (auto& [fork, entry] : users_) entry->handle_alive = false;
    std::vector<ForkId> forks;
    for (auto& [fork, entry] : users_) forks.push_back(fork);
    for (const ForkId& f : forks) {
      RRefId r;
      int o;
      if (MaybeDeleteUserLocked(f, &r, &o)) deletes.push_back({f, {r, o}});
    }
  }
  for (auto& [fork, ro] : deletes) Track(sender_->UserDelete(ro.second, ro.first, fork));
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return users_.empty() && unanswered_ == 0;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("RRefs on worker ", self_, " did not settle: ", users_.size(),
                     " user reference(s) still waiting for confirmation of their forks, ",
                     unanswered_, " protocol message(s) unanswered"));
  }
  return absl::OkStatus();
}

void RRefContext::Clear() {
  absl::flat_hash_map<RRefId, std::shared_ptr<OwnerEntry>> owners;
  absl::flat_hash_map<ForkId, std::unique_ptr<UserEntry>> users;
  {
    absl::MutexLock lock(&mu_);
    owners.swap(owners_);
    users.swap(users_);
    early_.clear();
    child_parent_.clear();
    cleared_ = true;
  }
  // Values (which may hold RRefs themselves) are destroyed here, unlocked.
}

RRefDebugState RRefContext::DebugState() const {
  RRefDebugState s;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : owners_) {
    RRefDebugState::Owned o;
    o.rref = id;
    for (const auto& [fork, holder] : e->forks) o.forks.push_back(fork);
    o.tombstones.assign(e->deleted.begin(), e->deleted.end());
    o.local_refs = e->local_refs;
    o.created = e->created;
    s.owned.push_back(std::move(o));
  }
  for (const auto& [fork, e] : users_) {
    RRefDebugState::Held h;
    h.rref = e->rref;
    h.fork = fork;
    h.owner = e->owner;
    h.handle_alive = e->handle_alive;
    h.pending_children.assign(e->pending_children.begin(), e->pending_children.end());
    s.held.push_back(std::move(h));
  }
  for (const auto& [child, c] : child_parent_) {
    RRefDebugState::Unconfirmed u;
    u.child = child;
    u.parent = c.parent;
    u.dest = c.dest.worker;
    u.since = c.since;
    if (auto it = users_.find(c.parent); it != users_.end()) {
      u.rref = it->second->rref;
      u.owner = it->second->owner;
    }
    s.unconfirmed.push_back(u);
  }
  s.early_entries = early_.size();
  s.unanswered_messages = unanswered_;
  return s;
}

std::string RRefDebugState::ToString() const {
  std::string out = absl::StrCat(owned.size(), " owned, ", held.size(), " held, ", early_entries,
                                 " early, ", unanswered_messages, " unanswered");
  auto ids = [](const std::vector<GlobalId>& v) {
    return absl::StrJoin(
        v, ",", [](std::string* o, const GlobalId& g) { absl::StrAppend(o, g.ToString()); });
  };
  for (const auto& o : owned) {
    absl::StrAppend(&out, "\n  owns ", o.rref.ToString(), " forks [", ids(o.forks), "] local_refs ",
                    o.local_refs, o.created ? "" : " (not created)");
  }
  for (const auto& h : held) {
    absl::StrAppend(&out, "\n  holds ", h.rref.ToString(), " fork ", h.fork.ToString(),
                    " of owner ", h.owner, h.handle_alive ? "" : " (released)",
                    " pending children [", ids(h.pending_children), "]");
  }
  return out;
}

}  // namespace baton::rref
