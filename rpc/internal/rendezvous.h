// Rendezvous: the store-key protocol by which the workers of a job meet,
// for a fixed group (AgentImpl::Rendezvous, bootstrap.cc) and a dynamic one
// (AgentImpl::JoinGroup, membership.cc) alike: the round, the rank claim,
// the registrations, the barriers, the successors, the group's members and
// their leaving, and the retired ranks; and, once the job runs, a peer's
// record and its successor's registration (peer_failures.cc,
// stream_identity.cc) and the shutdown's barriers and marks (agent.cc).
// Every key the agent writes or reads is named here and nowhere else; what
// each key means is below.
// It reads and writes the job's store only: what it reads it returns, and
// the agent applies it to its own tables (workers, peers, transports).
//
// The keys. The store's kind, claimed by its first worker (M4):
//
//   baton/group_kind             "static" or "dynamic"
//
// A fixed group's worker takes a round, a prefix of its own for every init
// of the rank against the store, so that a repeated init/shutdown in one job
// never sees stale keys; a rejoining incarnation takes its predecessor's:
//
//   baton/init_round/<rank>      the rank's rounds so far
//
// Under the round's prefix (baton/r<round>/), and for a dynamic group under
// kGroupNamespace for the store's life:
//
//   incarnation/<rank>           one more at every start (or join) of the rank
//   rank_claim/<rank>            the nonce of the process that holds the rank
//   worker/<rank>                its registration (proto::WorkerRecord); ""
//                                once it left a dynamic group
//   registered/<rank>/<inc>      "1" once incarnation <inc> registered (P7)
//   job_token                    an injected store's token, made by rank 0
//   store_instance               which store instance the round uses, made
//                                by rank 0 (AgentImpl::Teardown reads it)
//   shm_probe/<rank>/<usable>    how many peers' probes the rank opened (S4)
//   shm_links/<rank>             the same-host links the rank created
//                                (proto::SameHostLinks), "-" for none
//   init/probed, init/done       the init barriers (store::Barrier)
//   init/passed/<rank>           the rank passed init/done
//   shutdown/enter, shutdown/drained, shutdown/left/<rank>
//                                the shutdown's barriers and marks; a retired
//                                rank's are set for it (Retire)
//   retired                      the retired ranks, comma-separated
//
// A dynamic group's own keys, under kGroupNamespace:
//
//   rank_name/<rank>             the name the rank first joined with (M2)
//   name/<name>                  the rank that holds the name (M2)
//   members/count                the joins so far; members/<k> the k-th's rank
//   live                         the workers joining or in the group now (the
//                                store's host waits for 0)
//   left/<rank>/<inc>            incarnation <inc> of the rank left
//
// Every wait is bounded: by AgentOptions::timeouts.init, or by the timeout
// a method takes. Errors come as the store gives them (a wait that runs out
// is DEADLINE_EXCEEDED naming the keys still missing), annotated with what
// was awaited where the agent said so before; a malformed record is
// DATA_LOSS naming its rank, a rank or name in use ALREADY_EXISTS naming it.
//
// Thread-safety: TakeRound() or EnterGroup() runs first, once, on the thread
// that makes the rendezvous; it sets the prefix. Every other method is const
// and may be called from any thread, concurrently, once that call returned
// and happened before (the agent's ready_ orders it for the calls that come
// after the rendezvous): the object holds no lock, and the store is safe for
// concurrent use.
#ifndef BATON_RPC_INTERNAL_RENDEZVOUS_H_
#define BATON_RPC_INTERNAL_RENDEZVOUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/rpc.pb.h"
#include "rpc/agent_options.h"
#include "store/store.h"

namespace baton::rpc::internal {

// torch's words for M4 (its test suite matches them), also said to a fixed
// worker's join notice.
inline constexpr char kMixedGroups[] =
    "RPC group mixes statically and dynamically initialized members which is not supported.";

class Rendezvous {
 public:
  // The prefix of a dynamic group's keys (one namespace for the store's life).
  static constexpr char kGroupNamespace[] = "baton/group/";

