// A job for tests/launcher/startup_restart_test.cc, run by baton-run with a
// "head" role of one worker (rank 0) and a "w" role. Every worker starts an
// agent from baton-run's environment. On its first start
// (BATON_RESTART_COUNT=0), the worker of rank --victim SIGKILLs itself at
// the rendezvous step named by --die_at (rpc::RendezvousStepName), so that
// baton-run restarts it with BATON_REJOIN=1 (P5, docs/peer_failures.md).
//
// Once started:
// - with --all_pairs (restart policy "worker": only the victim restarts),
//   a victim restarted after the init barrier (the job was running) first
//   calls every peer, which is how running peers learn of a rejoined
//   incarnation (P1; before the barrier, the others follow its new
//   registration at the barrier, P5); then every w worker reports to the
//   head, which
//   answers once every w rank reported; then every worker calls every
//   worker, itself included, and checks the incarnation each reports
//   (2 for a victim that took a round before it died, 1 otherwise);
// - without it (restart policy "role": the whole role restarts, survivors
//   too), every worker calls the head.
// Then every worker shuts down gracefully, and the head prints RESULT OK.
// Exit 1 with the reason on any failure.
//
// With --callee_restart (P7, P8; a head and two w workers, restart policy
// "worker", BATON_RESTART_WAIT as baton-run sets it): the head checks that
// rank 1 answers, then calls die() on it, which SIGKILLs rank 1 while the
// call runs (that call fails: it was delivered). baton-run restarts rank 1.
// Meanwhile the head asks rank 2, which has never called rank 1 and so
// knows nothing of its death, to call rank 1: that call's stream is
// refused by the dead address, so it is known undelivered and waits for
// the successor (P8); it must answer incarnation 2. The head's own next
// call must too (P7 or P8, whichever way it learns of the death).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/agent.h"
#include "tests/launcher/job_flags.h"

