// The RRef reference-counting protocol (rref/rref_context.h), run with
// several workers' contexts in one process over a simulated network whose
// messages the test delivers in chosen orders. Tests are named after the
// guarantees G1-G8; every test ends by checking that nothing leaked.
#include <algorithm>
#include <deque>
#include <random>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"

#include "rref/rref_context.h"

namespace baton::rref {
namespace {

// kCarry: an application message carrying an RRef (a call's argument or a
// result), in flight from Fork on the sender to Adopt on arrival.
enum class Kind { kCreate, kFork, kAccept, kDelete, kCarry };

struct Msg {
  Kind kind;
  int to;
  RRefId rref;
  ForkId fork;
  int parent = -1;
  rpc::Promise<void> done;
  int from = -1;           // the sender
  ForkDescriptor carried;  // kCarry
};

class Network;

class Sender : public ControlSender {
 public:
  Sender(Network* net, int self) : net_(net), self_(self) {}
  rpc::Future<void> ForkRequest(int owner, RRefId r, ForkId f, int parent) override;
  rpc::Future<void> ChildAccept(int parent, RRefId r, ForkId f) override;
  rpc::Future<void> UserDelete(int owner, RRefId r, ForkId f) override;

 private:
  Network* net_;
  int self_;
};

class Network {
 public:
  explicit Network(int n) {
    for (int i = 0; i < n; ++i) senders_.push_back(std::make_unique<Sender>(this, i));
    for (int i = 0; i < n; ++i) ctx_.push_back(std::make_shared<RRefContext>(i, senders_[i].get()));
  }
  RRefContext& operator[](int i) { return *ctx_[i]; }

