// Multi-process tests of RRefs, remote objects and asynchronous functions.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "rpc/agent.h"
#include "rpc/call_hook.h"
#include "rref/rref.h"
#include "testing/eventually.h"
#include "testing/multiprocess.h"
#include "testing/multiprocess_gtest.h"
#include "tests/rref/fault_injection.h"

namespace baton::rref {
namespace {

using baton::testing::Describe;
using baton::testing::ExpectAllSucceeded;
using baton::testing::RunWorkers;
using rpc::CallContext;
using rpc::Function;
using rpc::FunctionRegistry;
using rpc::Future;
using rpc::Promise;
using rpc::RpcAgent;

// A thread-safe parameter server, used as a remote object.
class ParameterServer {
 public:
  explicit ParameterServer(int64_t n) : w_(at::zeros({n}, at::kDouble)) {}
  at::Tensor get() {
    absl::MutexLock l(&mu_);
    return w_.clone();
  }
  int64_t add(at::Tensor delta) {
    absl::MutexLock l(&mu_);
    w_ += delta;
    return ++updates_;
  }
  int64_t updates() const {
    absl::MutexLock l(&mu_);
    return updates_;
  }

 private:
  mutable absl::Mutex mu_;
  at::Tensor w_;
  int64_t updates_ = 0;
};

// Collects 32 requests and answers them all after one batched computation.
class Batcher {
 public:
  // `busy`: executor threads running right now (this handler included).
  Future<at::Tensor> Submit(at::Tensor x, int busy) {
    Promise<at::Tensor> p;
    std::vector<std::pair<at::Tensor, Promise<at::Tensor>>> batch;
    {
      absl::MutexLock l(&mu_);
      max_busy_ = std::max(max_busy_, busy);
      waiting_.emplace_back(std::move(x), p);
      if (waiting_.size() == 32) batch.swap(waiting_);
    }
    if (!batch.empty()) {
      std::vector<at::Tensor> xs;
      for (auto& [t, pr] : batch) xs.push_back(t);
      at::Tensor out = at::stack(xs) * 2 + 1;  // one "forward pass"
      passes_.fetch_add(1);
      for (size_t i = 0; i < batch.size(); ++i) batch[i].second.SetValue(out[i]);
    }
    return p.future();
  }
  std::atomic<int> passes_{0};
  int max_busy() {
    absl::MutexLock l(&mu_);
    return max_busy_;
  }

