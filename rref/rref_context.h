// RRefContext: one worker's bookkeeping of the RRef reference-counting
// protocol. It knows nothing of the transport: messages leave through a
// ControlSender and arrive through the On* methods, so tests can run many
// contexts in one process and deliver messages in any order.
//
// Identity: an RRefId and a ForkId are (creating worker, local id); the
// local id's top 16 bits are the creator's incarnation (mod 2^16), so a
// restarted worker never reuses its predecessor's ids. Each copy of an RRef
// held by a non-owner worker is a *fork* with its own ForkId. The owner
// records which worker holds each fork, and in which incarnation (the
// worker that sent the ForkRequest or the remote(), or the destination of
// a fork it made itself).
//
// State machine (per RRef):
//   Owner O keeps an entry {value, forks, tombstones, local_refs}. The value
//   lives while forks is non-empty or local_refs > 0.
//   User U keeps an entry per fork {owner, handle_alive, pending_children}.
//   Messages:  ForkRequest(rref, fork, parent)  new holder -> owner
//              ChildAccept(rref, fork)          owner -> parent
//              UserDelete(rref, fork)           user -> owner
//   remote(O, f):  creator C makes rref=(C,n) and fork F0=(C,m), sends the
//     call; O creates the entry with forks={F0}.
//   C sends its RRef to X (X != O): C makes fork F, records F as a pending
//     child, sends (rref, F, parent=C). X adds user entry F and sends
//     ForkRequest(F) to O; O adds F to forks, sends ChildAccept(F) to C; C
//     drops F from its pending children.
//   O sends its RRef to X: O adds F to forks before sending (parent = O);
//     X adds user entry F and sends nothing.
//   O sends its RRef to itself (a call, a result or a container passed from
//     the owner to the owner): as to X, O adds F to forks before sending;
//     on arrival O turns F into a local reference.
//   U sends its RRef to O: U records pending child F; O resolves it to its
//     own value (a local reference) and sends ChildAccept(F) to U.
//   A user entry is deleted (UserDelete sent) once its handle is gone and it
//     has no pending children.
//
// Guarantees (tests in tests/rref/rref_protocol_test.cc are named after them):
// G1  The owner learns of every fork's deletion: a user entry sends exactly
//     one UserDelete, when its handle is gone and no child is pending.
// G2  A parent is not deleted before the owner has confirmed each child it
//     forked (pending children hold the parent), so the owner's fork set is
//     never empty while a confirmed path to a live reference exists.
// G3  Messages may arrive in any order. A UserDelete that arrives before the
//     ForkRequest of the same fork, or before the owner created the value,
//     leaves a tombstone that cancels the fork when it arrives; a ForkRequest,
//     or the RRef itself sent back to the owner, that arrives before the owner
//     created the value is kept until then.
// G4  The owner frees a value exactly when its fork set is empty and no
//     local reference remains, and never before.
// G5  Control messages are idempotent: a repeated ForkRequest, ChildAccept or
//     UserDelete changes nothing.
// G6  Settle() releases every user entry still held (at shutdown) and waits,
//     bounded, until no child is pending and every sent message is answered;
//     Clear() then empties the owner table.
// G7  A dead worker holds nothing. When incarnation k of worker W is
//     reported dead (OnPeerFailure; the agent's peer-failure listener), for
//     W's incarnations up to k: the owner drops the forks they held and
//     refuses their later ForkRequests and remote() creations (a tombstone);
//     early entries of RRefs they created that nothing else references go;
//     a parent stops waiting for children forked to them; a user whose
//     owner they were stops waiting for confirmations and sends it nothing.
//     Limit: a fork that W passed on just before it died, whose ForkRequest
//     reaches the owner after W's forks were dropped, may find the value
//     freed (its calls then fail with NOT_FOUND).
// G8  A message that never reaches its destination's decoder takes nothing
//     with it. When the agent knows so (the call failed before its request
//     left, the callee refused it before running its function, or a reply
//     could not be sent; rpc/payload.h), the sender takes back each fork it
//     made while encoding the message (Unfork: the owner drops the fork, a
//     parent stops waiting for the child), and a remote() whose creation
//     never reached the owner is not counted there (ForgetUncreated: its
//     user entry goes without a UserDelete). A call that timed out on the
//     caller keeps this undo until its callee answers: a late refusal
//     (the callee never ran it) still takes the forks back. Limits: a reply that arrives
//     after its caller gave up is dropped undecoded, and its forks stay
//     until the caller's worker dies or the job ends; so do the forks a
//     request's decoder had not reached when it failed part-way.
// G10 A user of an RRef whose owner died learns so at once. Once the owner
//     incarnation recorded for the user's fork is reported dead (G7), or a
//     newer incarnation of the owner's rank is known (it restarted: the
//     value died with its predecessor), to_here() and method calls through
//     that fork fail with UNAVAILABLE naming the RRef, the owner and its
//     incarnations, without a message to the owner (CheckOwner).
// G9  An RRef in flight from its owner to its owner is counted. While a
//     message that carries the owner's own RRef from the owner to itself
//     is in flight, its fork keeps the value alive, even if every other
//     reference is dropped meanwhile; on arrival the fork becomes a local
//     reference (Adopt), and an undelivered message takes it back (G8). No
//     early entry is ever made for an id this worker created.
// G11 A user's RRef sent to its owner in a request is confirmed on that
//     request's reply. The owner's ChildAccept travels as a note on the reply
//     (rpc/function.h, reply notes) when the reply leaves before the
//     function's synchronous part returns; otherwise it is sent on its own at
//     that moment (an asynchronous function). Either way the sender's pending
//     child ends exactly once (G5), no later than the call's reply, and an
//     RRef sent back to its owner costs no message of its own in a call that
//     answers at once.
//
// G12 A function that receives a user's RRef forked to it by another user
//     (not by the owner) runs once the owner answered that fork's
//     ForkRequest, as under torch: inside it, confirmed_by_owner() is true
//     (RefHandle::fork_answered; the Python call path waits for it without
//     holding a thread). A ForkRequest that fails ends the wait too; the
//     function then runs and its uses of the RRef fail as G10 says.
//
// Thread-safety: safe for concurrent use. No lock is held while a message is
// sent or a value is destroyed.
#ifndef BATON_RREF_RREF_CONTEXT_H_
#define BATON_RREF_RREF_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/function.h"
#include "rpc/future.h"

