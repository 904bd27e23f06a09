// The RRef protocol (G1-G6, G8, rref/rref_context.h) and distributed autograd
// (D1, D4, D6, dist_autograd/dist_autograd.h) on real agents in one process,
// over the loopback transport (testing/rpc/loopback_transport.h) with faults
// injected below the agent: every frame delayed at random, control messages
// held and delivered in reverse order, and a worker killed mid-protocol.
#include <atomic>
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "absl/strings/match.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_autograd/internal/container.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#include "testing/eventually.h"
#include "testing/rpc/loopback_job.h"

namespace baton {
namespace {

using rpc::CallContext;
using rpc::Function;
using rpc::FunctionRegistry;
using rpc::RpcAgent;
using rpc::testing::Fate;
using rpc::testing::FrameInfo;
using rpc::testing::LoopbackJob;
using rpc::testing::LoopbackJobOptions;
using rref::RRef;
using rref::RRefService;

const Function<at::Tensor(at::Tensor)> make_fn("make");
const Function<at::Tensor(RRef<at::Tensor>)> fetch_fn("fetch");
const Function<RRef<at::Tensor>(RRef<at::Tensor>)> keep_fn("keep");
const Function<at::Tensor(RRef<at::Tensor>)> owner_sum_fn("owner_sum");
const Function<at::Tensor(at::Tensor, std::vector<int64_t>)> chain_fn("chain");
const Function<at::Tensor(std::vector<RRef<at::Tensor>>)> owner_vec_sum_fn("owner_vec_sum");
// Holds its RRef while a nested call runs, finishing asynchronously.
const Function<at::Tensor(RRef<at::Tensor>)> async_owner_sum_fn("async_owner_sum");

struct Counter {
  int64_t get() { return 1; }
};

at::Tensor Step(const at::Tensor& x, int64_t k) { return (x * (k + 2)).sin() + x * x; }

// A rule that delays every frame by 0-`max_us` microseconds, from a fixed
// seed (the order of frames on the wire then differs from the order sent).
rpc::testing::FrameRule RandomDelays(int64_t max_us, uint64_t seed) {
  auto state = std::make_shared<std::atomic<uint64_t>>(seed);
  return [state, max_us](const FrameInfo&) {
    uint64_t x = state->fetch_add(0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    return Fate::Delay(absl::Microseconds(static_cast<int64_t>(x % max_us)));
  };
}

// Three workers with the RRef service, distributed autograd and the test's
// functions.
struct Job {
  std::vector<std::shared_ptr<RRefService>> rrefs;
  std::unique_ptr<LoopbackJob> job;

  explicit Job(int world = 3, std::function<void(int, rpc::AgentOptions&)> configure = nullptr) {
    rrefs.resize(world);
    LoopbackJobOptions o;
    o.world_size = world;
    o.configure = std::move(configure);
    o.shutdown_timeout = absl::Seconds(10);
    o.install = [this](int rank, FunctionRegistry& r) {
      ASSERT_TRUE(dist_autograd::Install(r).ok());
      rrefs[rank] = RRefService::Install(r);
      rref::RegisterClass<Counter>(*rrefs[rank], "Counter").Method("get", &Counter::get);
      (void)r.Register(make_fn, [](at::Tensor x) { return x * 10; });
      (void)r.Register(fetch_fn, [](RRef<at::Tensor> ref) { return ref.to_here(); });
      (void)r.Register(keep_fn, [](RRef<at::Tensor> ref) { return ref; });
      (void)r.Register(owner_sum_fn, [](RRef<at::Tensor> ref) {
        // Sent back to its owner: resolves to the owner's own value (G2).
        if (!ref.is_owner()) throw std::runtime_error("not resolved on the owner");
        return ref.local_value()->sum();
      });
      (void)r.Register(owner_vec_sum_fn, [](std::vector<RRef<at::Tensor>> refs) {
        at::Tensor sum = at::zeros({});
        for (auto& ref : refs) {
          if (!ref.is_owner()) throw std::runtime_error("not resolved on the owner");
          sum = sum + ref.local_value()->sum();
        }
        return sum;
      });
      (void)r.Register(async_owner_sum_fn, [](const CallContext& ctx, RRef<at::Tensor> ref) {
        const int next = (ctx.agent->self().id + 1) % static_cast<int>(ctx.agent->workers().size());
        return ctx.agent->rpc_async(next, make_fn, at::ones({1}))
            .Then([ref](const rpc::Future<at::Tensor>&) {
              if (!ref.is_owner()) throw std::runtime_error("not resolved on the owner");
              return ref.local_value()->sum();
            });
      });
      (void)r.Register(chain_fn,
                       [](const CallContext& ctx, at::Tensor x, std::vector<int64_t> route) {
                         at::Tensor y = Step(x, ctx.agent->self().id);
                         if (route.empty()) return y;
                         const int64_t next = route.front();
                         route.erase(route.begin());
                         return ctx.agent->rpc_sync(static_cast<int>(next), chain_fn, y, route);
                       });
    };
    o.attach = [this](int rank, RpcAgent& agent) { rrefs[rank]->Attach(&agent); };
    auto started = LoopbackJob::Start(std::move(o));
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) job = *std::move(started);
  }
  RpcAgent& agent(int r) { return job->agent(r); }
  // G4: every owner freed every value, every user entry is gone.
  void ExpectEmpty(absl::Duration timeout) {
    for (size_t r = 0; r < rrefs.size(); ++r) {
      absl::Status s = rrefs[r]->WaitUntilEmpty(timeout);
      EXPECT_TRUE(s.ok()) << "worker " << r << ": " << s;
    }
  }
};

// Forks an RRef owned by w1 from w0 to w2 and back to the owner, in several
// ways at once; every use must see the value (no live reference freed).
void ForkEverywhere(Job& j, int64_t i, std::vector<rpc::Future<at::Tensor>>* fetched,
                    std::vector<rpc::Future<RRef<at::Tensor>>>* kept) {
  RRef<at::Tensor> r = rref::remote(j.agent(0), 1, make_fn, at::full({2}, double(i)));
  fetched->push_back(j.agent(0).rpc_async(2, fetch_fn, r));      // user -> user
  fetched->push_back(j.agent(0).rpc_async(1, owner_sum_fn, r));  // user -> owner
  kept->push_back(j.agent(0).rpc_async(2, keep_fn, r));          // and back
  fetched->push_back(r.to_here_async());
}  // w0's handle dies here, while forks are in flight

TEST(RRefOverLoopback, G1_G3_G4_RandomDelaysOnEveryFrameNeverFreeALiveReferenceAndNeverLeak) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  j.job->network().SetRule(RandomDelays(3000, 7));
  std::vector<rpc::Future<at::Tensor>> fetched;
  std::vector<rpc::Future<RRef<at::Tensor>>> kept;
  for (int64_t i = 0; i < 40; ++i) ForkEverywhere(j, i, &fetched, &kept);
  for (size_t k = 0; k < fetched.size(); ++k) {
    auto v = fetched[k].result();
    ASSERT_TRUE(v.ok()) << "use " << k << ": " << v.status();
  }
  for (int64_t i = 0; i < 40; ++i) {
    // fetch (to w2), owner_sum, to_here: values of make(i) = 10 i, twice.
    EXPECT_DOUBLE_EQ(fetched[3 * i].result()->sum().item<double>(), 20.0 * i);
    EXPECT_DOUBLE_EQ(fetched[3 * i + 1].result()->item<double>(), 20.0 * i);
    EXPECT_DOUBLE_EQ(fetched[3 * i + 2].result()->sum().item<double>(), 20.0 * i);
  }
  // The RRefs that came back still resolve, then die too.
  for (auto& f : kept) {
    auto r = f.result();
    ASSERT_TRUE(r.ok()) << r.status();
    auto v = r->to_here_async().result();
    ASSERT_TRUE(v.ok()) << v.status();
  }
  kept.clear();
  j.ExpectEmpty(absl::Seconds(20));
  EXPECT_GT(j.job->network().stats().delayed, 200);
  j.job->network().SetRule(nullptr);
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

TEST(RRefOverLoopback, G2_G3_ControlMessagesDeliveredInReverseOrderStillSettle) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  // Every protocol message (fork request, accept, delete) is parked.
  j.job->network().SetRule([](const FrameInfo& f) {
    return f.request && f.function == rref::kControlFn ? Fate::Hold() : Fate::Deliver();
  });
  std::vector<rpc::Future<at::Tensor>> fetched;
  std::vector<rpc::Future<RRef<at::Tensor>>> kept;
  for (int64_t i = 0; i < 10; ++i) ForkEverywhere(j, i, &fetched, &kept);
  for (auto& f : fetched) ASSERT_TRUE(f.result().ok()) << f.result().status();
  for (auto& f : kept) ASSERT_TRUE(f.result().ok()) << f.result().status();
  kept.clear();
  // Nothing confirmed a fork or a deletion yet: the owner keeps every value.
  EXPECT_EQ(j.rrefs[1]->DebugState().owned.size(), 10u);
  // Deliver what is parked newest first, again and again (delivery causes
  // more messages, parked too) until the protocol settles.
  int64_t released = 0;
  const bool settled = baton::testing::Eventually(
      [&] {
        j.job->network().WaitIdle(absl::Seconds(5));
        const size_t n = j.job->network().ReleaseHeld(/*reverse=*/true);
        released += static_cast<int64_t>(n);
        return n == 0 && j.rrefs[0]->DebugState().empty() && j.rrefs[1]->DebugState().empty() &&
               j.rrefs[2]->DebugState().empty();
      },
      absl::Seconds(20));
  EXPECT_TRUE(settled);
  EXPECT_GT(released, 30);
  j.job->network().SetRule(nullptr);
  j.ExpectEmpty(absl::Seconds(10));
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

TEST(RRefOverLoopback, OwnerKilledFailsToHereWithUnavailableNamingTheOwner) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  RRef<at::Tensor> r = rref::remote(j.agent(0), 1, make_fn, at::ones({2}));
  ASSERT_TRUE(r.to_here_async().result().ok());
  ASSERT_TRUE(j.job->Kill(1).ok());
  const absl::Time start = absl::Now();
  auto v = r.to_here_async(absl::Seconds(20)).result();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(v.status().code(), absl::StatusCode::kUnavailable) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "'w1'")) << v.status();
  // A fork among the survivors of an RRef whose owner died fails, named, too.
  auto f = j.agent(0).rpc_async(2, fetch_fn, r).result();
  EXPECT_FALSE(f.ok());
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// G9: an owner calls itself with its own RRef (as an argument, inside a
// vector, held by an asynchronous function, and back as the result) and
// drops its own handle while every call is in flight. Each use finds the
// value, and every table is empty at the end (before G9, the owner freed
// the value early: NOT_FOUND "already freed", and early entries stayed).
TEST(RRefOverLoopback, G9_AnOwnerCallingItselfWithItsOwnRRefNeverFreesItEarly) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  j.job->network().SetRule(RandomDelays(3000, 11));
  std::vector<rpc::Future<at::Tensor>> sums;
  std::vector<rpc::Future<RRef<at::Tensor>>> kept;
  constexpr int kRounds = 30;
  for (int64_t i = 0; i < kRounds; ++i) {
    // Owned by w1: one created by w1 itself, one by w0's remote().
    for (RpcAgent* creator : {&j.agent(1), &j.agent(0)}) {
      RRef<at::Tensor> r = rref::remote(*creator, 1, make_fn, at::full({2}, double(i)));
      if (creator == &j.agent(0)) {
        // The user passes it to the owner, which then calls itself with it.
        kept.push_back(j.agent(0).rpc_async(1, keep_fn, r));
        continue;
      }
      sums.push_back(j.agent(1).rpc_async(1, owner_sum_fn, r));
      sums.push_back(
          j.agent(1).rpc_async(1, owner_vec_sum_fn, std::vector<RRef<at::Tensor>>{r, r}));
      sums.push_back(j.agent(1).rpc_async(1, async_owner_sum_fn, r));
      kept.push_back(j.agent(1).rpc_async(1, keep_fn, r));
    }  // the owner's own handle dies here, with its self-calls in flight
  }
  for (int64_t i = 0; i < kRounds; ++i) {
    for (int k = 0; k < 3; ++k) {
      auto v = sums[3 * i + k].result();
      ASSERT_TRUE(v.ok()) << "round " << i << " use " << k << ": " << v.status();
      EXPECT_DOUBLE_EQ(v->item<double>(), (k == 1 ? 40.0 : 20.0) * i);
    }
  }
  for (auto& f : kept) {
    auto r = f.result();
    ASSERT_TRUE(r.ok()) << r.status();
    // On its owner, and sent to itself once more as it is dropped.
    auto v = j.agent(1).rpc_async(1, owner_sum_fn, *r).result();
    ASSERT_TRUE(v.ok()) << v.status();
  }
  kept.clear();
  j.ExpectEmpty(absl::Seconds(20));
  j.job->network().SetRule(nullptr);
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