  rpc::Future<void> Post(Msg m) {
    auto f = m.done.future();
    if (dead_.contains(m.from) || dead_.contains(m.to)) {
      m.done.SetError(absl::UnavailableError("a dead worker's message is lost"));
      return f;
    }
    queue_.push_back(std::move(m));
    return f;
  }
  // Worker `w` dies: what it sends from now on is lost, and so are messages
  // to it; messages it sent before stay in flight unless `drop_in_flight`.
  void Kill(int w, bool drop_in_flight) {
    dead_.insert(w);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->to == w || (drop_in_flight && it->from == w)) {
        it->done.SetError(absl::UnavailableError("lost with a dead worker"));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Every live worker's agent reports `w` dead (G7); returns what they let go.
  int Report(int w) {
    int released = 0;
    for (size_t i = 0; i < ctx_.size(); ++i) {
      if (!dead_.contains(static_cast<int>(i))) released += ctx_[i]->OnPeerFailure(w, 0);
    }
    return released;
  }
  // remote(): the creator's call message to the owner.
  std::shared_ptr<RefHandle> Remote(int creator, int owner) {
    auto h = ctx_[creator]->CreateUserForRemote(owner, "int");
    Msg m{Kind::kCreate, owner, h->rref(), h->fork(), creator, rpc::Promise<void>(), creator};
    Post(std::move(m));
    return h;
  }
  // Sends `h` from its holder to `dest`: Fork on the sender, Adopt on arrival.
  std::shared_ptr<RefHandle> Send(const RefHandle& h, int from, int dest) {
    ForkDescriptor d = ctx_[from]->Fork(h, dest);
    return ctx_[dest]->Adopt(d);
  }
  // Sends `h` from `from` to `dest` in a message that stays in flight until
  // delivered; the adopted handle then appears in arrived().
  ForkDescriptor SendLater(const RefHandle& h, int from, int dest) {
    Msg m{Kind::kCarry, dest, h.rref(), {}, from, rpc::Promise<void>(), from};
    m.carried = ctx_[from]->Fork(h, dest);
    ForkDescriptor d = m.carried;
    Post(std::move(m));
    return d;
  }
  // Handles adopted on delivery of kCarry messages, with their holders.
  std::vector<std::pair<int, std::shared_ptr<RefHandle>>>& arrived() { return arrived_; }
  // Drops queued kCarry messages to `dest` without delivering them, and
  // takes their forks back on the sender as the agent does (G8).
  void LoseCarried(int dest) {
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->kind == Kind::kCarry && it->to == dest) {
        ctx_[it->from]->Unfork(it->carried);
        it->done.SetError(absl::UnavailableError("lost"));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  size_t pending() const { return queue_.size(); }
  size_t Count(Kind k) const {
    return std::count_if(queue_.begin(), queue_.end(), [k](const Msg& m) { return m.kind == k; });
  }

  void Deliver(Msg& m) {
    RRefContext& c = *ctx_[m.to];
    switch (m.kind) {
      case Kind::kCreate:
        created_.insert(m.rref);
        c.OnRemoteCreate(m.rref, m.fork, "int", Holder{m.from, 0});
        c.SetValue(m.rref, rpc::AnyValue::Of(std::make_shared<int>(7)));
        break;
      case Kind::kFork: c.OnForkRequest(m.rref, m.fork, m.parent, Holder{m.from, 0}); break;
      case Kind::kAccept: c.OnChildAccept(m.rref, m.fork); break;
      case Kind::kDelete: c.OnUserDelete(m.rref, m.fork); break;
      case Kind::kCarry: {
        auto h = c.Adopt(m.carried);
        // Whoever receives an RRef of a created value can use it: on its
        // owner, the value must still be there (G4, G9).
        if (h->is_owner() && Created(m.to, h->rref())) {
          EXPECT_TRUE(c.OwnedValue(h->rref()).ok())
              << "RRef " << h->rref().ToString() << " arrived at its owner " << m.to
              << " already freed";
        }
        arrived_.push_back({m.to, std::move(h)});
        break;
      }
    }
    m.done.SetValue();
  }
  // Delivers queued messages (and those they cause) in FIFO order, except
  // kinds in `hold`, which stay queued.
  void Run(std::vector<Kind> hold = {}) {
    for (size_t guard = 0; guard < 1000000; ++guard) {
      auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Msg& m) {
        return std::find(hold.begin(), hold.end(), m.kind) == hold.end();
      });
      if (it == queue_.end()) return;
      Msg m = std::move(*it);
      queue_.erase(it);
      Deliver(m);
    }
  }
  // Delivers everything in a random order.
  void RunShuffled(std::mt19937& rng) {
    while (!queue_.empty()) {
      std::uniform_int_distribution<size_t> pick(0, queue_.size() - 1);
      auto it = queue_.begin() + pick(rng);
      Msg m = std::move(*it);
      queue_.erase(it);
      Deliver(m);
    }
  }
  // Whether owner `w` created `r`'s value: made there (CreateOwned), or its
  // remote() was delivered.
  bool Created(int w, RRefId r) const { return r.worker == w || created_.contains(r); }
  bool Owns(int w, RRefId r) {
    for (const auto& o : ctx_[w]->DebugState().owned) {
      if (o.rref == r) return true;
    }
    return false;
  }
  void ExpectNoLeaks() {
    for (size_t i = 0; i < ctx_.size(); ++i) {
      if (dead_.contains(static_cast<int>(i))) continue;
      RRefDebugState s = ctx_[i]->DebugState();
      EXPECT_TRUE(s.empty()) << "worker " << i << ": " << s.ToString();
    }
  }