  // `store`: the job's store (JobStore::store). `options`: who this worker
  // is (rank, world_size or max_ranks, name) and timeouts.init and
  // timeouts.shutdown, copied.
  Rendezvous(std::shared_ptr<store::Store> store, const AgentOptions& options);
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // The prefix of this worker's keys: its round's, or kGroupNamespace; empty
  // before TakeRound() or EnterGroup().
  const std::string& ns() const { return ns_; }

  // --- A fixed group's round.
  struct Round {
    std::string ns;           // the round's key prefix, baton/r<round>/
    int64_t incarnation = 0;  // 1 for the first start in this round, one more each rejoin
    // Whether this worker rejoins its predecessor's round: `rejoin` as
    // asked, unless the rank never took a round (P5).
    bool rejoin = false;
  };
  // Claims the store for a fixed group (M4), takes the round (a new one, or
  // with `rejoin` the predecessor's) and the rank's next incarnation in it.
  absl::StatusOr<Round> TakeRound(bool rejoin);
  // Which store instance the round uses: rank 0 makes and publishes it; the
  // other ranks read it (waiting at most timeouts.init), except on an
  // `external_store` (injected or etcd), where they have none ("").
  absl::StatusOr<std::string> ShareStoreInstance(bool external_store) const;
  // An injected store's job token: rank 0 makes it, the others read it.
  absl::StatusOr<std::string> AgreeOnToken() const;

  // --- A dynamic group's entry (instead of TakeRound).
  // Claims the store for a dynamic group (M4), takes kGroupNamespace as the
  // prefix and counts this worker in `live` (once OK, Release() with
  // Membership::counted takes it out again).
  absl::Status EnterGroup();
  // The rank's next incarnation under the prefix (EnterGroup's second step).
  absl::StatusOr<int64_t> TakeIncarnation() const;

  // --- Claims, both kinds.
  // Claims the rank for this process; returns the claim's nonce, or
  // ALREADY_EXISTS naming the rank. With `rejoin` the claim is taken from
  // the predecessor that holds it.
  absl::StatusOr<std::string> ClaimRank(bool rejoin) const;
  // M2, for a dynamic group: claims the name for the rank; ALREADY_EXISTS
  // naming the rank's first name, or the name's holder.
  absl::Status ClaimName() const;

  // --- Registrations.
  // Publishes `mine`, this incarnation's record (mine.incarnation()), and
  // then says that incarnation registered (P7).
  absl::Status Publish(const proto::WorkerRecord& mine) const;
  // Waits for every rank's record (at most timeouts.init); each has a name
  // and an address, else DATA_LOSS naming its rank.
  absl::StatusOr<std::vector<proto::WorkerRecord>> ReadRecords() const;
  struct RankRecord {
    int rank = -1;
    proto::WorkerRecord record;
  };
  // P5: the ranks whose record is newer now than in `read` (ReadRecords'),
  // each with its new record; this rank's own is not read.
  absl::StatusOr<std::vector<RankRecord>> ReadSuccessors(
      const std::vector<proto::WorkerRecord>& read) const;

  // --- The same-host paths of a fixed group.
  // S4: how many peers' probes this worker opened.
  absl::Status PublishProbesOpened(int usable) const;
  // The links this worker created toward higher ranks ("-" if none).
  absl::Status PublishLinks(const proto::SameHostLinks& created) const;
  // P5: a rejoining incarnation sets up no links; it says so where its
  // predecessor said nothing (a record published already stays).
  absl::Status PublishNoLinks() const;
  // The links each of `ranks` created (waiting at most timeouts.init), in
  // that order; none (an empty record) where it said "-".
  absl::StatusOr<std::vector<proto::SameHostLinks>> ReadLinks(const std::vector<int>& ranks) const;

  // --- The init barriers of a fixed group (world_size ranks, timeouts.init).
  absl::Status ProbedBarrier() const;  // every rank probed its peers
  absl::Status DoneBarrier() const;    // every rank passed the barrier above
  // After DoneBarrier: this rank says it passed; the store's host waits for
  // every other rank's word, at most timeouts.init (a rank that died right
  // after the barrier never says it).
  absl::Status SayPassed() const;
  absl::Status AwaitOthersPassed() const;