// G11: counts the ChildAccepts sent as control messages and the ones that
// travel as reply notes; holds the frames `hold` picks.
struct AcceptCounts {
  std::atomic<int> standalone{0};
  std::atomic<int> on_reply{0};
};
rpc::testing::FrameRule CountAccepts(std::shared_ptr<AcceptCounts> counts,
                                     std::function<bool(const FrameInfo&)> hold = nullptr) {
  return [counts, hold](const FrameInfo& f) {
    if (f.request && f.function == rref::kControlFn) {
      proto::RRefControl m;
      if (m.ParseFromString(f.frame->payload.bytes) &&
          m.kind() == proto::RRefControl::CHILD_ACCEPT) {
        ++counts->standalone;
      }
    }
    if (!f.request) {
      for (const proto::ReplyNote& n : f.frame->header.notes()) {
        if (n.kind() == rref::kAcceptNote) ++counts->on_reply;
      }
    }
    return hold != nullptr && hold(f) ? Fate::Hold() : Fate::Deliver();
  };
}

// Whether worker `w` still waits for the owner to confirm a fork it sent.
bool WaitsForAConfirmation(Job& j, int w) {
  const rref::RRefDebugState s = j.rrefs[w]->DebugState();
  if (!s.unconfirmed.empty()) return true;
  for (const auto& held : s.held) {
    if (!held.pending_children.empty()) return true;
  }
  return false;
}