 private:
  std::vector<std::unique_ptr<Sender>> senders_;
  std::vector<std::shared_ptr<RRefContext>> ctx_;
  std::deque<Msg> queue_;
  absl::flat_hash_set<int> dead_;
  std::vector<std::pair<int, std::shared_ptr<RefHandle>>> arrived_;
  absl::flat_hash_set<RRefId> created_;
};

rpc::Future<void> Sender::ForkRequest(int owner, RRefId r, ForkId f, int parent) {
  return net_->Post(Msg{Kind::kFork, owner, r, f, parent, rpc::Promise<void>(), self_});
}
rpc::Future<void> Sender::ChildAccept(int parent, RRefId r, ForkId f) {
  return net_->Post(Msg{Kind::kAccept, parent, r, f, -1, rpc::Promise<void>(), self_});
}
rpc::Future<void> Sender::UserDelete(int owner, RRefId r, ForkId f) {
  return net_->Post(Msg{Kind::kDelete, owner, r, f, -1, rpc::Promise<void>(), self_});
}

constexpr int O = 0, U = 1, X = 2, Y = 3;

TEST(RRefProtocol, G1_OwnerLearnsOfEveryForksDeletion) {
  Network net(4);
  auto owner_ref = net[O].CreateOwned("int");
  net[O].SetValue(owner_ref->rref(), rpc::AnyValue::Of(std::make_shared<int>(1)));
  const RRefId id = owner_ref->rref();
  auto u = net.Send(*owner_ref, O, U);
  auto x = net.Send(*owner_ref, O, X);
  EXPECT_EQ(net.pending(), 0u);  // owner forks need no message
  owner_ref.reset();
  u.reset();
  EXPECT_EQ(net.Count(Kind::kDelete), 1u);
  net.Run();
  EXPECT_TRUE(net.Owns(O, id));  // X still holds it
  x.reset();
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));
  net.ExpectNoLeaks();
}

// "A user forks the RRef to a third worker before the owner has confirmed
// that user", and "a user drops its reference while a fork it sent is still
// in flight": both orders of the racing messages.
class ForkBeforeConfirmation : public ::testing::TestWithParam<bool> {};

TEST_P(ForkBeforeConfirmation, G2_G3_ParentKeptUntilChildConfirmed) {
  const bool create_first = GetParam();
  Network net(4);
  auto u = net.Remote(U, O);  // the create message is still in flight
  const RRefId id = u->rref();
  auto x = net.Send(*u, U, X);  // fork before the owner confirmed U
  u.reset();                    // U drops its reference with the fork in flight
  // G2: U must not delete before its child is confirmed.
  EXPECT_EQ(net.Count(Kind::kDelete), 0u);
  EXPECT_EQ(net[U].DebugState().held.size(), 1u);
  if (create_first) {
    net.Run({Kind::kFork});  // create arrives first; fork request held
    net.Run();
  } else {
    net.Run({Kind::kCreate});  // fork request, accept and U's delete arrive first
    EXPECT_FALSE(net.Owns(O, id));
    net.Run();
  }
  EXPECT_TRUE(net.Owns(O, id));  // X's fork keeps it alive
  x.reset();
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));
  net.ExpectNoLeaks();
}

INSTANTIATE_TEST_SUITE_P(BothOrders, ForkBeforeConfirmation, ::testing::Bool());

class DeleteBeforeForkRequest : public ::testing::TestWithParam<bool> {};

TEST_P(DeleteBeforeForkRequest, G3_TombstoneCancelsLateForkRequest) {
  // X receives a fork and drops it at once: X's delete may reach the owner
  // before (or after) X's own fork request.
  const bool delete_first = GetParam();
  Network net(4);
  auto u = net.Remote(U, O);
  net.Run();
  const RRefId id = u->rref();
  auto x = net.Send(*u, U, X);
  x.reset();  // queued: fork request, then delete
  ASSERT_EQ(net.Count(Kind::kFork), 1u);
  ASSERT_EQ(net.Count(Kind::kDelete), 1u);
  if (delete_first) {
    net.Run({Kind::kFork});
    EXPECT_TRUE(net.Owns(O, id));  // U still holds its own fork
  }
  net.Run();
  EXPECT_TRUE(net.Owns(O, id));
  u.reset();
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));
  net.ExpectNoLeaks();
}

INSTANTIATE_TEST_SUITE_P(BothOrders, DeleteBeforeForkRequest, ::testing::Bool());

class DeleteBeforeCreate : public ::testing::TestWithParam<bool> {};