 private:
  int max_busy_ = 0;
  absl::Mutex mu_;
  std::vector<std::pair<at::Tensor, Promise<at::Tensor>>> waiting_;
};

const Function<at::Tensor(at::Tensor)> make_fn("make");
const Function<at::Tensor(RRef<at::Tensor>)> fetch_fn("fetch");
const Function<at::Tensor(RRef<at::Tensor>)> local_sum_fn("local_sum");
const Function<at::Tensor(std::vector<RRef<at::Tensor>>)> sum_all_fn("sum_all");
const Function<RRef<at::Tensor>(at::Tensor)> make_rref_fn("make_rref");
const Function<RRef<at::Tensor>(RRef<at::Tensor>)> keep_fn("keep");
const Function<std::string(std::string)> fail_fn("fail");
const Function<at::Tensor(at::Tensor)> batched_fn("batched");
const Function<int64_t()> pid_fn("pid");
const Function<void(int64_t)> sleep_fn("sleep");
const Function<at::Tensor(int64_t)> slow_tensor_fn("slow_tensor");
const Function<at::Tensor(int64_t)> gated_tensor_fn("gated_tensor");
const Function<int64_t()> debug_count_fn("debug_count");

std::shared_ptr<Batcher> g_batcher;  // one per worker process (test fixture)
// The parameter server handed to this worker by w0 (remote_objects).
std::shared_ptr<RRef<ParameterServer>> g_received;
absl::Notification* g_got = nullptr;
// Opened by the test once it has checked that a value being created is not
// there yet (gated_tensor waits for it, bounded).
absl::Notification* g_gate = nullptr;
const Function<void(RRef<ParameterServer>)> hand_fn("hand");

// Tags messages with their tensor count; scales received tagged tensors.
class ScalingHook : public rpc::CallHook {
 public:
  absl::Status OnSend(const rpc::MessageInfo&, const std::vector<at::Tensor>& tensors,
                      std::map<std::string, std::string>& ext) override {
    ext["test.count"] = std::to_string(tensors.size());
    return absl::OkStatus();
  }
  absl::Status OnReceive(const rpc::MessageInfo&, const std::vector<at::Tensor*>& tensors,
                         const std::map<std::string, std::string>& ext) override {
    auto it = ext.find("test.count");
    if (it == ext.end()) return absl::OkStatus();
    if (it->second != std::to_string(tensors.size())) {
      return absl::InternalError("tensor count mismatch");
    }
    for (at::Tensor* t : tensors) *t = *t * 10;
    return absl::OkStatus();
  }
};

struct Worker {
  std::shared_ptr<FunctionRegistry> registry;
  std::shared_ptr<RRefService> rrefs;
  std::unique_ptr<RpcAgent> agent;
};

Worker Start(rpc::AgentOptions* override_opts = nullptr,
             std::shared_ptr<rpc::CallHook> hook = nullptr) {
  Worker w;
  w.registry = std::make_shared<FunctionRegistry>();
  if (hook != nullptr) w.registry->AddCallHook(std::move(hook));  // before Create
  // BATON_TEST_DELAY=fork,accept,delete delays those protocol messages.
  const char* delay = std::getenv("BATON_TEST_DELAY");
  RRefService::SenderWrapper wrapper;
  if (delay != nullptr && *delay != '\0') {
    const auto kinds = baton::testing::DelayingControlSender::Parse(delay);
    wrapper = [kinds](ControlSender* real) {
      return std::make_unique<baton::testing::DelayingControlSender>(real, kinds,
                                                                     absl::Milliseconds(150));
    };
  }
  w.rrefs = RRefService::Install(*w.registry, wrapper);
  g_batcher = std::make_shared<Batcher>();
  auto& r = *w.registry;
  (void)r.Register(make_fn, [](at::Tensor x) { return x * 10; });
  (void)r.Register(fetch_fn, [](RRef<at::Tensor> ref) { return ref.to_here(); });
  (void)r.Register(local_sum_fn, [](RRef<at::Tensor> ref) {
    // Sent back to its owner: resolves to the owner's own value.
    WCHECK(ref.is_owner());
    return ref.local_value()->sum();
  });
  (void)r.Register(sum_all_fn, [](std::vector<RRef<at::Tensor>> refs) {
    at::Tensor total = at::zeros({});
    for (auto& ref : refs) total = total + ref.to_here().sum();
    return total;
  });
  (void)r.Register(make_rref_fn, [](const CallContext& ctx, at::Tensor x) {
    return remote(*ctx.agent, 0, make_fn, x);  // an RRef owned by w0
  });
  (void)r.Register(keep_fn, [](RRef<at::Tensor> ref) { return ref; });
  (void)r.Register(fail_fn, [](std::string s) -> std::string { throw std::runtime_error(s); });
  (void)r.Register(batched_fn, [](const CallContext& ctx, at::Tensor x) {
    return g_batcher->Submit(std::move(x), ctx.runtime->executor()->busy_threads());
  });
  (void)r.Register(pid_fn, [] { return static_cast<int64_t>(getpid()); });
  g_received = std::make_shared<RRef<ParameterServer>>();
  g_got = new absl::Notification();
  g_gate = new absl::Notification();
  (void)r.Register(hand_fn, [](RRef<ParameterServer> ps) {
    *g_received = ps;
    g_got->Notify();
  });
  // Slow work for the callee to run (these two); not synchronization.
  (void)r.Register(sleep_fn, [](int64_t ms) { absl::SleepFor(absl::Milliseconds(ms)); });
  (void)r.Register(slow_tensor_fn, [](int64_t ms) {
    absl::SleepFor(absl::Milliseconds(ms));
    return at::full({2}, static_cast<double>(ms));
  });
  (void)r.Register(gated_tensor_fn, [](int64_t value) {
    (void)g_gate->WaitForNotificationWithTimeout(absl::Seconds(20));
    return at::full({2}, static_cast<double>(value));
  });
  RegisterClass<ParameterServer>(*w.rrefs, "ParameterServer")
      .Constructor<int64_t>()
      .Method("get", &ParameterServer::get)
      .Method("add", &ParameterServer::add)
      .Method("updates", &ParameterServer::updates);
  auto opts = rpc::AgentOptions::FromEnv("w");
  WCHECK_OK(opts.status());
  if (override_opts != nullptr) {
    override_opts->rank = opts->rank;
    override_opts->world_size = opts->world_size;
    override_opts->master_port = opts->master_port;
    override_opts->name = opts->name;
    override_opts->transport.local_transport = opts->transport.local_transport;
    *opts = *override_opts;
  }
  auto agent = RpcAgent::Create(*opts, w.registry);
  WCHECK_OK(agent.status());
  w.agent = *std::move(agent);
  w.rrefs->Attach(w.agent.get());
  (void)r.Register(debug_count_fn, [svc = w.rrefs]() {
    auto s = svc->DebugState();
    return static_cast<int64_t>(s.owned.size() + s.held.size());
  });
  return w;
}

// Waits until every worker's RRef tables are empty.
void ExpectAllEmpty(Worker& w) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (const auto& peer : w.agent->workers()) {
    if (!baton::testing::Eventually([&] { return w.agent->rpc_sync(peer.id, debug_count_fn) == 0; },
                                    deadline - absl::Now())) {
      std::fprintf(stderr, "worker %s still has RRefs\n", peer.name.c_str());
      std::_Exit(1);
    }
  }
}

void Finish(Worker& w) {
  WCHECK_OK(w.agent->Shutdown());
  auto s = w.rrefs->DebugState();
  if (!s.empty()) {
    std::fprintf(stderr, "RRefs left after shutdown: %s\n", s.ToString().c_str());
    std::_Exit(1);
  }
}

BATON_SCENARIO(rref_basics) {
  Worker w = Start();
  auto& agent = *w.agent;
  if (agent.self().id == 0) {
    const at::Tensor x = at::arange(4, at::kFloat);
    RRef<at::Tensor> r = remote(agent, "w1", make_fn, x);
    WCHECK(!r.is_owner() && r.owner_name() == "w1" && r.owner_id() == 1);
    WCHECK_OK(r.created().Wait(absl::Seconds(10)));
    WCHECK(r.to_here().equal(x * 10));
    {
      // On the owner, to_here_async of a value still being created returns
      // without waiting for it (the value is gated until after the check:
      // had it waited, the future would be ready); the copy arrives when the
      // value does.
      RRef<at::Tensor> slow = remote(agent, "w0", gated_tensor_fn, int64_t{400});
      WCHECK(slow.is_owner());
      rpc::Future<at::Tensor> f = slow.to_here_async(absl::Seconds(30));
      WCHECK(!f.ready());
      g_gate->Notify();
      WCHECK_OK(f.Wait(absl::Seconds(30)));
      WCHECK(f.value().equal(at::full({2}, 400.0)));
      // And its timeout holds without blocking either.
      RRef<at::Tensor> slower = remote(agent, "w0", slow_tensor_fn, int64_t{1500});
      rpc::Future<at::Tensor> g = slower.to_here_async(absl::Milliseconds(200));
      WCHECK(g.Wait(absl::Seconds(5)).code() == absl::StatusCode::kDeadlineExceeded);
      WCHECK(slower.created().Wait(absl::Seconds(10)).ok());
    }
    // local_value is for the owner only.
    bool threw = false;
    try {
      r.local_value();
    } catch (const Error& e) {
      threw = e.code() == absl::StatusCode::kFailedPrecondition &&
              absl::StrContains(e.what(), "not its owner");
    }
    WCHECK(threw);
    // Forked to a third worker, which reads it.
    WCHECK(agent.rpc_sync("w2", fetch_fn, r).equal(x * 10));
    // Sent back to its owner: the owner sees its own value.
    WCHECK(agent.rpc_sync("w1", local_sum_fn, r).item<float>() == (x * 10).sum().item<float>());
    // Inside a container, together with an RRef owned by the caller.
    RRef<at::Tensor> mine = remote(agent, "w0", make_fn, x);
    WCHECK(mine.is_owner() && mine.local_value()->equal(x * 10));
    std::vector<RRef<at::Tensor>> refs = {r, mine, r};
    WCHECK(agent.rpc_sync("w2", sum_all_fn, refs).item<float>() ==
           3 * (x * 10).sum().item<float>());
    // An RRef of an RRef: w2 owns an RRef whose value is an RRef owned by w0.
    RRef<RRef<at::Tensor>> outer = remote(agent, "w2", make_rref_fn, x);
    RRef<at::Tensor> inner = outer.to_here();
    WCHECK(inner.is_owner() && inner.to_here().equal(x * 10));
    // Returned from a remote function.
    RRef<at::Tensor> back = agent.rpc_sync("w2", keep_fn, r);
    WCHECK(back.to_here().equal(x * 10));
    // One RRef passed to many workers at once.
    std::vector<Future<at::Tensor>> fs;
    for (int i = 0; i < 12; ++i) fs.push_back(agent.rpc_async(1 + i % 3, fetch_fn, r));
    WCHECK_OK(rpc::WaitAll(fs, absl::Seconds(30)));
    // The function's error is the RRef's error, naming the owner.
    RRef<std::string> bad = remote(agent, "w1", fail_fn, std::string("no luck"));
    absl::Status s = bad.to_here_async().status();
    WCHECK(s.code() == absl::StatusCode::kUnknown && absl::StrContains(s.message(), "no luck") &&
           absl::StrContains(s.message(), "worker 'w1'"));
    WCHECK(!bad.created().status().ok());
    // Drop everything: every table becomes empty on every worker.
    r = {};
    mine = {};
    refs.clear();
    outer = {};
    inner = {};
    back = {};
    bad = {};
    fs.clear();
    ExpectAllEmpty(w);
  }
  Finish(w);
  return 0;
}

// Every test runs on both same-host transports (shm, gRPC).
class RRefMultiProcess : public baton::testing::TransportTest {};
BATON_INSTANTIATE_TRANSPORTS(RRefMultiProcess);

TEST_P(RRefMultiProcess, RemoteToHereForksContainersNestingAndErrors) {
  ExpectAllSucceeded(Run("rref_basics", 4, absl::Seconds(120)));
}

// The same, with the fault-injecting wrapper delaying one kind of protocol
// message at a time, so it arrives after the messages that race it.
class RRefDelayed : public ::testing::TestWithParam<std::string> {};

TEST_P(RRefDelayed, SameResultsAndNoLeakWhenMessagesAreReordered) {
  ExpectAllSucceeded(
      RunWorkers("rref_basics", 4, absl::Seconds(120), {{"BATON_TEST_DELAY", GetParam()}}));
}

INSTANTIATE_TEST_SUITE_P(DelayedKinds, RRefDelayed,
                         ::testing::Values("fork", "accept", "delete", "fork,delete"));

BATON_SCENARIO(remote_objects) {
  Worker w = Start();
  auto& agent = *w.agent;
  const int me = agent.self().id;
  // w0 creates the server on w1 and hands it to w2 and w3.
  auto& received = g_received;
  if (me == 0) {
    RRef<ParameterServer> ps = remote<ParameterServer>(agent, "w1", int64_t{4});
    for (int peer : {2, 3}) agent.rpc_sync(peer, hand_fn, ps);
    *received = ps;
    g_got->Notify();
  }
  if (me != 1) WCHECK(g_got->WaitForNotificationWithTimeout(absl::Seconds(30)));
  RRef<ParameterServer> ps = *received;
  // w0, w2 and w3 update the object on w1 concurrently, 4 threads each.
  if (me != 1) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 25; ++i) ps.rpc_sync(&ParameterServer::add, at::ones({4}, at::kDouble));
      });
    }
    for (auto& t : threads) t.join();
  }
  WCHECK_OK(store::Barrier(agent.runtime().store(), agent.runtime().store_namespace() + "updated",
                           me, 4, absl::Seconds(60)));
  if (me == 0) {
    WCHECK(ps.rpc_sync(&ParameterServer::updates) == 300);
    WCHECK(ps.rpc_sync(&ParameterServer::get).equal(at::full({4}, 300.0, at::kDouble)));
    // Constructor arguments of the wrong type give a clear error.
    RRef<ParameterServer> wrong = remote<ParameterServer>(agent, "w1", 4);  // int, not int64
    absl::Status ws = wrong.created().status();
    WCHECK(ws.code() == absl::StatusCode::kInvalidArgument &&
           absl::StrContains(ws.message(), "(int32)->void") &&
           absl::StrContains(ws.message(), "(int64)->void"));
    wrong = {};
    // A method's result kept on the owner as a new RRef.
    RRef<at::Tensor> snapshot = ps.remote(&ParameterServer::get);
    WCHECK(snapshot.owner_id() == 1 && snapshot.to_here().sum().item<double>() == 1200.0);
  }
  ps = {};
  *received = {};
  WCHECK_OK(store::Barrier(agent.runtime().store(), agent.runtime().store_namespace() + "dropped",
                           me, 4, absl::Seconds(60)));
  if (me == 0) ExpectAllEmpty(w);
  Finish(w);
  return 0;
}