TEST(RRefOverLoopback, G11_AnRRefSentBackToItsOwnerIsConfirmedOnTheCallsReply) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  auto counts = std::make_shared<AcceptCounts>();
  {
    RRef<at::Tensor> r = rref::remote(j.agent(0), 1, make_fn, at::ones({2}));
    ASSERT_TRUE(r.to_here().equal(at::full({2}, 10.0)));
    j.job->network().SetRule(CountAccepts(counts));
    for (int i = 0; i < 5; ++i) {
      EXPECT_DOUBLE_EQ(j.agent(0).rpc_sync(1, owner_sum_fn, r).item<double>(), 20.0);
      // The reply confirmed the child before the call returned.
      EXPECT_FALSE(WaitsForAConfirmation(j, 0)) << "call " << i;
    }
    // Two forks in one request: two notes on its reply.
    EXPECT_DOUBLE_EQ(j.agent(0)
                         .rpc_sync(1, owner_vec_sum_fn, std::vector<RRef<at::Tensor>>{r, r})
                         .item<double>(),
                     40.0);
    EXPECT_FALSE(WaitsForAConfirmation(j, 0));
  }
  j.ExpectEmpty(absl::Seconds(10));
  EXPECT_EQ(counts->standalone.load(), 0);
  EXPECT_EQ(counts->on_reply.load(), 7);
  j.job->network().SetRule(nullptr);
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