TEST_P(DeleteBeforeCreate, G3_G4_CreatorDropsBeforeOwnerCreated) {
  const bool create_first = GetParam();
  Network net(2);
  auto u = net.Remote(U, O);
  const RRefId id = u->rref();
  u.reset();  // the delete races the create
  if (create_first) {
    net.Run({Kind::kDelete});
    EXPECT_TRUE(net.Owns(O, id));
  } else {
    net.Run({Kind::kCreate});
  }
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));  // G4: freed once the last fork is gone
  net.ExpectNoLeaks();
}

INSTANTIATE_TEST_SUITE_P(BothOrders, DeleteBeforeCreate, ::testing::Bool());

class PassedBackToOwner : public ::testing::TestWithParam<bool> {};

TEST_P(PassedBackToOwner, G2_ResolvesToOwnersValue) {
  const bool accept_late = GetParam();
  Network net(2);
  auto u = net.Remote(U, O);
  net.Run();
  const RRefId id = u->rref();
  auto back = net.Send(*u, U, O);
  EXPECT_TRUE(back->is_owner());
  u.reset();
  if (accept_late) {
    EXPECT_EQ(net.Count(Kind::kDelete), 0u);  // waits for the owner's accept
  }
  net.Run();
  EXPECT_TRUE(net.Owns(O, id));  // the owner's local reference
  back.reset();
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));
  net.ExpectNoLeaks();
}

INSTANTIATE_TEST_SUITE_P(BothOrders, PassedBackToOwner, ::testing::Bool());

TEST(RRefProtocol, G3_CallBeforeCreationWaitsForTheValue) {
  // to_here reaches the owner before the remote() that creates the value.
  Network net(2);
  auto u = net.Remote(U, O);
  auto early = net[O].OwnedValue(u->rref());
  ASSERT_TRUE(early.ok());
  EXPECT_FALSE(early->ready());
  net.Run();  // the create arrives
  ASSERT_TRUE(early->ready());
  EXPECT_EQ(*static_cast<int*>(early->result()->ptr.get()), 7);
  // An id created here and already freed is NOT_FOUND, not a wait.
  auto mine = net[O].CreateOwned("int");
  const RRefId id = mine->rref();
  mine.reset();
  EXPECT_EQ(net[O].OwnedValue(id).status().code(), absl::StatusCode::kNotFound);
  u.reset();
  net.Run();
  net.ExpectNoLeaks();
}

TEST(RRefProtocol, G4_OnePassedToManyWorkersAtOnce) {
  Network net(4);
  auto u = net.Remote(U, O);
  const RRefId id = u->rref();
  std::vector<std::shared_ptr<RefHandle>> copies;
  for (int dest : {X, Y, O, X, Y}) copies.push_back(net.Send(*u, U, dest));
  u.reset();
  std::mt19937 rng(7);
  net.RunShuffled(rng);
  EXPECT_TRUE(net.Owns(O, id));
  while (!copies.empty()) {
    copies.pop_back();
    net.RunShuffled(rng);
    EXPECT_EQ(net.Owns(O, id), !copies.empty());
  }
  net.ExpectNoLeaks();
}

TEST(RRefProtocol, G4_RRefOfAnRRefFreesInnerWithOuter) {
  Network net(4);
  auto inner = net.Remote(U, O);  // owned by O, held by U
  net.Run();
  const RRefId inner_id = inner->rref();
  // X owns an RRef whose value is U's reference to the inner RRef.
  auto outer = net[X].CreateOwned("RRef");
  auto inner_at_x = net.Send(*inner, U, X);
  net[X].SetValue(outer->rref(), rpc::AnyValue::Opaque(inner_at_x));
  inner_at_x.reset();
  inner.reset();
  net.Run();
  EXPECT_TRUE(net.Owns(O, inner_id));  // kept by the outer RRef's value
  outer.reset();                       // frees the outer value, which drops the inner reference
  net.Run();
  EXPECT_FALSE(net.Owns(O, inner_id));
  net.ExpectNoLeaks();
}