TEST_P(RRefMultiProcess, RemoteObjectChangedByConcurrentMethodCalls) {
  ExpectAllSucceeded(Run("remote_objects", 4, absl::Seconds(120)));
}

BATON_SCENARIO(async_batching) {
  Worker w = Start();
  auto& agent = *w.agent;
  const int me = agent.self().id;
  if (me != 0) {
    // 4 workers x 8 concurrent callers = 32 requests, answered by one pass.
    std::vector<Future<at::Tensor>> fs;
    for (int i = 0; i < 8; ++i) {
      fs.push_back(agent.rpc_async("w0", batched_fn, at::full({3}, me * 100 + i, at::kFloat)));
    }
    for (int i = 0; i < 8; ++i) {
      WCHECK(fs[i].value().equal(at::full({3}, (me * 100 + i) * 2 + 1, at::kFloat)));
    }
  }
  WCHECK_OK(store::Barrier(agent.runtime().store(), agent.runtime().store_namespace() + "batched",
                           me, 5, absl::Seconds(60)));
  if (me == 0) {
    WCHECK(g_batcher->passes_ == 1);
    // No executor thread waits for the batch: if handlers held their threads,
    // up to 32 would be busy by the last arrival.
    if (g_batcher->max_busy() >= 16) {
      std::fprintf(stderr, "max busy executor threads %d\n", g_batcher->max_busy());
      return 1;
    }
  }
  Finish(w);
  return 0;
}