TEST(RRefOverLoopback, G11_AnAsynchronousFunctionsAcceptLeavesWhenItsSynchronousPartReturns) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  auto counts = std::make_shared<AcceptCounts>();
  {
    RRef<at::Tensor> r = rref::remote(j.agent(0), 1, make_fn, at::ones({2}));
    ASSERT_TRUE(r.to_here().equal(at::full({2}, 10.0)));
    // async_owner_sum on w1 answers once its nested call to w2 does: that
    // call is held, so the reply cannot leave.
    j.job->network().SetRule(CountAccepts(counts, [](const FrameInfo& f) {
      return f.request && f.from == 1 && f.to == 2 && f.function == "make";
    }));
    rpc::Future<at::Tensor> sum = j.agent(0).rpc_async(1, async_owner_sum_fn, r);
    // The accept went on its own when the function returned its future.
    EXPECT_TRUE(baton::testing::Eventually([&] { return !WaitsForAConfirmation(j, 0); }));
    EXPECT_EQ(counts->standalone.load(), 1);
    EXPECT_FALSE(sum.ready());
    EXPECT_EQ(j.job->network().ReleaseHeld(/*reverse=*/false), 1u);
    auto v = sum.result();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_DOUBLE_EQ(v->item<double>(), 20.0);
  }
  j.ExpectEmpty(absl::Seconds(10));
  EXPECT_EQ(counts->standalone.load(), 1);
  EXPECT_EQ(counts->on_reply.load(), 0);
  j.job->network().SetRule(nullptr);
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

