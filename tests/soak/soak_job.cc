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
//   lets baton-run restart one alone (AgentOptions::rejoin).
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
//   known/STALE_DEATH/<trainer> (below); anything else is UNEXPLAINED and
//   fails the test, as does WRONG_VALUE.
//   The hub and PS print every death their agent confirms (PEER_FAILURE,
//   which must name the trainer), and every restarted incarnation's
//   predecessor must have been confirmed dead on the hub.
// - Leaks, after the load stopped and every trainer finished (bounded wait
//   for things to settle): on the hub and the PS, no RRef held (but see the
//   dead holders below), no protocol message unanswered, no early entry, no
//   owned RRef whose value belongs to a live trainer or to no one (each
//   owned value says whose it is), no kept RRef, no distributed-autograd
//   context, no pending outgoing or running incoming call, shared-memory
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
// Known runtime problems this test found; soak_test.sh turns the
// workarounds on, soak_repro_test (manual) runs without them:
// - RRef ids and distributed-autograd context ids restart at 1 in a
//   restarted incarnation (rref_context.h next_, dist_autograd's
//   next_context_), so they collide with its predecessor's ids that the hub
//   and the PS still know: the new incarnation's remote object resolves to
//   the dead incarnation's (WRONG_VALUE), and its contexts hit ids already
//   released (FAILED_PRECONDITION). --burn_ids: a restarted trainer first
//   consumes the ids its predecessors could have used.
// - A restarted (rejoined) worker refuses replies that carry shared-memory
//   blobs (DATA_LOSS "not a segment of the sender"): its peers still send
//   it segments (peer_shm_ from the first rendezvous), while it has no
//   probed prefix for them; every refused segment stays busy until its
//   expiry. --small_after_restart: restarted trainers ask for no reply of
//   32 KiB or more.
// - Stale death confirmations: a peer's death is confirmed by a probe to the
//   address learnt at startup, and the probe's own failed stream counts as
//   new evidence, so the hub and the PS confirm a restarted trainer's rank
//   dead again and again (at gRPC's reconnect back-off) while its new
//   incarnation lives. Each confirmation makes distributed autograd release
//   every context created by that rank (ReleaseCreatedBy), the live
//   incarnation's included: its forward, backward or apply then fails with
//   FAILED_PRECONDITION "context ... was already released" or NOT_FOUND.
//   The hub prints the stale confirmations per rank (DEATHS lines). --tolerate_stale_deaths: a
//   trainer counts such an autograd failure as known/STALE_DEATH when the
//   hub or the PS confirmed its rank dead after its hello.
// - Nothing releases the forks of a dead worker. An owner keeps the forks
//   of a dead user forever: RRefs held only by killed trainers stay on the
//   hub (counted and attributed; the run fails on them with
//   --strict_dead_holders=1). A parent that forked an RRef to a worker that
//   died before its ForkRequest reached the owner waits for that child
//   forever, so the parent's graceful shutdown cannot settle (the PS's
//   Shutdown fails with DEADLINE_EXCEEDED "RRefs on worker 1 did not
//   settle", and the hub's with it, at the drain barrier).
//   --release_dead_children: at the end the PS confirms, itself, the
//   pending children of RRefs made for dead incarnations.
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
