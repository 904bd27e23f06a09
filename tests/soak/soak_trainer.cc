// A trainer of the soak job (soak_job.cc): ranks 2 and up, killed with
// SIGKILL and restarted alone by baton-run (BATON_REJOIN=1) at random
// times. Each incarnation says hello to the hub, joins the PS, creates its
// Accumulator on the hub, prints READY, and loops over mixed load until the
// hub says stop: a plain call (small or 64 KiB), remote() + to_here(), a
// value lent by the hub through the PS (owner fork, then user-to-user fork),
// a remote-object method call, a distributed-autograd step through the hub
// and the PS, and PS pulls and pushes. It checks every value it gets back,
// prints every failure with its class, and reports its counters to the hub.
#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "dist_autograd/dist_autograd.h"
#include "ps/client.h"
#include "tests/soak/soak_common.h"

namespace baton::soak {
namespace {

using rref::RRef;

class Trainer {
 public:
  explicit Trainer(Worker& w)
      : w_(w),
        rank_(w.env.rank),
        inc_(w.env.restart_count),
        mortal_(TrainerNames(w.env)),
        everyone_(AllNames(w.env)),
        opts_(CallTimeout(w.flags)),
        timeout_(absl::Seconds(w.flags.call_timeout_s)) {}

  int Run();

 private:
  // One step; false when the hub said stop.
  bool Step(int64_t seq);
  // The parts of a step; each returns false if it failed.
  bool Tick(int64_t seq, bool* stop);
  bool RemoteValue(int64_t seq);
  bool LentValue(int64_t seq);
  bool MethodCall();
  bool AutogradStep();
  bool PsStep(int64_t seq);
  // Records a failed operation; returns false.
  bool Fail(const std::string& op, const absl::Status& s);
  // Records a value that is not what was sent or made; returns false.
  bool Wrong(const std::string& op, const std::string& what);
  absl::Status Setup();

