// The soak test's job (issue 15, "Hardening"): mixed load on a job whose
// trainers are killed and restarted, then leak and failure checks. It is
// started by soak_test.sh through baton-run:
//
//   baton-run --standalone --role hub:1 --role ps:1 --role trainer:3
//       --restart_policy trainer=worker --max_restarts N soak_job [flags]
//
// Roles (one binary; BATON_ROLE picks):
// - hub (rank 0, serves the store; never dies): owns every RRef of the load,
//   holds W1 of a two-layer model trained with distributed autograd, serves
//   the plain calls, decides when the load stops and checks for leaks.
// - ps (rank 1; never dies): a ps::PsServer (asynchronous; a 64 KiB dense
//   table and an embedding table), W2 of the model (the hub's forward calls
//   it nested, so backward crosses trainer -> hub -> ps -> hub), and a table
//   of RRefs the hub lends until a trainer takes them.
// - trainer (ranks 2..): loops over mixed load (soak_trainer.cc): a plain call
//   (every fourth one 64 KiB), remote() + to_here(), an RRef the hub owns
//   forked to the PS and to the trainer, then the PS's copy forked to the
//   trainer (user-to-user fork), a method of the trainer's remote object, a
//   distributed-autograd step (forward, backward, SGD with the context's
//   gradients on the hub and the PS), PS pull/push of dense and row tables.
//   Trainers call the hub and the PS; nobody calls a trainer, which is what
//   lets baton-run restart one alone (AgentOptions::restarts.rejoin).
// The driver SIGKILLs a random READY trainer at random times; baton-run
// restarts it alone and it rejoins.
//
// What is checked (the hub prints RESULT OK or RESULT FAILED with reasons;
// the driver checks the rest from the log):
// - Values: every echo, RRef value, fork and method result is the one sent
//   or made for this incarnation (a mismatch is a WRONG_VALUE failure), and
//   every autograd step found its gradients on both the hub and the PS.
// - Failures: every failed operation is printed with a class
//   (ClassifyFailure): named/<CODE>/<worker> for UNAVAILABLE naming a worker
//   that can die, or a timeout-like code naming a worker; shutdown/<CODE>;
//   anything else is UNEXPLAINED and fails the test, as does WRONG_VALUE.
//   The hub and PS print every death their agent confirms (PEER_FAILURE,
//   which must name the trainer), every restarted incarnation's
//   predecessor must have been confirmed dead on the hub, and no live
//   incarnation may be confirmed dead (a confirmation followed by more than
//   a second of that incarnation's calls is stale; P2 of
//   docs/peer_failures.md).
// - Leaks, after the load stopped and every trainer finished (bounded wait
//   for things to settle): on the hub and the PS, no RRef held, none owned
//   (each owned value says whose it is) or held for a dead incarnation
//   (RRef G7), no protocol message unanswered, no early entry, no kept RRef,
//   no distributed-autograd context, no pending outgoing or running
//   incoming call, shared-memory
//   segments still busy at most one per restart (a killed receiver's segment
//   is reclaimed only when reused), file descriptors at most --fd_slack
//   above the warm baseline; after the job, no /dev/shm object of any of
//   the job's processes (the driver); every worker's Shutdown() returned OK.
//
// Bounds: --duration_s of load (75 s by default) after a --warm_s warm-up;
// each call has --call_timeout_s; the hub waits at most 90 s for the
// trainers to finish and 20 s for leaks to settle; the driver kills baton-run
// after 240 s. A run takes about 80 s on the 2-core development machine.
//
// Restarted trainers rejoin with a new incarnation (docs/peer_failures.md):
// their RRef and context ids are new, the 64 KiB replies they get travel
// inline (P3), and what a killed incarnation held is released on the hub and
// the PS once its death is reported (RRef G7, distributed autograd D4). Run
// before those fixes, this test found each problem (ids reused, DATA_LOSS on
// replies, forks of dead trainers kept, live incarnations confirmed dead).
#include <cstdio>

#include <ATen/Parallel.h>

#include "absl/strings/str_cat.h"
#include "dist_autograd/dist_autograd.h"
#include "tests/soak/soak_common.h"

int main(int argc, char** argv) {
  using namespace baton::soak;
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", flags.status().ToString().c_str());
    return 2;
  }
  auto env = baton::ReadLaunchEnv();
  if (!env.ok()) {
    std::fprintf(stderr, "%s\n", env.status().ToString().c_str());
    return 2;
  }
  at::set_num_threads(1);
  Worker w;
  w.flags = *flags;
  w.env = *env;
  w.name = absl::StrCat(env->role, env->role_rank);
  w.registry = std::make_shared<baton::rpc::FunctionRegistry>();
  w.rrefs = baton::rref::RRefService::Install(*w.registry);
  if (absl::Status s = baton::dist_autograd::Install(*w.registry); !s.ok()) {
    Say(w.name, s.ToString());
    return 1;
  }
  RegisterAccumulator(*w.rrefs);
  if (env->role == "hub" && env->rank == 0) return RunHub(w);
  if (env->role == "ps" && env->rank == 1) return RunPs(w);
  if (env->role == "trainer") return RunTrainer(w);
  Say(w.name, "roles must be --role hub:1 --role ps:1 --role trainer:N, in this order");
  return 2;
}