namespace baton {
namespace {

using rpc::CallContext;
using rpc::CallOptions;
using rpc::Function;

const Function<int64_t()> whoami_fn("whoami");
const Function<int64_t(int64_t)> hello_fn("hello");
// On the head: completes once every w rank reported (async: no thread waits).
const Function<int64_t(int64_t)> report_fn("report");
// --callee_restart: rank 1 SIGKILLs itself in it; on rank 2, calls whoami
// on the given rank and returns its answer.
const Function<int64_t()> die_fn("die");
const Function<int64_t(int64_t)> ask_fn("ask");

using ::baton::testing::Fail;
using ::baton::testing::Flag;

int RunCalleeRestart() {
  auto options = rpc::AgentOptions::FromEnv("w");
  if (!options.ok()) return Fail(options.status().ToString());
  const int rank = options->rank;
  options->timeouts.rpc = absl::Seconds(30);
  options->timeouts.init = absl::Seconds(60);
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  (void)registry->Register(whoami_fn,
                           [](const CallContext& ctx) { return ctx.runtime->incarnation(); });
  (void)registry->Register(die_fn, [rank]() -> int64_t {
    std::printf("rank %d: SIGKILL in die()\n", rank);
    std::fflush(stdout);
    raise(SIGKILL);
    return 0;
  });
  (void)registry->Register(ask_fn, [](const CallContext& ctx, int64_t to) -> int64_t {
    auto r = ctx.agent->rpc_async(CallOptions{absl::Seconds(30)}, static_cast<int>(to), whoami_fn)
                 .result();
    if (!r.ok()) throw std::runtime_error(r.status().ToString());
    return *r;
  });
  auto agent = rpc::RpcAgent::Create(*options, registry);
  if (!agent.ok()) return Fail(agent.status().ToString());
  std::printf("rank %d: started, incarnation %lld, restart_wait %s\n", rank,
              static_cast<long long>((*agent)->runtime().incarnation()),
              absl::FormatDuration(options->restarts.wait).c_str());
  std::fflush(stdout);
  if (rank == 0) {
    const CallOptions opts{absl::Seconds(30)};
    auto before = (*agent)->rpc_async(opts, 1, whoami_fn).result();
    if (!before.ok() || *before != 1) return Fail("rank 1 did not answer incarnation 1");
    auto died = (*agent)->rpc_async(opts, 1, die_fn).result();
    if (died.ok()) return Fail("die() on rank 1 returned");
    std::printf("rank 0: die() on rank 1 failed as expected: %s\n",
                died.status().ToString().c_str());
    auto asked =
        (*agent)->rpc_async(CallOptions{absl::Seconds(45)}, 2, ask_fn, int64_t{1}).result();
    if (!asked.ok()) return Fail(absl::StrCat("rank 2 -> rank 1: ", asked.status().ToString()));
    if (*asked != 2) return Fail(absl::StrCat("rank 2 reached incarnation ", *asked, " of rank 1"));
    auto after = (*agent)->rpc_async(opts, 1, whoami_fn).result();
    if (!after.ok()) return Fail(absl::StrCat("rank 0 -> rank 1: ", after.status().ToString()));
    if (*after != 2) return Fail(absl::StrCat("rank 0 reached incarnation ", *after));
  }
  if (absl::Status s = (*agent)->Shutdown(); !s.ok()) return Fail(s.ToString());
  if (rank == 0) std::printf("RESULT OK\n");
  std::fflush(stdout);
  return 0;
}

int Run(int argc, char** argv) {
  if (Flag(argc, argv, "callee_restart") == "1") return RunCalleeRestart();
  const std::string die_at = Flag(argc, argv, "die_at");
  int victim = -1;
  if (!absl::SimpleAtoi(Flag(argc, argv, "victim"), &victim)) return Fail("--victim=RANK");
  const bool all_pairs = Flag(argc, argv, "all_pairs") == "1";
  const char* restart_env = std::getenv("BATON_RESTART_COUNT");
  const bool first_start = restart_env == nullptr || std::string(restart_env) == "0";

  auto options = rpc::AgentOptions::FromEnv("w");
  if (!options.ok()) return Fail(options.status().ToString());
  const int rank = options->rank;
  const int world = options->world_size;
  options->timeouts.rpc = absl::Seconds(20);
  options->timeouts.init = absl::Seconds(60);

  // The head's record of the w ranks that reported, and their replies.
  absl::Mutex mu;
  std::set<int64_t> reported;
  std::vector<rpc::Promise<int64_t>> waiting;

  auto registry = std::make_shared<rpc::FunctionRegistry>();
  (void)registry->Register(whoami_fn,
                           [](const CallContext& ctx) { return ctx.runtime->incarnation(); });
  (void)registry->Register(hello_fn, [](int64_t from) { return from; });
  (void)registry->Register(report_fn, [&, world](int64_t from) {
    rpc::Promise<int64_t> p;
    std::vector<rpc::Promise<int64_t>> release;
    {
      absl::MutexLock lock(&mu);
      reported.insert(from);
      waiting.push_back(p);
      if (static_cast<int>(reported.size()) == world - 1) release.swap(waiting);
    }
    for (auto& w : release) w.SetValue(static_cast<int64_t>(world - 1));
    return p.future();
  });

  rpc::AgentCollaborators collaborators;
  collaborators.rendezvous_observer = [&](rpc::RendezvousStep step) {
    if (first_start && rank == victim && die_at == rpc::RendezvousStepName(step)) {
      std::printf("rank %d: SIGKILL at rendezvous step '%s'\n", rank, die_at.c_str());
      std::fflush(stdout);
      raise(SIGKILL);
    }
    return absl::OkStatus();
  };
  auto agent = rpc::RpcAgent::Create(*options, registry, std::move(collaborators));
  if (!agent.ok()) return Fail(agent.status().ToString());
  std::printf("rank %d: started, incarnation %lld\n", rank,
              static_cast<long long>((*agent)->runtime().incarnation()));
  std::fflush(stdout);
  const CallOptions opts{absl::Seconds(20)};

  if (all_pairs) {
    const bool after_barrier =
        die_at == rpc::RendezvousStepName(rpc::RendezvousStep::kAfterInitBarrier);
    if (!first_start && after_barrier) {
      for (int to = 0; to < world; ++to) {
        auto r = (*agent)->rpc_async(opts, to, hello_fn, int64_t{rank}).result();
        if (!r.ok()) return Fail(absl::StrCat("hello to rank ", to, ": ", r.status().ToString()));
      }
    }
    if (rank != 0) {
      auto r = (*agent)->rpc_async(opts, 0, report_fn, int64_t{rank}).result();
      if (!r.ok()) return Fail(absl::StrCat("report: ", r.status().ToString()));
    } else {
      absl::MutexLock lock(&mu);
      auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return static_cast<int>(reported.size()) == world - 1;
      };
      if (!mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60))) {
        return Fail("not every w rank reported");
      }
    }
    for (int to = 0; to < world; ++to) {
      auto r = (*agent)->rpc_async(opts, to, whoami_fn).result();
      if (!r.ok()) {
        return Fail(absl::StrCat("rank ", rank, " -> ", to, ": ", r.status().ToString()));
      }
      const int64_t expected =
          to == victim && die_at != rpc::RendezvousStepName(rpc::RendezvousStep::kConnectingStore)
              ? 2
              : 1;
      if (*r != expected) {
        return Fail(
            absl::StrCat("rank ", to, " reports incarnation ", *r, ", expected ", expected));
      }
    }
  } else {
    auto r = (*agent)->rpc_async(opts, 0, whoami_fn).result();
    if (!r.ok()) return Fail(absl::StrCat("rank ", rank, " -> 0: ", r.status().ToString()));
  }
  if (absl::Status s = (*agent)->Shutdown(); !s.ok()) return Fail(s.ToString());
  if (rank == 0) std::printf("RESULT OK\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Run(argc, argv); }