TEST(RRefProtocol, G5_RepeatedMessagesChangeNothing) {
  Network net(3);
  auto u = net.Remote(U, O);
  net.Run();
  const RRefId id = u->rref();
  auto x = net.Send(*u, U, X);
  net.Run();
  const ForkId xf = x->fork();
  net[O].OnForkRequest(id, xf, U);  // duplicate
  net.Run();
  x.reset();
  net.Run();
  net[O].OnForkRequest(id, xf, U);  // stale duplicate after the delete
  net[O].OnUserDelete(id, xf);      // duplicate delete
  net.Run();
  EXPECT_TRUE(net.Owns(O, id));  // U's fork only
  u.reset();
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));
  net.ExpectNoLeaks();
}

TEST(RRefProtocol, G6_SettleReleasesHandlesStillHeldAtShutdown) {
  Network net(3);
  auto u = net.Remote(U, O);
  auto x = net.Send(*u, U, X);
  net.Run();
  // Settle every worker while the application still holds its handles.
  for (int w : {X, U}) {
    absl::Status s = net[w].Settle(absl::Now());
    (void)s;  // messages are delivered below, by the simulated network
  }
  net.Run();
  for (int w : {X, U}) EXPECT_TRUE(net[w].Settle(absl::Now() + absl::Seconds(1)).ok());
  EXPECT_TRUE(net[O].DebugState().owned.size() == 0) << net[O].DebugState().ToString();
  net[O].Clear();
  x.reset();  // late handle drops are no-ops
  u.reset();
  net.Run();
  net.ExpectNoLeaks();
}

// G7: the owner drops the fork a dead worker held; the value goes with it.
TEST(RRefProtocol, G7_TheOwnerDropsTheForksOfADeadHolder) {
  Network net(4);
  auto owner_ref = net[O].CreateOwned("int");
  net[O].SetValue(owner_ref->rref(), rpc::AnyValue::Of(std::make_shared<int>(1)));
  const RRefId id = owner_ref->rref();
  auto x = net.Send(*owner_ref, O, X);
  auto u = net.Send(*owner_ref, O, U);
  owner_ref.reset();
  net.Kill(X, /*drop_in_flight=*/true);
  EXPECT_EQ(net.Report(X), 1);
  EXPECT_TRUE(net.Owns(O, id));  // U still holds it
  u.reset();
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));
  x.reset();  // the dead worker's memory: its UserDelete is lost
  net.Run();
  net.ExpectNoLeaks();
}

// G7: a parent whose child died before its ForkRequest reached the owner
// stops waiting for it, and the late ForkRequest is refused.
TEST(RRefProtocol, G7_AParentStopsWaitingForAChildThatDiedAndItsLateForkRequestIsRefused) {
  Network net(4);
  auto u = net.Remote(U, O);
  net.Run();
  const RRefId id = u->rref();
  auto y = net.Send(*u, U, Y);  // Y's ForkRequest is in flight
  u.reset();                    // G2: U waits for its child
  net.Kill(Y, /*drop_in_flight=*/false);
  EXPECT_EQ(net.Report(Y), 1);  // U's pending child
  EXPECT_EQ(net.Count(Kind::kDelete), 1u);
  net.Run();  // the late ForkRequest is refused; U's UserDelete frees the value
  EXPECT_FALSE(net.Owns(O, id));
  y.reset();
  net.Run();
  net.ExpectNoLeaks();
}

