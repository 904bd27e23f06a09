// The hub of the soak job (soak_job.cc): rank 0, lives for the whole job.
// It owns every RRef of the workload (remote() values, lent values, one
// Accumulator per trainer incarnation), holds W1 of the distributed-autograd
// model, counts what it served, hears trainer deaths through its agent's
// peer-failure listener, decides when the load stops, and at the end checks
// itself and the PS for leaks and prints the verdict (RESULT OK / FAILED).
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <optional>
#include <typeinfo>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "dist_autograd/dist_autograd.h"
#include "testing/eventually.h"
#include "tests/soak/soak_common.h"

namespace baton::soak {
namespace {

using rref::RRef;

struct Hub {
  explicit Hub(Worker& worker) : w(worker) {}
  Worker& w;

  absl::Mutex mu;
  std::map<int64_t, int64_t> current ABSL_GUARDED_BY(mu);        // rank -> latest incarnation
  std::map<int64_t, int64_t> incarnations ABSL_GUARDED_BY(mu);   // rank -> hellos
  std::map<int64_t, absl::Time> hello_time ABSL_GUARDED_BY(mu);  // of the latest incarnation
  // Every hello per rank: (when, incarnation), in order.
  std::map<int64_t, std::vector<std::pair<absl::Time, int64_t>>> hellos ABSL_GUARDED_BY(mu);
  // The hub's death confirmations per rank.
  std::map<int64_t, std::vector<absl::Time>> confirmations ABSL_GUARDED_BY(mu);
  // The last plain call of each (rank, incarnation): a confirmation of a
  // death followed by calls of the same incarnation was stale.
  std::map<std::pair<int64_t, int64_t>, absl::Time> last_tick ABSL_GUARDED_BY(mu);
  std::map<int64_t, int64_t> done ABSL_GUARDED_BY(mu);  // rank -> finished incarnation
  std::vector<int64_t> totals ABSL_GUARDED_BY(mu) = std::vector<int64_t>(kNumCounters, 0);
  bool stop ABSL_GUARDED_BY(mu) = false;

  absl::Mutex w_mu;
  at::Tensor w1 ABSL_GUARDED_BY(w_mu);