// A fetch (to_here) or a method call for an RRef id its owner has never
// seen ends at the request's deadline with DEADLINE_EXCEEDED naming the
// RRef, leaves no early entry, and does not hold the owner's shutdown.
TEST(RRefOverLoopback, G3_AFetchForAnUnknownIdEndsAtItsDeadlineAndLeavesNothing) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  proto::RRefCall h;
  h.mutable_rref()->set_worker(0);  // w0 never made this id
  h.mutable_rref()->set_local(987654321);
  for (const std::string& fn : {std::string(rref::kFetchFn), std::string(rref::kMethodFn)}) {
    proto::RRefCall call = h;
    if (fn == rref::kMethodFn) call.set_function("Counter.get");
    rpc::CallOptions opts;
    opts.timeout = absl::Seconds(1);
    const absl::Time start = absl::Now();
    auto r = j.agent(0)
                 .runtime()
                 .CallRaw(1, fn, "", rref::WithHeader(call, rpc::Payload()), opts)
                 .result();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  }
  // The owner answered the parked calls at their deadline: nothing early is
  // left (before, the early entry stayed and the fetch ran until shutdown).
  absl::Status empty = j.rrefs[1]->WaitUntilEmpty(absl::Seconds(5));
  EXPECT_TRUE(empty.ok()) << empty;
  const absl::Time shutdown_start = absl::Now();
  EXPECT_TRUE(j.job->ShutdownAll().ok());
  EXPECT_LT(absl::Now() - shutdown_start, absl::Seconds(5));
}

// G8 after the caller's timeout: a call carrying an RRef times out before
// its callee sees it (the network delays it), and the callee then refuses
// it unrun (here: it has no such function; a busy callee also refuses a
// call whose deadline passed in its queue). The late refusal takes the
// fork back. Before, the timed-out call had dropped its undo, and the fork
// stayed until shutdown, which then failed ("user references still waiting
// for confirmation of their forks").
TEST(RRefOverLoopback, G8_ACallThatTimedOutTakesItsForksBackWhenItsCalleeRefusesItUnrun) {
  Job j(3);
  const Function<at::Tensor(RRef<at::Tensor>)> missing_fn("not_registered_anywhere");
  j.job->network().SetRule([](const rpc::testing::FrameInfo& f) {
    return f.request && f.function == "not_registered_anywhere"
               ? Fate::Delay(absl::Milliseconds(300))
               : Fate::Deliver();
  });
  {
    RRef<at::Tensor> user = rref::remote(j.agent(0), 1, make_fn, at::ones({2}));
    ASSERT_TRUE(user.to_here().equal(at::full({2}, 10.0)));
    absl::Status s = j.agent(0)
                         .rpc_async(rpc::CallOptions{absl::Milliseconds(50)}, 2, missing_fn, user)
                         .status();
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  }
  j.ExpectEmpty(absl::Seconds(5));
}