// G7: only the reported incarnation and earlier ones lose their forks.
TEST(RRefProtocol, G7_ForksOfANewerIncarnationSurvive) {
  Network net(4);
  auto owner_ref = net[O].CreateOwned("int");
  net[O].SetValue(owner_ref->rref(), rpc::AnyValue::Of(std::make_shared<int>(1)));
  const RRefId id = owner_ref->rref();
  const ForkId old_fork{X, 1}, new_fork{X, (uint64_t{2} << 48) | 1};
  net[O].OnForkRequest(id, old_fork, O, Holder{X, 1});
  net[O].OnForkRequest(id, new_fork, O, Holder{X, 2});
  owner_ref.reset();
  EXPECT_EQ(net[O].OnPeerFailure(X, 1), 1);
  EXPECT_TRUE(net.Owns(O, id));
  // A repeated ForkRequest of the dead incarnation stays refused (G5).
  net[O].OnForkRequest(id, old_fork, O, Holder{X, 1});
  EXPECT_EQ(net[O].OnPeerFailure(X, 2), 1);
  EXPECT_FALSE(net.Owns(O, id));
  net.ExpectNoLeaks();
}

// G7: users of a dead owner wait for no confirmation and send it nothing.
TEST(RRefProtocol, G7_UsersOfADeadOwnerNeitherWaitNorSend) {
  Network net(4);
  auto u = net.Remote(U, O);
  net.Run();
  auto x = net.Send(*u, U, X);  // X's ForkRequest to O is in flight
  net.Kill(O, /*drop_in_flight=*/true);
  EXPECT_EQ(net.Report(O), 1);  // U's pending child
  u.reset();
  x.reset();
  EXPECT_EQ(net.pending(), 0u);
  net.ExpectNoLeaks();
}

// G8: forks made for messages that never reached their destination are
// taken back, by an owner (the value goes) and by a user parent (it no
// longer waits for the child, and deletes itself once its handle is gone).
TEST(RRefProtocol, G8_ForksOfAMessageThatNeverArrivedAreTakenBack) {
  Network net(4);
  auto owner_ref = net[O].CreateOwned("int");
  net[O].SetValue(owner_ref->rref(), rpc::AnyValue::Of(std::make_shared<int>(1)));
  const RRefId owned = owner_ref->rref();
  const ForkDescriptor to_x = net[O].Fork(*owner_ref, X);
  owner_ref.reset();
  EXPECT_TRUE(net.Owns(O, owned));  // the fork to X is counted
  net[O].Unfork(to_x);
  EXPECT_FALSE(net.Owns(O, owned));
  net[O].Unfork(to_x);  // G5: again, nothing changes

  auto u = net.Remote(U, O);
  net.Run();
  const RRefId id = u->rref();
  const ForkDescriptor to_y = net[U].Fork(*u, Y);
  u.reset();  // G2: U waits for its child
  EXPECT_EQ(net.Count(Kind::kDelete), 0u);
  net[U].Unfork(to_y);
  EXPECT_EQ(net.Count(Kind::kDelete), 1u);
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));
  net[U].Unfork(to_y);
  EXPECT_EQ(net.pending(), 0u);
  net.ExpectNoLeaks();
}

// G8: a remote() whose creation never reached the owner sends no UserDelete
// there, which would leave a tombstone for an RRef that never comes (G3).
TEST(RRefProtocol, G8_ARemoteCreationThatNeverArrivedIsNotCountedOnTheOwner) {
  Network net(4);
  auto u = net[U].CreateUserForRemote(O, "int");  // its call is refused
  net[U].ForgetUncreated(u->fork());
  u.reset();
  EXPECT_EQ(net.pending(), 0u);
  net.ExpectNoLeaks();
}

// G9: the owner passes its own RRef to itself (a self-call's argument, a
// result, a container) and drops its reference before, or after, the
// message arrives: the fork in flight keeps the value, and becomes a local
// reference on arrival.
class OwnerSendsItsRRefToItself : public ::testing::TestWithParam<bool> {};

