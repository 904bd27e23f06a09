// The parameter server of the soak job (soak_job.cc): rank 1, lives for the
// whole job. It serves the PS tables (ps::PsServer, asynchronous), holds W2
// of the distributed-autograd model (the hub's forward calls it, nested),
// keeps RRefs the hub lends until a trainer takes them (user-to-user forks),
// hears trainer deaths, reports its leak measurements to the hub, and shuts
// down when the hub says it is done with its checks.
#include <unistd.h>

#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "dist_autograd/dist_autograd.h"
#include "ps/server.h"
#include "tests/soak/soak_common.h"

namespace baton::soak {
namespace {

using rref::RRef;

struct Ps {
  explicit Ps(Worker& worker) : w(worker) {}
  Worker& w;
  absl::Mutex mu;
  std::map<std::string, RRef<at::Tensor>> kept ABSL_GUARDED_BY(mu);
  at::Tensor w2 ABSL_GUARDED_BY(mu);
  int64_t keeps ABSL_GUARDED_BY(mu) = 0, takes ABSL_GUARDED_BY(mu) = 0;
  int64_t forwards ABSL_GUARDED_BY(mu) = 0, applies ABSL_GUARDED_BY(mu) = 0;
  std::map<int64_t, std::vector<absl::Time>> confirmations ABSL_GUARDED_BY(mu);  // per rank
  absl::Notification finish;
  // Descriptors at the hub's first state call (its warm baseline).
  std::optional<FdKinds> fd_kinds0 ABSL_GUARDED_BY(mu);
};

absl::Status RegisterPsFunctions(std::shared_ptr<Ps> ps) {
  rpc::FunctionRegistry& r = *ps->w.registry;
  absl::Status s = r.Register(keep_fn, [ps](std::string key, RRef<at::Tensor> ref) {
    absl::MutexLock lock(&ps->mu);
    ps->kept[key] = std::move(ref);
    ++ps->keeps;
    return true;
  });
  if (!s.ok()) return s;
  s = r.Register(take_fn, [ps](std::string key) -> absl::StatusOr<RRef<at::Tensor>> {
    absl::MutexLock lock(&ps->mu);
    auto it = ps->kept.find(key);
    if (it == ps->kept.end()) {
      return absl::NotFoundError(absl::StrCat("worker 'ps0' keeps no RRef under '", key, "'"));
    }
    RRef<at::Tensor> out = std::move(it->second);
    ps->kept.erase(it);
    ++ps->takes;
    return out;
  });
  if (!s.ok()) return s;
  s = r.Register(ps_forward_fn, [ps](at::Tensor h) {
    at::Tensor w2;
    {
      absl::MutexLock lock(&ps->mu);
      w2 = ps->w2;
      ++ps->forwards;
    }
    return h.mm(w2);
  });
  if (!s.ok()) return s;
  s = r.Register(ps_apply_fn,
                 [ps](const rpc::CallContext& ctx, int64_t context_id) -> absl::StatusOr<int64_t> {
                   auto grads = dist_autograd::GetGradients(*ctx.agent, context_id);
                   if (!grads.ok()) return grads.status();
                   int64_t found = 0;
                   absl::MutexLock lock(&ps->mu);
                   for (const auto& [leaf, g] : grads->items()) {
                     if (!g.defined() || !g.sizes().equals(ps->w2.sizes())) continue;
                     at::NoGradGuard no_grad;
                     ps->w2 = (ps->w2.detach() - 0.01 * g).requires_grad_(true);
                     ++found;
                   }
                   ++ps->applies;
                   return found;
                 });
  if (!s.ok()) return s;
  s = r.Register(drop_kept_fn, [ps]() {
    std::map<std::string, RRef<at::Tensor>> orphans;
    {
      absl::MutexLock lock(&ps->mu);
      orphans.swap(ps->kept);
    }
    return static_cast<int64_t>(orphans.size());  // released here, outside the lock
  });
  if (!s.ok()) return s;
  s = r.Register(ps_state_fn, [ps]() {
    int64_t kept = 0;
    {
      absl::MutexLock lock(&ps->mu);
      kept = static_cast<int64_t>(ps->kept.size());
      if (!ps->fd_kinds0.has_value()) ps->fd_kinds0 = OpenFdKinds();
    }
    return LeakState::Measure(ps->w, kept).ToVector();
  });
  if (!s.ok()) return s;
  s = r.Register(confirmations_fn, [ps]() {
    absl::MutexLock lock(&ps->mu);
    std::vector<int64_t> out;
    for (const auto& [rank, times] : ps->confirmations) {
      for (absl::Time t : times) {
        out.push_back(rank);
        out.push_back(absl::ToUnixMicros(t));
      }
    }
    return out;
  });
  if (!s.ok()) return s;
  return r.Register(finish_fn, [ps]() {
    ps->finish.Notify();
    return true;
  });
}

}  // namespace

int RunPs(Worker& w) {
  auto ps = std::make_shared<Ps>(w);
  {
    absl::MutexLock lock(&ps->mu);
    ps->w2 = (at::randn({16, 4}, at::kFloat) * 0.3).requires_grad_(true);
  }
  if (absl::Status s = RegisterPsFunctions(ps); !s.ok()) {
    Say(w.name, absl::StrCat("setup error: ", s.ToString()));
    return 1;
  }
  ps::ServerOptions so;
  so.server = 0;
  so.num_servers = 1;
  auto server =
      ps::PsServer::Create(MakeSpec(static_cast<int>(TrainerNames(w.env).size())), so, *w.registry);
  if (!server.ok()) return Say(w.name, server.status().ToString()), 1;
  if (absl::Status s = StartAgent(w,
                                  [ps](int peer) {
                                    absl::MutexLock lock(&ps->mu);
                                    ps->confirmations[peer].push_back(absl::Now());
                                  });
      !s.ok()) {
    return Say(w.name, s.ToString()), 1;
  }
  Say(w.name, absl::StrCat("pid ", getpid(), " up"));
  // Serve until the hub is done with its checks (bounded: the load, the
  // hub's end phase and a margin).
  if (!ps->finish.WaitForNotificationWithTimeout(absl::Seconds(w.flags.duration_s + 300))) {
    Say(w.name, "the hub never said finish");
  }
  {
    absl::MutexLock lock(&ps->mu);
    if (ps->fd_kinds0.has_value()) {
      Say(w.name, absl::StrCat("FDS changed since warm: ", FdDiff(*ps->fd_kinds0, OpenFdKinds())));
    }
  }
  absl::Status s = w.agent->Shutdown();
  const ps::ShardStats st = (*server)->shard().Stats();
  int64_t pushes = 0, pulls = 0;
  for (const auto& t : st.tables) {
    pushes += t.pushes;
    pulls += t.pulls;
  }
  {
    absl::MutexLock lock(&ps->mu);
    Say(w.name, absl::StrCat("SUMMARY served ps_pushes=", pushes, " ps_pulls=", pulls,
                             " applied_pushes=", st.applied_pushes, " keeps=", ps->keeps, " takes=",
                             ps->takes, " forwards=", ps->forwards, " applies=", ps->applies));
  }
  Say(w.name, absl::StrCat("shutdown: ", s.ToString()));
  (void)(*server)->Stop(/*final_checkpoint=*/false);
  return 0;
}

}  // namespace baton::soak