  std::atomic<int64_t> ticks{0}, makes{0}, lends{0}, forwards{0}, applies{0}, full_applies{0};
};

absl::Status RegisterHubFunctions(std::shared_ptr<Hub> hub) {
  rpc::FunctionRegistry& r = *hub->w.registry;
  const Flags flags = hub->w.flags;
  absl::Status s = r.Register(hello_fn, [hub](int64_t rank, int64_t inc, int64_t pid) {
    {
      absl::MutexLock lock(&hub->mu);
      ++hub->incarnations[rank];
      hub->current[rank] = inc;
      hub->hello_time[rank] = absl::Now();
      hub->hellos[rank].emplace_back(hub->hello_time[rank], inc);
    }
    Say(kHub, absl::StrCat("HELLO rank=", rank, " incarnation=", inc, " pid=", pid));
    return true;
  });
  if (!s.ok()) return s;
  s = r.Register(tick_fn, [hub](int64_t rank, int64_t inc, at::Tensor x) {
    ++hub->ticks;
    absl::MutexLock lock(&hub->mu);
    hub->last_tick[{rank, inc}] = absl::Now();
    return std::make_tuple(hub->stop, x + 1);
  });
  if (!s.ok()) return s;
  s = r.Register(make_fn, [hub](Tag tag) {
    ++hub->makes;
    return TagTensor(tag);
  });
  if (!s.ok()) return s;
  s = r.Register(
      lend_fn,
      [hub, flags](const rpc::CallContext& ctx, Tag tag) -> absl::StatusOr<RRef<at::Tensor>> {
        RRef<at::Tensor> lent = rref::MakeOwned(*ctx.agent, TagTensor(tag));
        auto kept =
            ctx.agent->rpc_async(NestedTimeout(flags, ctx), kPs, keep_fn, KeepKey(tag), lent)
                .result();
        if (!kept.ok()) return kept.status();
        ++hub->lends;
        return lent;
      });
  if (!s.ok()) return s;
  s = r.Register(
      forward_fn,
      [hub, flags](const rpc::CallContext& ctx, at::Tensor x) -> absl::StatusOr<at::Tensor> {
        at::Tensor w1;
        {
          absl::MutexLock lock(&hub->w_mu);
          w1 = hub->w1;
        }
        at::Tensor h = at::tanh(x.mm(w1));
        auto z = ctx.agent->rpc_async(NestedTimeout(flags, ctx), kPs, ps_forward_fn, h).result();
        if (!z.ok()) return z.status();
        ++hub->forwards;
        return *z;
      });
  if (!s.ok()) return s;
  s = r.Register(
      apply_fn,
      [hub, flags](const rpc::CallContext& ctx, int64_t context_id) -> absl::StatusOr<int64_t> {
        auto grads = dist_autograd::GetGradients(*ctx.agent, context_id);
        if (!grads.ok()) return grads.status();
        int64_t found = 0;
        for (const auto& [leaf, g] : grads->items()) {
          absl::MutexLock lock(&hub->w_mu);
          if (!g.defined() || !g.sizes().equals(hub->w1.sizes())) continue;
          at::NoGradGuard no_grad;
          hub->w1 = (hub->w1.detach() - 0.01 * g).requires_grad_(true);
          ++found;
        }
        auto ps =
            ctx.agent->rpc_async(NestedTimeout(flags, ctx), kPs, ps_apply_fn, context_id).result();
        if (!ps.ok()) return ps.status();
        ++hub->applies;
        if (found + *ps == 2) ++hub->full_applies;
        return found + *ps;
      });
  if (!s.ok()) return s;
  return r.Register(done_fn, [hub](int64_t rank, int64_t inc, std::vector<int64_t> counters) {
    absl::MutexLock lock(&hub->mu);
    hub->done[rank] = inc;
    for (size_t i = 0; i < counters.size() && i < hub->totals.size(); ++i) {
      hub->totals[i] += counters[i];
    }
    return true;
  });
}

// Whose an RRef value the hub owns is: {rank, incarnation}, or nullopt.
// OwnedValue() of an id created elsewhere that is no longer owned would
// enter it as early (G3), so this runs only once no deletion is in flight:
// every live trainer waited until its deletions were processed before done().
std::optional<std::pair<int64_t, int64_t>> Attribute(Worker& w, rref::RRefId id) {
  auto f = w.rrefs->context()->OwnedValue(id);
  if (!f.ok() || !f->ready() || !f->result().ok()) return std::nullopt;
  const rpc::AnyValue& v = *f->result();
  if (v.type == typeid(at::Tensor).name()) {
    auto tag = TagOf(*static_cast<const at::Tensor*>(v.ptr.get()));
    if (tag.ok()) return std::make_pair((*tag)[0], (*tag)[1]);
  } else if (v.type == typeid(Accumulator).name()) {
    const auto* a = static_cast<const Accumulator*>(v.ptr.get());
    return std::make_pair(a->rank(), a->incarnation());
  }
  return std::nullopt;
}

// The end-of-run state of the hub and the PS, with what the hub could
// attribute.
struct EndState {
  LeakState hub, ps;
  bool ps_ok = false;
  std::string ps_error;
  int64_t owned_by_dead = 0;    // hub RRefs whose value belongs to a dead incarnation
  int64_t owned_by_live = 0;    // ... to a live one (all live trainers dropped theirs)
  int64_t owned_unknown = 0;    // not attributable (not created, unknown type)
  int64_t ps_held_by_dead = 0;  // PS user entries of dead incarnations' values
  int64_t ps_held_other = 0;
  std::vector<std::string> details;