namespace baton::rref {

struct GlobalId {
  int32_t worker = -1;
  uint64_t local = 0;
  bool operator==(const GlobalId& o) const { return worker == o.worker && local == o.local; }
  bool operator!=(const GlobalId& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const GlobalId& id) {
    return H::combine(std::move(h), id.worker, id.local);
  }
  std::string ToString() const;
};
using RRefId = GlobalId;
using ForkId = GlobalId;

// A worker holding a fork, in one incarnation (Runtime::incarnation).
// worker -1: unknown, never released by a peer failure; incarnation 0:
// unknown, released by any failure of the worker.
struct Holder {
  int worker = -1;
  int64_t incarnation = 0;
};

// What travels when an RRef is sent.
struct ForkDescriptor {
  RRefId rref;
  ForkId fork;
  int owner = -1;
  int parent = -1;
  std::string type;  // typeid name of the value type
};

class ControlSender {
 public:
  virtual ~ControlSender() = default;
  // Each returns a future that completes when the receiver has processed the
  // message (or with an error if it could not be delivered).
  virtual rpc::Future<void> ForkRequest(int owner, RRefId rref, ForkId fork, int parent) = 0;
  virtual rpc::Future<void> ChildAccept(int parent, RRefId rref, ForkId fork) = 0;
  virtual rpc::Future<void> UserDelete(int owner, RRefId rref, ForkId fork) = 0;
  // G11: puts ChildAccept(fork) on the reply of the request from `parent`
  // whose arguments are being decoded on this thread. false when there is
  // none: the caller sends ChildAccept instead.
  virtual bool ChildAcceptOnReply(int parent, RRefId rref, ForkId fork) {
    (void)parent, (void)rref, (void)fork;
    return false;
  }
};

class RRefContext;

// A reference held by this worker: either the owner's local reference or a
// user fork. Dropping the last handle triggers the protocol (G1, G4).
class RefHandle {
 public:
  RefHandle(std::shared_ptr<RRefContext> ctx, RRefId rref, ForkId fork, int owner,
            std::string type);
  // A reference whose remote() failed before anything was sent (an unknown
  // worker, class or method, arguments the codec cannot send, no RRef
  // service, the agent shut down): it is in no context and names no value;
  // its created() has failed with `cause`, and so does every use of it.
  // `owner` is the worker it was meant for, or -1 when that is unknown.
  static std::shared_ptr<RefHandle> Failed(int owner, std::string type, absl::Status cause);
  ~RefHandle();
  RefHandle(const RefHandle&) = delete;
  RefHandle& operator=(const RefHandle&) = delete;