// D1 under random delays: gradients through w0 -> w1 -> w2 -> w0 equal
// single-process autograd.
// G8: calls carrying RRefs that never run take their forks back: refused
// by the callee before running (an unknown function), or refused before
// leaving (over the message size limit); so does a remote() that never
// reached the owner. Without it the owner would keep the values (and a
// tombstone for the RRef never created) until shutdown.
TEST(RRefOverLoopback, G8_CallsThatNeverRunTakeTheirForksBack) {
  Job j(3, [](int, rpc::AgentOptions& o) { o.transport.max_message_bytes = 1 << 20; });
  const Function<at::Tensor(RRef<at::Tensor>)> missing_fn("not_registered_anywhere");
  const Function<at::Tensor(RRef<at::Tensor>, at::Tensor)> big_fn("fetch_with_a_big_tensor");
  const at::Tensor big = at::zeros({1 << 19});  // 2 MiB
  {
    // Forked by a user (w0; w1 owns it) and by the owner itself (w1).
    RRef<at::Tensor> user = rref::remote(j.agent(0), 1, make_fn, at::ones({2}));
    RRef<at::Tensor> owned = rref::remote(j.agent(1), 1, make_fn, at::ones({2}));
    ASSERT_TRUE(user.to_here().equal(at::full({2}, 10.0)));
    for (RpcAgent* from : {&j.agent(0), &j.agent(1)}) {
      RRef<at::Tensor>& r = from == &j.agent(0) ? user : owned;
      absl::Status s = from->rpc_async(2, missing_fn, r).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
      s = from->rpc_async(2, big_fn, r, big).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    }
    RRef<at::Tensor> never = rref::remote(j.agent(0), 1, make_fn, big);
    absl::Status s = never.to_here_async().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  }
  j.ExpectEmpty(absl::Seconds(5));
}

struct NeverRegistered {};

// The code a Status-carrying use ended with, or of the baton::Error it threw.
template <typename F>
absl::Status ThrownBy(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.status();
  }
  return absl::OkStatus();
}