  // --- A dynamic group's members.
  // Takes the next place in the member list (its number; 0 is none).
  absl::StatusOr<int64_t> TakePlace() const;
  // The members that took a place before `place` and have not left, with
  // their records (other than this rank, each rank once).
  absl::StatusOr<std::vector<RankRecord>> ReadMembersBefore(int64_t place) const;
  // `rank`'s record, waiting at most `timeout`; UNAVAILABLE if it cannot be
  // read, is malformed or was withdrawn.
  absl::StatusOr<proto::WorkerRecord> ReadMember(int rank, absl::Duration timeout) const;
  // Withdraws this worker's record: a joiner that reads it finds it gone.
  absl::Status WithdrawRecord() const;
  // What a join left in the store, for Release().
  struct Membership {
    int64_t incarnation = 0;
    bool joined = false;   // it took a place (and published its record)
    std::string claim;     // ClaimRank's nonce, or "" if none held
    bool counted = false;  // EnterGroup counted it in `live`
  };
  // Takes back what `membership` says the join made. The store may be gone
  // (its host left): a write bounded by `timeout` (at most 2 s) says so
  // first, on a store client.
  void Release(const Membership& membership, absl::Duration timeout) const;
  // The store's host: waits, at most `timeout` (and timeouts.shutdown, and a
  // minute), until no member is counted in `live`; else DEADLINE_EXCEEDED
  // saying how many are.
  absl::Status AwaitMembersGone(absl::Duration timeout) const;

  // --- After the rendezvous: a peer's record and its successor.
  // `rank`'s record as the store has it now, bounded by `timeout`: it
  // exists since the rendezvous, so this is a read, not a wait. With
  // `fail_fast`, a store client asks once and fails at once when its server
  // or the key is not there (StoreClient::TryGet), instead of asking again
  // for its whole call timeout. The store's error as it gives it; DATA_LOSS
  // if the record does not parse.
  absl::StatusOr<proto::WorkerRecord> ReadRecordNow(int rank, absl::Duration timeout,
                                                    bool fail_fast) const;
  // P7: waits at most `timeout` until incarnation `incarnation` of `rank`
  // has registered (Publish); the store's DEADLINE_EXCEEDED if not.
  absl::Status AwaitRegistered(int rank, int64_t incarnation, absl::Duration timeout) const;

  // --- The shutdown of a fixed group (AgentImpl::Shutdown, Teardown).
  // Every rank entered shutdown (it stopped issuing new calls), at most
  // `timeout`; ArrivedAtShutdown says whether `rank` has.
  absl::Status EnterShutdownBarrier(absl::Duration timeout) const;
  bool ArrivedAtShutdown(int rank) const;
  // Every rank drained its calls, at most `timeout`.
  absl::Status DrainedBarrier(absl::Duration timeout) const;
  // This rank left its shutdown: on a store client a write that fails fast,
  // bounded by `timeout`, when the store is gone already.
  void SayLeft(absl::Duration timeout) const;
  // The store's host: waits at most `timeout` for every rank's SayLeft.
  void AwaitAllLeft(absl::Duration timeout) const;
  // A worker whose store rank 0 hosts: waits at most `timeout` until the
  // store that holds this round's `instance` is gone (or replaced), so that
  // an init right after this shutdown cannot reach the old store.
  void AwaitStoreGone(const std::string& instance, absl::Duration timeout) const;

  // --- Retired ranks of a fixed group (Runtime::RetirePeer).
  // Arrives at the shutdown barriers for `peer`, marks it left and adds it
  // to `retired`.
  absl::Status Retire(int peer) const;
  // The retired ranks, ascending, each once.
  absl::StatusOr<std::vector<int>> Retired() const;

 private:
  // M4: claims the store for a fixed or a dynamic group; FAILED_PRECONDITION,
  // in torch's words, if it holds the other kind.
  absl::Status CheckGroupKind(bool dynamic) const;
  std::string Key(absl::string_view what) const;
  std::string RecordKey(int rank) const;

  const std::shared_ptr<store::Store> store_;
  const int rank_;
  const int world_size_;
  const int max_ranks_;
  const std::string name_;
  const absl::Duration init_timeout_;
  const absl::Duration shutdown_timeout_;
  std::string ns_;
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_RENDEZVOUS_H_