  // False only for a Failed() handle.
  bool attached() const { return ctx_ != nullptr; }
  bool is_owner() const;
  RRefId rref() const { return rref_; }
  ForkId fork() const { return fork_; }  // owner: {-1, 0}
  int owner() const { return owner_; }
  const std::string& type() const { return type_; }
  // REQUIRES: attached().
  RRefContext& context() const { return *ctx_; }
  // Completes when the owner has created the value (remote() finished).
  rpc::Future<void> created() const { return created_.future(); }
  const rpc::Promise<void>& created_promise() const { return created_; }
  // Whether the owner knows of this reference (torch's confirmed_by_owner):
  // always for the owner's own; for a user fork once the owner created the
  // value it made the fork for (remote()), or once the owner answered the
  // fork's ForkRequest, or at once for a fork the owner itself sent.
  bool confirmed_by_owner() const {
    return is_owner() || confirmed_.load(std::memory_order_acquire);
  }
  void MarkConfirmed() { confirmed_.store(true, std::memory_order_release); }
  // Whether a ForkRequest sent for this fork waits for the owner's answer
  // (G12); fork_answered() completes when it comes (the owner confirmed the
  // fork, or the request failed and confirmed_by_owner() stays false).
  // REQUIRES for fork_answered(): fork_answer_pending() was true.
  bool fork_answer_pending() const {
    return awaits_fork_answer_.load(std::memory_order_acquire) && !fork_answered_.future().ready();
  }
  rpc::Future<void> fork_answered() const { return fork_answered_.future(); }

 private:
  friend class RRefContext;
  const std::shared_ptr<RRefContext> ctx_;
  const RRefId rref_;
  const ForkId fork_;
  const int owner_;
  const std::string type_;
  rpc::Promise<void> created_;
  std::atomic<bool> confirmed_{false};
  // Set before the handle is shared, when a ForkRequest is sent for it.
  std::atomic<bool> awaits_fork_answer_{false};
  rpc::Promise<void> fork_answered_;
};

struct RRefDebugState {
  struct Owned {
    RRefId rref;
    std::vector<ForkId> forks;
    std::vector<ForkId> tombstones;
    int local_refs = 0;
    bool created = false;
  };
  struct Held {
    RRefId rref;
    ForkId fork;
    int owner = -1;
    bool handle_alive = false;
    std::vector<ForkId> pending_children;
  };
  // A fork this worker made of a held RRef and sent on, not yet confirmed by
  // the owner (the parent waits for its ChildAccept, G2).
  struct Unconfirmed {
    RRefId rref;
    ForkId child;
    ForkId parent;
    int owner = -1;
    int dest = -1;  // where the child went
    absl::Time since;
  };
  std::vector<Owned> owned;
  std::vector<Held> held;
  std::vector<Unconfirmed> unconfirmed;
  // Ids seen before their creation message (G3).
  size_t early_entries = 0;
  int64_t unanswered_messages = 0;
  bool empty() const {
    return owned.empty() && held.empty() && early_entries == 0 && unanswered_messages == 0;
  }
  std::string ToString() const;
};

class RRefContext : public std::enable_shared_from_this<RRefContext> {
 public:
  // `incarnation`: this worker's (part of every id made here).
  // `incarnation_of(worker)`: the latest incarnation known of a worker (the
  // holder recorded for a fork this owner sends); null: 0 for everyone.
  RRefContext(int self, ControlSender* sender, int64_t incarnation = 0,
              std::function<int64_t(int)> incarnation_of = nullptr);
  ~RRefContext();

  int self() const { return self_; }
  GlobalId NextId() {
    return GlobalId{self_, (static_cast<uint64_t>(incarnation_) << 48) |
                               (next_.fetch_add(1) & ((uint64_t{1} << 48) - 1))};
  }

  // ---- Creation ----
  // A new RRef owned here; returns the owner's local reference. The value
  // arrives later through SetValue().
  std::shared_ptr<RefHandle> CreateOwned(const std::string& type);
  // remote() to `owner`: a user fork for an RRef the owner will create.
  std::shared_ptr<RefHandle> CreateUserForRemote(int owner, const std::string& type);
  // On the owner, for a remote() from another worker (`creator`): creates
  // the entry with the creator's fork (merging early messages, G3; without
  // the fork if the creator is dead, G7).
  void OnRemoteCreate(RRefId rref, ForkId creator_fork, const std::string& type,
                      Holder creator = {});
  // Completes the owned value (or its error).
  void SetValue(RRefId rref, absl::StatusOr<rpc::AnyValue> value);
  // The owned value's future. A call from a holder of a live reference may
  // arrive before the remote() that creates the value (both travel on one
  // stream but run concurrently): for an id this worker does not know yet
  // and could own, the future completes at creation (G3). NOT_FOUND if the
  // id cannot be owned here. `*waits_early` (if given) says whether the
  // future waits in an early entry; such a caller that stops waiting (its
  // deadline passed) calls StopWaitingEarly once.
  absl::StatusOr<rpc::Future<rpc::AnyValue>> OwnedValue(RRefId rref, bool* waits_early = nullptr);
  // A caller of OwnedValue that waited in an early entry gave up. When no
  // other caller waits and no message references the id, the early entry
  // goes, so an unknown id leaves nothing behind (G3).
  void StopWaitingEarly(RRefId rref);