  Worker& w_;
  const int64_t rank_, inc_;
  const std::vector<std::string> mortal_, everyone_;
  const rpc::CallOptions opts_;
  const absl::Duration timeout_;
  std::unique_ptr<ps::PsClient> client_;
  RRef<Accumulator> acc_;
  int64_t adds_ = 0;
  bool adds_known_ = true;
  std::vector<int64_t> counters_ = std::vector<int64_t>(kNumCounters, 0);
};

bool Trainer::Fail(const std::string& op, const absl::Status& s) {
  ++counters_[kFailures];
  ReportFailure(w_.name, op, s, mortal_, everyone_);
  return false;
}

bool Trainer::Wrong(const std::string& op, const std::string& what) {
  ++counters_[kFailures];
  Say(w_.name, absl::StrCat("FAILURE op=", op, " class=WRONG_VALUE msg=", what));
  return false;
}

absl::Status Trainer::Setup() {
  auto hello = w_.agent->rpc_async(opts_, kHub, hello_fn, rank_, inc_, int64_t{getpid()}).result();
  if (!hello.ok()) return Annotate(hello.status(), "hello");
  ps::PsClient::Options co;
  co.trainer = w_.env.role_rank;
  co.servers = {kPs};
  co.timeout = timeout_;
  auto client = ps::PsClient::Create(*w_.agent, MakeSpec(static_cast<int>(mortal_.size())), co);
  if (!client.ok()) return Annotate(client.status(), "joining the PS");
  client_ = *std::move(client);
  if (absl::Status s = client_->InitDense({"w"}, {at::zeros({64, 256}, at::kFloat)}); !s.ok()) {
    return Annotate(s, "InitDense");
  }
  try {
    acc_ = rref::remote<Accumulator>(*w_.agent, kHub, rank_, inc_);
  } catch (const Error& e) {
    return Annotate(e.status(), "remote<Accumulator>");
  }
  return Annotate(acc_.created().Wait(timeout_), "creating the Accumulator");
}

bool Trainer::Step(int64_t seq) {
  ++counters_[kIterations];
  bool stop = false;
  // Without the hub nothing else can work: end the step.
  if (!Tick(seq, &stop)) return true;
  if (stop) return false;
  // Each part runs even if an earlier one failed, so one problem does not
  // hide another.
  RemoteValue(seq);
  LentValue(seq);
  MethodCall();
  AutogradStep();
  PsStep(seq);
  return true;
}

bool Trainer::Tick(int64_t seq, bool* stop) {
  // A plain call; every fourth one carries 64 KiB (same-host bulk path).
  const bool big = seq % 4 == 0;
  const at::Tensor x = at::full({big ? 16384 : 16}, static_cast<double>(seq % 1000));
  auto tick = w_.agent->rpc_async(opts_, kHub, tick_fn, rank_, inc_, x).result();
  if (!tick.ok()) return Fail("tick", tick.status());
  ++counters_[kCalls];
  *stop = std::get<0>(*tick);
  if (!at::equal(std::get<1>(*tick), x + 1)) return Wrong("tick", "echo is not x + 1");
  return true;
}

bool Trainer::RemoteValue(int64_t seq) {
  // remote() on the hub, to_here().
  const Tag made = {rank_, inc_, seq, kKindRemote};
  try {
    RRef<at::Tensor> r1 = rref::remote(*w_.agent, opts_, kHub, make_fn, made);
    auto v = r1.to_here_async(timeout_).result();
    if (!v.ok()) return Fail("remote.to_here", v.status());
    auto tag = TagOf(*v);
    if (!tag.ok() || *tag != made) {
      return Wrong("remote.to_here",
                   absl::StrCat("RRef ", r1.id(), " made for ", TagText(made), " holds ",
                                tag.ok() ? TagText(*tag) : tag.status().ToString()));
    }
    ++counters_[kRemotes];
  } catch (const Error& e) {
    return Fail("remote", e.status());
  }
  return true;
}

bool Trainer::LentValue(int64_t seq) {
  // A value the hub owns, forked to the PS and to us; then the PS's copy,
  // forked to us by the PS (a user-to-user fork the hub confirms to the PS).
  const Tag lent = {rank_, inc_, seq, kKindLent};
  auto r2 = w_.agent->rpc_async(opts_, kHub, lend_fn, lent).result();
  if (!r2.ok()) return Fail("lend", r2.status());
  auto v2 = r2->to_here_async(timeout_).result();
  if (!v2.ok()) return Fail("lend.to_here", v2.status());
  auto r3 = w_.agent->rpc_async(opts_, kPs, take_fn, KeepKey(lent)).result();
  if (!r3.ok()) return Fail("take", r3.status());
  counters_[kForks] += 2;
  auto v3 = r3->to_here_async(timeout_).result();
  if (!v3.ok()) return Fail("take.to_here", v3.status());
  auto t2 = TagOf(*v2), t3 = TagOf(*v3);
  if (!t2.ok() || *t2 != lent || !t3.ok() || *t3 != lent || r2->id() != r3->id()) {
    return Wrong("lend", absl::StrCat("lent ", TagText(lent), " as ", r2->id(), "; got ",
                                      t2.ok() ? TagText(*t2) : "?", " and ", r3->id(), " = ",
                                      t3.ok() ? TagText(*t3) : "?"));
  }
  return true;
}

bool Trainer::MethodCall() {
  // A method of this incarnation's remote object.
  auto added = acc_.rpc_async(&Accumulator::add, at::ones({4})).result();
  if (!added.ok()) {
    adds_known_ = false;  // it may have been applied
    return Fail("acc.add", added.status());
  }
  const std::vector<int64_t>& a = *added;
  const bool count_ok = a.size() == 3 && (adds_known_ ? a[2] == adds_ + 1 : a[2] > adds_);
  if (a.size() != 3 || a[0] != rank_ || a[1] != inc_ || !count_ok) {
    adds_known_ = false;
    return Wrong("acc.add",
                 absl::StrCat("Accumulator ", acc_.id(), " of rank ", rank_, " incarnation ", inc_,
                              " after ", adds_, " adds says [", absl::StrJoin(a, ","), "]"));
  }
  adds_ = a[2];
  adds_known_ = true;
  ++counters_[kAccAdds];
  return true;
}

bool Trainer::AutogradStep() {
  // Forward through the hub (W1) and the PS (W2), backward across both, SGD
  // on both with this context's gradients. A failure is classified once the
  // context has ended: calls made inside it would carry it.
  std::string op;
  absl::Status s;
  int64_t context_id = 0, found = 0;
  {
    dist_autograd::Context ctx(*w_.agent);
    context_id = ctx.id();
    const at::Tensor in = at::randn({4, 8});
    auto y = w_.agent->rpc_async(opts_, kHub, forward_fn, in).result();
    op = "autograd.forward";
    s = y.status();
    if (s.ok()) {
      const at::Tensor loss = (*y - 1).pow(2).mean();
      op = "autograd.backward";
      s = dist_autograd::Backward(*w_.agent, ctx.id(), {loss}, false, timeout_);
    }
    if (s.ok()) {
      auto n = w_.agent->rpc_async(opts_, kHub, apply_fn, ctx.id()).result();
      op = "autograd.apply";
      s = n.status();
      if (s.ok()) found = *n;
    }
  }
  if (!s.ok()) return Fail(op, s);
  if (found != 2) {
    return Wrong("autograd.apply", absl::StrCat("context ", context_id, " has ", found,
                                                " gradients on the hub and the PS, not 2"));
  }
  ++counters_[kAutogradSteps];
  return true;
}

bool Trainer::PsStep(int64_t seq) {
  // Pulls and pushes, dense (64 KiB) and rows.
  bool ok = true;
  auto wt = client_->Pull("w").result();
  if (!wt.ok()) {
    ok = Fail("ps.pull", wt.status());
  } else {
    ++counters_[kPsPulls];
    if (absl::Status s = client_->Push("w", at::full_like(*wt, 1e-3)).status(); !s.ok()) {
      ok = Fail("ps.push", s);
    } else {
      ++counters_[kPsPushes];
    }
  }
  const at::Tensor ids = at::arange(8, at::kLong) * 97 + seq % 100;
  auto rows = client_->PullRows("emb", ids).result();
  if (!rows.ok()) return Fail("ps.pull_rows", rows.status());
  ++counters_[kPsPulls];
  if (absl::Status s = client_->PushRows("emb", ids, at::full_like(*rows, 1e-2), true).status();
      !s.ok()) {
    return Fail("ps.push_rows", s);
  }
  ++counters_[kPsPushes];
  return ok;
}

int Trainer::Run() {
  const absl::Time setup_start = absl::Now();
  if (absl::Status s = Setup(); !s.ok()) {
    Fail("setup", s);
    return 1;
  }
  Say(w_.name, absl::StrCat("READY incarnation=", inc_, " pid=", getpid(),
                            " setup_ms=", absl::ToInt64Milliseconds(absl::Now() - setup_start)));
  // Bounded even if the hub never says stop.
  const absl::Time give_up = absl::Now() + absl::Seconds(w_.flags.duration_s + 150);
  bool stopped = false;
  for (int64_t seq = 1; absl::Now() < give_up; ++seq) {
    const int64_t failures = counters_[kFailures];
    if (!Step(seq)) {
      stopped = true;
      break;
    }
    // Pacing (and a back-off after a failure); not synchronization.
    absl::SleepFor(absl::Milliseconds(counters_[kFailures] > failures ? 200 : w_.flags.pace_ms));
  }
  acc_ = RRef<Accumulator>();
  client_.reset();
  // Nothing of this incarnation may stay behind: every RRef it held was
  // deleted on its owner (which also means the hub has processed every
  // deletion before done() below), and no autograd context is left.
  if (absl::Status s = w_.rrefs->WaitUntilEmpty(timeout_); !s.ok()) Fail("rref.settle", s);
  if (const size_t n = dist_autograd::LiveContexts(*w_.agent).size(); n != 0) {
    Wrong("autograd.contexts", absl::StrCat(n, " distributed-autograd contexts left"));
  }
  std::string text;
  for (int i = 0; i < kNumCounters; ++i) {
    absl::StrAppend(&text, " ", kCounterNames[i], "=", counters_[i]);
  }
  Say(w_.name,
      absl::StrCat("COUNTERS incarnation=", inc_, stopped ? " stopped" : " gave_up", text));
  auto done = w_.agent->rpc_async(opts_, kHub, done_fn, rank_, inc_, counters_).result();
  if (!done.ok()) Fail("done", done.status());
  absl::Status s = w_.agent->Shutdown();
  Say(w_.name, absl::StrCat("shutdown: ", s.ToString()));
  return 0;
}

}  // namespace

int RunTrainer(Worker& w) {
  auto options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return Say(w.name, options.status().ToString()), 1;
  options->timeouts.rpc = absl::Seconds(w.flags.call_timeout_s);
  // The hub checks for leaks while the trainers wait in the shutdown.
  options->timeouts.shutdown = absl::Seconds(150);
  auto agent = rpc::RpcAgent::Create(*options, w.registry);
  if (!agent.ok()) return Say(w.name, agent.status().ToString()), 1;
  w.agent = *std::move(agent);
  w.rrefs->Attach(w.agent.get());
  Say(w.name, absl::StrCat("pid ", getpid(), " up incarnation=", w.env.restart_count,
                           " rejoin=", w.env.rejoin));
  Trainer t(w);
  return t.Run();
}

}  // namespace baton::soak