  // Everything settled: nothing held for a dead incarnation either (RRef
  // G7, distributed autograd D4).
  bool Settled(int64_t restarts) const {
    return hub.rref_held == 0 && hub.rref_unanswered == 0 && hub.rref_early == 0 &&
           hub.contexts == 0 && hub.pending_outgoing == 0 && hub.running_incoming == 0 &&
           hub.shm_busy_segments <= restarts && owned_by_live == 0 && owned_unknown == 0 && ps_ok &&
           ps.rref_owned == 0 && ps.rref_unanswered == 0 && ps.rref_early == 0 &&
           ps.contexts == 0 && ps.pending_outgoing == 0 && ps.running_incoming <= 1 &&
           ps.shm_busy_segments <= restarts && ps.kept == 0 && ps_held_other == 0 &&
           owned_by_dead == 0 && ps_held_by_dead == 0;
  }
};

EndState MeasureEnd(Hub& hub) {
  EndState e;
  e.hub = LeakState::Measure(hub.w, 0);
  std::map<int64_t, int64_t> current;
  {
    absl::MutexLock lock(&hub.mu);
    current = hub.current;
  }
  const rref::RRefDebugState state = hub.w.rrefs->DebugState();
  absl::flat_hash_map<rref::RRefId, std::optional<std::pair<int64_t, int64_t>>> whose;
  for (const auto& o : state.owned) {
    auto who = Attribute(hub.w, o.rref);
    whose[o.rref] = who;
    if (!who.has_value()) {
      ++e.owned_unknown;
      e.details.push_back(absl::StrCat("hub owns ", o.rref.ToString(), " (unattributable, ",
                                       o.forks.size(), " forks)"));
    } else if (current[who->first] == who->second) {
      ++e.owned_by_live;
      e.details.push_back(absl::StrCat("hub owns ", o.rref.ToString(), " of live rank ", who->first,
                                       " incarnation ", who->second, " (", o.forks.size(),
                                       " forks, local_refs ", o.local_refs, ")"));
    } else {
      ++e.owned_by_dead;
    }
  }
  auto ps = hub.w.agent->rpc_async(CallTimeout(hub.w.flags), kPs, ps_state_fn).result();
  e.ps_ok = ps.ok();
  if (!ps.ok()) {
    e.ps_error = std::string(ps.status().message());
    return e;
  }
  e.ps = LeakState::FromVector(*ps);
  for (size_t i = 0; i + 1 < e.ps.held_ids.size(); i += 2) {
    const rref::RRefId id{static_cast<int32_t>(e.ps.held_ids[i]),
                          static_cast<uint64_t>(e.ps.held_ids[i + 1])};
    auto it = whose.find(id);
    if (it != whose.end() && it->second.has_value() &&
        current[it->second->first] != it->second->second) {
      ++e.ps_held_by_dead;
    } else {
      ++e.ps_held_other;
      e.details.push_back(absl::StrCat("ps holds ", id.ToString(), " (not a dead incarnation's)"));
    }
  }
  return e;
}

}  // namespace

int RunHub(Worker& w) {
  auto hub = std::make_shared<Hub>(w);
  {
    absl::MutexLock lock(&hub->w_mu);
    hub->w1 = (at::randn({8, 16}, at::kFloat) * 0.3).requires_grad_(true);
  }
  if (absl::Status s = RegisterHubFunctions(hub); !s.ok()) {
    Say(w.name, absl::StrCat("setup error: ", s.ToString()));
    return 1;
  }
  if (absl::Status s = StartAgent(w,
                                  [hub](int peer) {
                                    absl::MutexLock lock(&hub->mu);
                                    hub->confirmations[peer].push_back(absl::Now());
                                  });
      !s.ok()) {
    return Say(w.name, s.ToString()), 1;
  }
  Say(w.name, absl::StrCat("pid ", getpid(), " up"));
  const int64_t trainers = static_cast<int64_t>(TrainerNames(w.env).size());
  std::vector<std::string> failed;

  // 1. Every trainer said hello; warm-up; baseline.
  {
    absl::MutexLock lock(&hub->mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(hub->mu) {
      return static_cast<int64_t>(hub->current.size()) == trainers;
    };
    if (!hub->mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(120))) {
      failed.push_back(absl::StrCat("only ", hub->current.size(), " of ", trainers,
                                    " trainers said hello within 120 s"));
    }
  }
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(w.flags.warm_s));  // the load's warm-up period, not a wait
  const int64_t hub_fds0 = CountOpenFds();
  const FdKinds hub_fd_kinds0 = OpenFdKinds();
  auto ps0 = w.agent->rpc_async(CallTimeout(w.flags), kPs, ps_state_fn).result();
  const int64_t ps_fds0 = ps0.ok() ? LeakState::FromVector(*ps0).fds : -1;
  Say(w.name, absl::StrCat("WARM hub_fds=", hub_fds0, " ps_fds=", ps_fds0));