TEST_P(RRefMultiProcess, AsyncFunctionBatchesThirtyTwoCallers) {
  ExpectAllSucceeded(Run("async_batching", 5, absl::Seconds(120)));
}

BATON_SCENARIO(dead_owner) {
  rpc::AgentOptions opts;
  opts.timeouts.shutdown = absl::Seconds(3);
  Worker w = Start(&opts);
  auto& agent = *w.agent;
  if (agent.self().id == 0) {
    RRef<ParameterServer> ps = remote<ParameterServer>(agent, "w1", int64_t{2});
    RRef<at::Tensor> r = remote(agent, "w1", make_fn, at::ones({2}));
    WCHECK(r.to_here().sum().item<float>() == 20);
    // A call that times out leaves no dangling entry anywhere.
    auto slow =
        agent.rpc_async(rpc::CallOptions{absl::Milliseconds(100)}, "w1", sleep_fn, int64_t{400});
    WCHECK(slow.status().code() == absl::StatusCode::kDeadlineExceeded);
    WCHECK(agent.stats().pending_outgoing == 0 && agent.stats().timers == 0);
    kill(static_cast<pid_t>(agent.rpc_sync("w1", pid_fn)), SIGKILL);
    const absl::Time t0 = absl::Now();
    absl::Status s = r.to_here_async(absl::Seconds(30)).status();
    WCHECK(s.code() == absl::StatusCode::kUnavailable && absl::StrContains(s.message(), "'w1'"));
    s = ps.rpc_async(&ParameterServer::updates).status();
    WCHECK(s.code() == absl::StatusCode::kUnavailable && absl::StrContains(s.message(), "'w1'"));
    WCHECK(absl::Now() - t0 < absl::Seconds(10));
    // Users of a dead owner do not hang at shutdown.
    const absl::Time t1 = absl::Now();
    (void)agent.Shutdown();
    WCHECK(absl::Now() - t1 < absl::Seconds(15));
    return 0;
  }
  // w1 waits to be killed (SIGKILL, above); 60 s only bounds it. Not
  // synchronization.
  absl::SleepFor(absl::Seconds(60));
  return 2;
}