// docs/api.md, "Errors": a remote() that fails before anything is sent
// reports it through its RRef, as rpc_async reports the same mistake
// through its future: nothing throws at the call, every use of the RRef
// fails with the same code, and nothing is left in any RRef table.
TEST(RRefOverLoopback, ARemoteThatFailsBeforeSendingFailsItsRRefAsRpcAsyncFailsItsFuture) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  RpcAgent& a = j.agent(0);
  const absl::Status call = a.rpc_async("nobody", make_fn, at::ones({1})).Wait(absl::Seconds(10));
  ASSERT_EQ(call.code(), absl::StatusCode::kNotFound) << call;

  RRef<at::Tensor> r = rref::remote(a, "nobody", make_fn, at::ones({1}));
  ASSERT_TRUE(r.valid());
  EXPECT_FALSE(r.is_owner());
  ASSERT_TRUE(r.created().ready());
  const absl::Status created = r.created().status();
  EXPECT_EQ(created.code(), call.code());
  EXPECT_TRUE(absl::StrContains(created.message(), "remote(make)")) << created;
  EXPECT_TRUE(absl::StrContains(created.message(), "nobody")) << created;

  // Every use: the future-returning ones fail, the value-returning ones throw.
  const absl::Status fetched = r.to_here_async().Wait(absl::Seconds(10));
  EXPECT_EQ(fetched.code(), absl::StatusCode::kNotFound) << fetched;
  EXPECT_TRUE(absl::StrContains(fetched.message(), "the RRef creation (remote()) failed"))
      << fetched;
  EXPECT_EQ(ThrownBy([&] { r.to_here(); }).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ThrownBy([&] { r.owner(); }).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ThrownBy([&] { r.local_value(); }).code(), absl::StatusCode::kNotFound);
  // Sent in a call, it fails the call at its encoding: w1 never sees it.
  const absl::Status sent = a.rpc_async(1, fetch_fn, r).Wait(absl::Seconds(10));
  EXPECT_EQ(sent.code(), absl::StatusCode::kNotFound) << sent;
  EXPECT_TRUE(absl::StrContains(sent.message(), "cannot send an RRef whose remote() failed"))
      << sent;

  // A class nobody registered, and a remote object that was never made.
  RRef<NeverRegistered> unknown_class = rref::remote<NeverRegistered>(a, 1);
  const absl::Status no_class = unknown_class.created().Wait(absl::Seconds(10));
  EXPECT_EQ(no_class.code(), absl::StatusCode::kNotFound) << no_class;
  EXPECT_TRUE(absl::StrContains(no_class.message(), "is not registered")) << no_class;
  RRef<Counter> counter = rref::remote<Counter>(a, "nobody");
  EXPECT_EQ(counter.created().Wait(absl::Seconds(10)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(counter.rpc_async(&Counter::get).Wait(absl::Seconds(10)).code(),
            absl::StatusCode::kNotFound);
  auto from_counter = counter.remote(&Counter::get);
  EXPECT_EQ(from_counter.created().Wait(absl::Seconds(10)).code(), absl::StatusCode::kNotFound);

  // The same agent still creates and fetches as before.
  RRef<at::Tensor> good = rref::remote(a, 1, make_fn, at::ones({1}));
  EXPECT_TRUE(good.to_here().equal(at::full({1}, 10.0)));
  r = RRef<at::Tensor>();
  good = RRef<at::Tensor>();
  j.ExpectEmpty(absl::Seconds(10));
}

TEST(DistAutogradOverLoopback, D1_GradientsUnderRandomDelaysEqualLocalAutograd) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  j.job->network().SetRule(RandomDelays(2000, 11));
  RpcAgent& a = j.agent(0);
  for (int round = 0; round < 5; ++round) {
    at::manual_seed(round);
    at::Tensor x = at::randn({3, 4}, at::kDouble).requires_grad_(true);
    dist_autograd::Context ctx(a);
    at::Tensor y = a.rpc_sync(1, chain_fn, x, std::vector<int64_t>{2, 0});
    at::Tensor loss = (y * y).sum();
    ASSERT_TRUE(dist_autograd::Backward(a, ctx.id(), {loss}).ok());
    auto got = dist_autograd::GetGradient(a, ctx.id(), x);
    ASSERT_TRUE(got.ok()) << got.status();
    at::Tensor x2 = x.detach().clone().requires_grad_(true);
    at::Tensor ref = Step(Step(Step(x2, 1), 2), 0);
    at::Tensor want = torch::autograd::grad({(ref * ref).sum()}, {x2})[0];
    EXPECT_LT((*got - want).abs().max().item<double>(), 1e-12) << "round " << round;
    EXPECT_FALSE(x.grad().defined());  // the gradient is the context's, none went into .grad (D2)
  }
  j.job->network().SetRule(nullptr);
  EXPECT_TRUE(j.job->ShutdownAll().ok());
}