TEST_P(OwnerSendsItsRRefToItself, G9_TheForkInFlightKeepsTheValue) {
  const bool drop_before_arrival = GetParam();
  Network net(2);
  auto mine = net[O].CreateOwned("int");
  net[O].SetValue(mine->rref(), rpc::AnyValue::Of(std::make_shared<int>(3)));
  const RRefId id = mine->rref();
  net.SendLater(*mine, O, O);
  net.SendLater(*mine, O, O);  // two copies, as in a vector of RRefs
  if (drop_before_arrival) {
    mine.reset();
    ASSERT_TRUE(net.Owns(O, id));  // the two forks in flight
    EXPECT_EQ(net[O].DebugState().owned[0].forks.size(), 2u);
  }
  net.Run();
  ASSERT_EQ(net.arrived().size(), 2u);
  ASSERT_TRUE(net[O].OwnedValue(id).ok());
  mine.reset();
  const RRefDebugState s = net[O].DebugState();
  ASSERT_EQ(s.owned.size(), 1u) << s.ToString();
  EXPECT_TRUE(s.owned[0].forks.empty());  // each fork became a local reference
  EXPECT_EQ(s.owned[0].local_refs, 2);
  EXPECT_EQ(s.early_entries, 0u);
  net.arrived().pop_back();
  EXPECT_TRUE(net.Owns(O, id));
  net.arrived().clear();
  EXPECT_FALSE(net.Owns(O, id));
  EXPECT_EQ(net.pending(), 0u);  // no message to itself beyond the carries
  net.ExpectNoLeaks();
}

INSTANTIATE_TEST_SUITE_P(BothOrders, OwnerSendsItsRRefToItself, ::testing::Bool());

// G9 with G8: a message from the owner to itself that is never decoded
// takes its fork back, and the value goes once nothing else holds it.
TEST(RRefProtocol, G9_ASelfMessageThatNeverArrivedTakesItsForkBack) {
  Network net(2);
  auto mine = net[O].CreateOwned("int");
  net[O].SetValue(mine->rref(), rpc::AnyValue::Of(std::make_shared<int>(3)));
  const RRefId id = mine->rref();
  net.SendLater(*mine, O, O);
  mine.reset();
  EXPECT_TRUE(net.Owns(O, id));
  net.LoseCarried(O);
  EXPECT_FALSE(net.Owns(O, id));
  net.ExpectNoLeaks();
}

// G9 with G3: an RRef created by remote() comes back to its owner before
// the owner created the value, and the owner passes it to itself; the
// creation arrives before or after that self-message.
class SelfSendBeforeCreation : public ::testing::TestWithParam<bool> {};

TEST_P(SelfSendBeforeCreation, G9_G3_CountedInTheEarlyEntry) {
  const bool create_first = GetParam();
  Network net(2);
  auto u = net.Remote(U, O);
  const RRefId id = u->rref();
  net.SendLater(*u, U, O);
  u.reset();
  net.Run({Kind::kCreate, Kind::kAccept, Kind::kDelete});  // only the carry
  ASSERT_EQ(net.arrived().size(), 1u);
  auto at_owner = net.arrived()[0].second;
  net.arrived().clear();
  ASSERT_TRUE(at_owner->is_owner());
  net.SendLater(*at_owner, O, O);
  at_owner.reset();  // only the self-message keeps it now (with U's fork)
  if (create_first) {
    net.Run({Kind::kCarry});
    EXPECT_TRUE(net.Owns(O, id));
  }
  net.Run();
  ASSERT_EQ(net.arrived().size(), 1u);
  EXPECT_TRUE(net.Owns(O, id));
  EXPECT_EQ(net[O].DebugState().early_entries, 0u);
  net.arrived().clear();
  net.Run();
  EXPECT_FALSE(net.Owns(O, id));
  net.ExpectNoLeaks();
}

INSTANTIATE_TEST_SUITE_P(BothOrders, SelfSendBeforeCreation, ::testing::Bool());

// Ids carry the creator's incarnation: a restarted worker never reuses the
// ids its predecessor handed out.
TEST(RRefProtocol, IdsOfARestartedIncarnationNeverRepeatItsPredecessors) {
  Network net(1);
  auto first = std::make_shared<RRefContext>(X, nullptr, /*incarnation=*/1);
  auto second = std::make_shared<RRefContext>(X, nullptr, /*incarnation=*/2);
  absl::flat_hash_set<GlobalId> seen;
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(seen.insert(first->NextId()).second);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(seen.insert(second->NextId()).second) << i;
  EXPECT_EQ(first->NextId().worker, X);
}