TEST_P(RRefMultiProcess, DeadOwnerFailsCallsAndShutdownIsBounded) {
  auto results = Run("dead_owner", 2, absl::Seconds(90));
  EXPECT_EQ(results[0].exit_code, 0) << Describe(results);
  EXPECT_EQ(results[1].signal, SIGKILL) << Describe(results);
}

BATON_SCENARIO(rref_call_hooks) {
  Worker w = Start(nullptr, std::make_shared<ScalingHook>());
  auto& agent = *w.agent;
  if (agent.self().id == 0) {
    const at::Tensor x = at::ones({2});
    // remote(): the argument is scaled on the owner (x10), make_fn multiplies
    // by 10, and to_here's reply is scaled on arrival (x10).
    RRef<at::Tensor> r = remote(agent, "w1", make_fn, x);
    WCHECK(r.to_here().equal(x * 1000));
    // Methods: the argument is scaled on the owner, the result on arrival.
    RRef<ParameterServer> ps = remote<ParameterServer>(agent, "w1", int64_t{2});
    WCHECK(ps.rpc_sync(&ParameterServer::add, at::ones({2}, at::kDouble)) == 1);
    WCHECK(ps.rpc_sync(&ParameterServer::get).equal(at::full({2}, 100.0, at::kDouble)));
    // remote() to itself runs the receive hooks as well.
    RRef<at::Tensor> mine = remote(agent, "w0", make_fn, x);
    WCHECK(mine.to_here().equal(x * 100));
  }
  Finish(w);
  return 0;
}