  // 2. Load until the end of the run, then stop the trainers.
  // The load phase's length (the scenario), not a wait for an event.
  absl::SleepFor(start + absl::Seconds(w.flags.duration_s) - absl::Now());
  {
    absl::MutexLock lock(&hub->mu);
    hub->stop = true;
  }
  Say(w.name, "STOP");
  {
    absl::MutexLock lock(&hub->mu);
    auto finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(hub->mu) {
      for (const auto& [rank, inc] : hub->current) {
        auto it = hub->done.find(rank);
        if (it == hub->done.end() || it->second != inc) return false;
      }
      return true;
    };
    if (!hub->mu.AwaitWithTimeout(absl::Condition(&finished), absl::Seconds(90))) {
      failed.push_back("not every trainer finished within 90 s of STOP");
    }
  }
  auto dropped = w.agent->rpc_async(CallTimeout(w.flags), kPs, drop_kept_fn).result();
  if (!dropped.ok()) failed.push_back(absl::StrCat("drop_kept: ", dropped.status().ToString()));

  // 3. Leaks: wait (bounded) until everything that can settle did.
  int64_t restarts = 0;
  std::map<int64_t, int64_t> incarnations;
  {
    absl::MutexLock lock(&hub->mu);
    incarnations = hub->incarnations;
    for (const auto& [rank, n] : incarnations) restarts += n - 1;
  }
  // Polls counters with no notification.
  EndState end;
  (void)baton::testing::Eventually(
      [&] {
        end = MeasureEnd(*hub);
        return end.Settled(restarts);
      },
      absl::Seconds(20));
  // Deaths per rank, on the hub and the PS: confirmations, and those that
  // came while the incarnation then current went on calling (more than a
  // second later: not a call in flight), i.e. stale ones.
  std::map<int64_t, int64_t> deaths, stale, ps_deaths, ps_stale;
  auto ps_list = w.agent->rpc_async(CallTimeout(w.flags), kPs, confirmations_fn).result();
  {
    absl::MutexLock lock(&hub->mu);
    auto count = [&](int64_t rank, absl::Time t, std::map<int64_t, int64_t>& all,
                     std::map<int64_t, int64_t>& stale_ones)
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(hub->mu) {
                       ++all[rank];
                       int64_t inc = -1;
                       for (const auto& [when, i] : hub->hellos[rank]) {
                         if (when < t) inc = i;
                       }
                       auto it = hub->last_tick.find({rank, inc});
                       if (it != hub->last_tick.end() && it->second > t + absl::Seconds(1))
                         ++stale_ones[rank];
                     };
    for (const auto& [rank, times] : hub->confirmations) {
      for (absl::Time t : times) count(rank, t, deaths, stale);
    }
    if (ps_list.ok()) {
      for (size_t i = 0; i + 1 < ps_list->size(); i += 2) {
        count((*ps_list)[i], absl::FromUnixMicros((*ps_list)[i + 1]), ps_deaths, ps_stale);
      }
    }
  }
  Say(w.name, absl::StrCat("LEAKS hub ", end.hub.ToString()));
  Say(w.name, absl::StrCat("LEAKS ps ", end.ps_ok ? end.ps.ToString() : end.ps_error));
  Say(w.name,
      absl::StrCat("LEAKS attributed hub_owned_by_dead=", end.owned_by_dead, " hub_owned_by_live=",
                   end.owned_by_live, " hub_owned_unknown=", end.owned_unknown,
                   " ps_held_by_dead=", end.ps_held_by_dead, " ps_held_other=", end.ps_held_other));
  for (const auto& d : end.details) Say(w.name, absl::StrCat("LEAK ", d));
  Say(w.name, absl::StrCat("FDS changed since warm: ", FdDiff(hub_fd_kinds0, OpenFdKinds())));
  if (!end.Settled(restarts)) {
    failed.push_back("leak: state did not settle (see LEAKS lines)");
  }
  if (end.hub.fds - hub_fds0 > w.flags.fd_slack) {
    failed.push_back(absl::StrCat("leak: hub fds ", hub_fds0, " -> ", end.hub.fds));
  }
  if (end.ps_ok && end.ps.fds - ps_fds0 > w.flags.fd_slack) {
    failed.push_back(absl::StrCat("leak: ps fds ", ps_fds0, " -> ", end.ps.fds));
  }
  if (end.owned_by_dead + end.ps_held_by_dead > 0) {
    failed.push_back("leak: RRefs held only by dead trainer incarnations");
  }
  // Every replaced incarnation's death was confirmed, naming it.
  for (const auto& [rank, n] : incarnations) {
    Say(w.name,
        absl::StrCat("DEATHS rank=", rank, " incarnations=", n, " confirmed_deaths=", deaths[rank],
                     " stale=", stale[rank], " ps_confirmed_deaths=", ps_deaths[rank],
                     " ps_stale=", ps_stale[rank]));
    if (deaths[rank] < n - 1) {
      failed.push_back(absl::StrCat("rank ", rank, ": ", n - 1, " restarts but ", deaths[rank],
                                    " confirmed deaths"));
    }
    // P2 (docs/peer_failures.md): a live incarnation is never reported dead.
    if (stale[rank] + ps_stale[rank] > 0) {
      failed.push_back(absl::StrCat("rank ", rank, ": ", stale[rank] + ps_stale[rank],
                                    " stale death confirmation(s) of a live incarnation"));
    }
  }
  std::vector<int64_t> totals;
  {
    absl::MutexLock lock(&hub->mu);
    totals = hub->totals;
  }
  std::string counters;
  for (int i = 0; i < kNumCounters; ++i) {
    absl::StrAppend(&counters, " ", kCounterNames[i], "=", totals[i]);
  }
  Say(w.name, absl::StrCat("SUMMARY served ticks=", hub->ticks.load(), " makes=", hub->makes.load(),
                           " lends=", hub->lends.load(), " forwards=", hub->forwards.load(),
                           " applies=", hub->applies.load(),
                           " full_applies=", hub->full_applies.load(), " restarts=", restarts));
  Say(w.name, absl::StrCat("SUMMARY finished-trainers", counters));
  if (failed.empty()) {
    Say(w.name, "RESULT OK");
  } else {
    Say(w.name, absl::StrCat("RESULT FAILED: ", absl::StrJoin(failed, "; ")));
  }
  auto fin = w.agent->rpc_async(CallTimeout(w.flags), kPs, finish_fn).result();
  if (!fin.ok()) Say(w.name, absl::StrCat("finish: ", fin.status().ToString()));
  absl::Status s = w.agent->Shutdown();
  Say(w.name, absl::StrCat("shutdown: ", s.ToString()));
  return 0;
}

}  // namespace baton::soak