TEST(RRefProtocol, RandomOrdersNeverFreeALiveReferenceAndNeverLeak) {
  for (int seed = 0; seed < 50; ++seed) {
    std::mt19937 rng(seed);
    Network net(4);
    std::vector<std::pair<int, std::shared_ptr<RefHandle>>> live;  // (holder, handle)
    std::vector<RRefId> ids;
    for (int i = 0; i < 5; ++i) {
      const int creator = 1 + rng() % 3;
      auto h = net.Remote(creator, 0);
      ids.push_back(h->rref());
      live.push_back({creator, h});
    }
    for (int step = 0; step < 200; ++step) {
      const int op = rng() % 5;
      if (op < 2 && !live.empty()) {  // fork to a random worker
        auto [holder, h] = live[rng() % live.size()];
        // One send in three is a self-call (the holder passes the RRef to
        // itself, the owner included, G9); half the sends stay in flight.
        const int dest = rng() % 2 == 0 ? holder : static_cast<int>(rng() % 4);
        if (rng() % 2 == 0) {
          net.SendLater(*h, holder, dest);
        } else {
          live.push_back({dest, net.Send(*h, holder, dest)});
        }
      } else if (op < 4 && !live.empty()) {  // drop a reference
        live.erase(live.begin() + rng() % live.size());
      } else if (net.pending() > 0) {  // deliver every message, shuffled
        net.RunShuffled(rng);
      }
      for (auto& a : net.arrived()) live.push_back(std::move(a));
      net.arrived().clear();
      // Safety: every RRef with a live reference whose creation was delivered
      // is still owned.
      for (auto& [holder, h] : live) {
        if (net.Count(Kind::kCreate) == 0) {
          EXPECT_TRUE(net.Owns(0, h->rref())) << seed;
        }
      }
    }
    live.clear();
    while (net.pending() > 0 || !net.arrived().empty()) {
      net.arrived().clear();
      net.RunShuffled(rng);
    }
    for (const RRefId& id : ids) EXPECT_FALSE(net.Owns(0, id));
    net.ExpectNoLeaks();
  }
}

TEST(RRefProtocol, StressTenThousandRRefsAmongFourWorkers) {
  std::mt19937 rng(42);
  Network net(4);
  std::vector<std::pair<int, std::shared_ptr<RefHandle>>> live;
  for (int i = 0; i < 10000; ++i) {
    const int owner = rng() % 4;
    int creator = rng() % 4;
    if (creator == owner) creator = (creator + 1) % 4;
    live.push_back({creator, net.Remote(creator, owner)});
    for (int k = 0; k < 3; ++k) {
      auto [holder, h] = live[rng() % live.size()];
      const int dest = k == 2 ? holder : static_cast<int>(rng() % 4);  // k == 2: a self-call
      if (rng() % 2 == 0) {
        net.SendLater(*h, holder, dest);
      } else {
        live.push_back({dest, net.Send(*h, holder, dest)});
      }
    }
    while (live.size() > 64) live.erase(live.begin() + rng() % live.size());
    if (i % 16 == 0) {
      net.RunShuffled(rng);
      for (auto& a : net.arrived()) live.push_back(std::move(a));
      net.arrived().clear();
      // G4 safety: everything still referenced is still owned.
      for (auto& [holder, h] : live) ASSERT_TRUE(net.Owns(h->owner(), h->rref())) << i;
    }
  }
  live.clear();
  while (net.pending() > 0 || !net.arrived().empty()) {
    net.arrived().clear();
    net.RunShuffled(rng);
  }
  net.ExpectNoLeaks();
}

}  // namespace
}  // namespace baton::rref