TEST_P(RRefMultiProcess, CallHooksRunOnRemoteToHereAndMethods) {
  ExpectAllSucceeded(Run("rref_call_hooks", 2, absl::Seconds(120)));
}

long RssKb() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, rss = 0;
  in >> pages >> rss;
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

BATON_SCENARIO(rref_stress) {
  Worker w = Start();
  auto& agent = *w.agent;
  const int me = agent.self().id;
  std::mt19937 rng(100 + me);
  std::vector<RRef<at::Tensor>> live;
  const at::Tensor x = at::ones({8});
  long rss_mid = 0;
  // 4 workers x 2500 = 10,000 RRefs, created, forked and dropped at random.
  for (int i = 0; i < 2500; ++i) {
    live.push_back(remote(agent, static_cast<int>(rng() % 4), make_fn, x));
    if (rng() % 2 == 0 && !live.empty()) {
      // Fork one to a random worker, which keeps it (returns it).
      RRef<at::Tensor> back =
          agent.rpc_sync(static_cast<int>(rng() % 4), keep_fn, live[rng() % live.size()]);
      live.push_back(back);
    }
    while (live.size() > 32) live.erase(live.begin() + rng() % live.size());
    if (i == 1250) rss_mid = RssKb();
  }
  live.clear();
  WCHECK_OK(store::Barrier(agent.runtime().store(), agent.runtime().store_namespace() + "stress",
                           me, 4, absl::Seconds(120)));
  if (me == 0) ExpectAllEmpty(w);
  WCHECK_OK(store::Barrier(agent.runtime().store(), agent.runtime().store_namespace() + "checked",
                           me, 4, absl::Seconds(60)));
  const long rss_end = RssKb();
  if (rss_end > rss_mid + 64 * 1024) {
    std::fprintf(stderr, "memory grew from %ld KiB to %ld KiB\n", rss_mid, rss_end);
    return 1;
  }
  Finish(w);
  return 0;
}