// D6: a participant killed before backward fails Backward, bounded, with
// UNAVAILABLE naming the dead worker.
TEST(DistAutogradOverLoopback, D6_ParticipantKilledBeforeBackwardFailsItNamingTheWorker) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  RpcAgent& a = j.agent(0);
  at::Tensor x = at::randn({2, 2}, at::kDouble).requires_grad_(true);
  {
    dist_autograd::Context ctx(a);  // released before the agents go
    at::Tensor y = a.rpc_sync(1, chain_fn, x, std::vector<int64_t>{2});
    ASSERT_TRUE(j.job->Kill(2).ok());
    const absl::Time start = absl::Now();
    absl::Status s = dist_autograd::Backward(a, ctx.id(), {y.sum()});
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "'w2'")) << s;
  }
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// D4: the root dies holding a context that reached w1 and, through w1, w2;
// both release it, told by the agent's peer-failure notification.
TEST(DistAutogradOverLoopback, D4_ContextsOfAKilledRootAreReleasedOnEveryParticipant) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  RpcAgent& root = j.agent(0);
  at::Tensor x = at::randn({2, 2}, at::kDouble).requires_grad_(true);
  {
    dist_autograd::Context ctx(root);
    at::Tensor y = root.rpc_sync(1, chain_fn, x, std::vector<int64_t>{2});
    ASSERT_EQ(dist_autograd::LiveContexts(j.agent(1)).size(), 1u);
    ASSERT_EQ(dist_autograd::LiveContexts(j.agent(2)).size(), 1u);
    ASSERT_TRUE(j.job->Kill(0).ok());
    (void)baton::testing::Eventually(
        [&] {
          return dist_autograd::LiveContexts(j.agent(1)).empty() &&
                 dist_autograd::LiveContexts(j.agent(2)).empty();
        },
        absl::Seconds(10));
    EXPECT_TRUE(dist_autograd::LiveContexts(j.agent(1)).empty());
    EXPECT_TRUE(dist_autograd::LiveContexts(j.agent(2)).empty());
    EXPECT_GE(j.agent(1).stats().peer_failures + j.agent(2).stats().peer_failures, 1);
  }
  EXPECT_TRUE(j.job->ShutdownAll(/*graceful=*/false).ok());
}

// A Context that outlives its agent (and the whole job) is released
// locally when it ends: it never touches the destroyed agent (run under
// ASan in tools/sanitizers.sh, which reports any use after free).
TEST(DistAutogradOverLoopback, D4_AContextThatOutlivesItsAgentReleasesLocally) {
  Job j;
  ASSERT_NE(j.job, nullptr);
  RpcAgent& a = j.agent(0);
  at::Tensor x = at::randn({2, 2}, at::kDouble).requires_grad_(true);
  auto ctx = std::make_unique<dist_autograd::Context>(a);
  at::Tensor y = a.rpc_sync(1, chain_fn, x, std::vector<int64_t>{2});
  ASSERT_TRUE(dist_autograd::Backward(a, ctx->id(), {y.sum()}).ok());
  EXPECT_TRUE(j.job->ShutdownAll().ok());
  j.job.reset();  // every agent is destroyed
  ctx.reset();    // must release locally only
  // A context made after its agent shut down is released locally as well.
  Job k;
  ASSERT_NE(k.job, nullptr);
  EXPECT_TRUE(k.agent(0).Shutdown(/*graceful=*/false).ok());
  { dist_autograd::Context late(k.agent(0)); }
  k.job.reset();
}

// Peers cannot open contexts here without bound: past 65536 live ones a
// new id is refused with RESOURCE_EXHAUSTED, and room returns on release.
TEST(DistAutogradContainer, ContextsOpenedByPeersAreBounded) {
  auto c = std::make_shared<dist_autograd::internal::Container>();
  constexpr int64_t kMax = 1 << 16;
  for (int64_t id = 1; id <= kMax; ++id) ASSERT_TRUE(c->GetOrCreate(id, nullptr).ok()) << id;
  auto refused = c->GetOrCreate(kMax + 1, nullptr);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "already holds 65536"))
      << refused.status();
  EXPECT_TRUE(c->GetOrCreate(7, nullptr).ok());  // a known context is still found
  c->Release(nullptr, 7, /*from=*/-1);
  EXPECT_TRUE(c->GetOrCreate(kMax + 1, nullptr).ok());
  EXPECT_EQ(c->Ids().size(), static_cast<size_t>(kMax));
}

}  // namespace
}  // namespace baton