  // ---- Sending and receiving RRefs ----
  // Called while encoding `handle` into a message for `dest`.
  ForkDescriptor Fork(const RefHandle& handle, int dest);
  // Called while decoding a descriptor received from `sender`.
  std::shared_ptr<RefHandle> Adopt(const ForkDescriptor& d);
  // G8: the message carrying `d` (made here by Fork) was never decoded by
  // its destination. Idempotent.
  void Unfork(const ForkDescriptor& d);
  // G8: the remote() that made user fork `fork` (CreateUserForRemote) never
  // reached the owner; the entry will send no UserDelete. Idempotent.
  void ForgetUncreated(ForkId fork);

  // G10: OK, or UNAVAILABLE if the owner incarnation that `handle`'s fork
  // was made for died or was replaced. OK on the owner itself.
  // `owner_name` names the owner in the error.
  absl::Status CheckOwner(const RefHandle& handle, absl::string_view owner_name) const;

  // ---- Incoming control messages ----
  // `holder`: the worker that sent it (the fork's new holder).
  void OnForkRequest(RRefId rref, ForkId fork, int parent, Holder holder = {});
  void OnChildAccept(RRefId rref, ForkId fork);
  // G11: a ChildAccept that could not travel on its reply, sent on its own.
  void SendChildAccept(int parent, RRefId rref, ForkId fork);
  void OnUserDelete(RRefId rref, ForkId fork);

  // ---- Peer failures (G7) ----
  // Incarnation `incarnation` of `worker`, and every earlier one, is dead.
  // Returns how many forks, children and user entries it let go.
  int OnPeerFailure(int worker, int64_t incarnation);

  // ---- Shutdown (G6) and introspection ----
  absl::Status Settle(absl::Time deadline);
  void Clear();
  RRefDebugState DebugState() const;

 private:
  friend class RefHandle;
  struct OwnerEntry;
  struct UserEntry;

  void ReleaseHandle(const RefHandle& h);
  // Erases the owner entry if nothing references it (G4). Returns what to
  // destroy outside the lock.
  std::shared_ptr<OwnerEntry> MaybeFreeLocked(RRefId rref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases a user entry whose handle is gone and children confirmed (G1).
  // Returns true if a UserDelete must be sent (not to a dead owner, G7).
  bool MaybeDeleteUserLocked(ForkId fork, RRefId* rref, int* owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `h` is reported dead (G7).
  bool DeadLocked(const Holder& h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Holder HolderOf(int worker) const;
  void Track(rpc::Future<void> f);

  const int self_;
  ControlSender* const sender_;
  const int64_t incarnation_;
  const std::function<int64_t(int)> incarnation_of_;
  std::atomic<uint64_t> next_{1};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<RRefId, std::shared_ptr<OwnerEntry>> owners_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ForkId, std::unique_ptr<UserEntry>> users_ ABSL_GUARDED_BY(mu_);
  // child fork -> parent fork and where the child went, for ChildAccept on
  // a user parent (and G7 when its destination dies).
  struct Child {
    ForkId parent;
    Holder dest;
    absl::Time since;  // when it was forked (the hang report's age)
  };
  absl::flat_hash_map<ForkId, Child> child_parent_ ABSL_GUARDED_BY(mu_);
  // Per worker, its latest incarnation reported dead (G7).
  absl::flat_hash_map<int, int64_t> dead_ ABSL_GUARDED_BY(mu_);
  // Messages about RRefs this owner has not created yet (G3).
  struct Early {
    absl::flat_hash_map<ForkId, Holder> forks;  // fork -> its holder
    absl::flat_hash_set<ForkId> deleted;
    // Owner-local references taken (the RRef was sent back to its owner)
    // before the value was created.
    int local_refs = 0;
    // Calls (to_here, methods) that reached the owner before the remote()
    // that creates the value: they wait on this promise, which becomes the
    // entry's value promise at creation.
    std::optional<rpc::Promise<rpc::AnyValue>> value;
    int waiters = 0;  // callers waiting on `value`
  };
  absl::flat_hash_map<RRefId, Early> early_ ABSL_GUARDED_BY(mu_);
  int64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;
  bool cleared_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::rref

#endif  // BATON_RREF_RREF_CONTEXT_H_