TEST_P(RRefMultiProcess, StressTenThousandRRefsAcrossFourWorkersLeaveNothing) {
  ExpectAllSucceeded(Run("rref_stress", 4, absl::Seconds(240)));
}

// G9 on real processes: every worker owns RRefs and calls itself with them
// (an argument, a vector of two, a result coming back), and drops its own
// handle while the calls are in flight; RRefs of other owners come back to
// their owners the same way. Every use finds the value; every table ends
// empty. Before G9, the owner freed such values early (NOT_FOUND "already
// freed") and kept early entries after the run.
BATON_SCENARIO(rref_self_calls) {
  Worker w = Start();
  auto& agent = *w.agent;
  const int me = agent.self().id;
  std::mt19937 rng(7 + me);
  std::vector<rpc::Future<at::Tensor>> sums;
  std::vector<double> expected;
  std::vector<rpc::Future<RRef<at::Tensor>>> kept;
  for (int i = 0; i < 300; ++i) {
    const int owner = rng() % 2 == 0 ? me : static_cast<int>(rng() % 4);
    const double v = 1 + i % 7;
    RRef<at::Tensor> r = remote(agent, owner, make_fn, at::full({2}, v));  // 20 v in all
    sums.push_back(agent.rpc_async(owner, local_sum_fn, r));  // to its owner (me or not)
    expected.push_back(20 * v);
    sums.push_back(agent.rpc_async(owner, sum_all_fn, std::vector<RRef<at::Tensor>>{r, r}));
    expected.push_back(40 * v);
    kept.push_back(agent.rpc_async(owner, keep_fn, r));  // comes back from its owner
  }  // each handle dies with its calls in flight
  for (size_t k = 0; k < sums.size(); ++k) {
    auto v = sums[k].result();
    if (!v.ok() || v->item<double>() != expected[k]) {
      std::fprintf(stderr, "use %zu: %s\n", k,
                   v.ok() ? "wrong value" : v.status().ToString().c_str());
      return 1;
    }
  }
  for (auto& f : kept) {
    auto r = f.result();
    WCHECK_OK(r.status());
    WCHECK(r->to_here().sum().item<double>() > 0);
  }
  kept.clear();
  WCHECK_OK(store::Barrier(agent.runtime().store(), agent.runtime().store_namespace() + "self", me,
                           4, absl::Seconds(120)));
  if (me == 0) ExpectAllEmpty(w);
  WCHECK_OK(store::Barrier(agent.runtime().store(),
                           agent.runtime().store_namespace() + "self_checked", me, 4,
                           absl::Seconds(60)));
  Finish(w);
  return 0;
}

TEST_P(RRefMultiProcess, G9_OwnersCallingThemselvesWithTheirRRefsNeverFreeThemEarly) {
  ExpectAllSucceeded(Run("rref_self_calls", 4, absl::Seconds(180)));
}

}  // namespace
}  // namespace baton::rref
