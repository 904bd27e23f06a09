// ServerShard: one parameter server's part of every table, its optimizer
// state, and its view of the trainers' clocks. It is the whole server-side
// protocol without any RPC: PsServer (ps/server.h) only decodes requests and
// forwards them here, and tests drive it directly, in one process.
//
// Guarantees (tests in tests/ps/ are named after them):
//   PS1 BSP. In kSync, the update of clock c is the mean, over the trainers
//      that finished clock c while live, of the sum of their pushes for
//      clock c, applied once with the table's optimizer. A pull at clock c+1
//      returns the parameters after exactly clocks 0..c: numerically equal
//      to single-process training on the concatenated batch.
//   PS2 Sharding invariance. For kSync, parameters are bit-identical on any
//      number of servers: gradients are summed in trainer order per element
//      (per row for embeddings), chunks are cut on ShardPlan::kAlign, and
//      every update rule is element-wise (row-wise).
//   PS3 No lost update. In kAsync (and kBoundedStaleness), every push that was
//      acknowledged OK was applied exactly once, whole: a pull sees each push
//      entirely or not at all. applied_pushes counts them.
//   PS4 SSP bound. In kBoundedStaleness(s), a pull at clock c returns only
//      once every live trainer finished clock c - s - 1 (staleness =
//      c - min live finished clock <= s); s = 0 is kSync.
//   PS5 Bounded waits. A parked pull completes by its deadline. A trainer that
//      keeps a pull waiting longer than trainer_timeout is dropped from the
//      clock with a logged message naming it (kDrop), or the waiting pulls
//      fail with DEADLINE_EXCEEDED naming it (kFail).
//   PS6 Rejoin. Join() (a restarted or dropped trainer) makes the trainer live
//      at the current clock: in kSync the clock being aggregated (its partial
//      pushes for it are discarded, it redoes that step); otherwise the
//      slowest live trainer's clock. A push from a dropped trainer rejoins it
//      too; its push for an already applied kSync clock is discarded
//      (stale_pushes) and the reply carries the clock to continue from.
//      Each Join starts a new session of the trainer; requests that carry
//      an older session (from an incarnation that died with requests in
//      flight) fail with ABORTED and change nothing, so a dead incarnation's
//      late push is never counted for its successor.
//   PS7 Bad input changes nothing. A request with an unknown table, an id out
//      of range, a row never created (lazy tables: never pulled), a gradient
//      of the wrong shape or dtype, or an uninitialized dense table fails
//      whole with INVALID_ARGUMENT (FAILED_PRECONDITION for the last) naming
//      the table and the offending id or shape, before any state changes.
//   PS8 Checkpoints. Serialize() captures parameters, optimizer state and
//      clocks at one instant (under the lock, between two applied updates);
//      Restore() of those bytes gives back an identical shard.
//   PS9 A repeated push counts once. A push with a push id (> 0, unique per
//      trainer session; PsClient numbers them) that this shard applied or
//      recorded already changes nothing (duplicate_pushes) and is answered
//      with the trainer's clock: a trainer whose push went out again after
//      a network partition broke its connection (the push may have been
//      applied; rpc::CallOptions::idempotent) does not apply it twice. The
//      last kRememberedPushes ids of each trainer session are kept.
//
// Thread-safety: safe for concurrent use. One mutex guards the shard, and
// no user code runs under it except a custom RowInit (ps/spec.h), which
// creates rows as a pull reads them: Options::clock is read before it is
// taken; callbacks of parked pulls run after it is released, on the thread
// that made them ready; log lines are queued under it, in the order of the
// events they report, and handed to Options::log after it is released, one
// line at a time and in that order. Either callback may call the shard.
#ifndef BATON_PS_SERVER_SHARD_H_
#define BATON_PS_SERVER_SHARD_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"

#include <ATen/core/Tensor.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "ps/sharding.h"
#include "ps/spec.h"
#include "ps/types.h"

namespace baton::ps {

namespace internal {
struct DenseSlot;
struct EmbeddingSlot;
class ParameterBoard;
}  // namespace internal

// One table's part of a pull or push request.
struct TableRequest {
  std::string table;
  at::Tensor ids;   // embedding: int64 [n]; dense: undefined
  at::Tensor grad;  // push only: dense [chunk size] flat; embedding [n, dim]
};

struct JoinReply {
  int64_t clock = 0;    // the clock the trainer continues from
  int64_t session = 0;  // carried by the trainer's later requests
};

// Requests from in-process callers that do not track sessions.
inline constexpr int64_t kAnySession = -1;

struct PullResult {
  // One per requested table, in order; undefined for a dense table whose
  // values a from_board pull reads from the parameter board.
  std::vector<at::Tensor> values;
  int64_t staleness = 0;
  // A from_board pull: the dense version on the board that the pull returns
  // (ps/internal/shared_tables.h, SD2); -1 otherwise.
  int64_t board_version = -1;
};

class ServerShard {
 public:
  using Logger = std::function<void(const std::string&)>;

  struct Options {
    int server = 0;
    int num_servers = 1;
    // Where time is read (trainer timeouts, pull deadlines). Null: the real
    // clock. Otherwise it outlives the shard (base/clock.h).
    const Clock* clock = nullptr;
    // Called with no lock held, one line at a time, in event order (see
    // Thread-safety above). Null: stderr.
    Logger log;
    // Where from_board pulls find dense values (PsServer's, for trainers of
    // its host); null: none, every pull carries its values. Published under
    // the shard's lock, at the first such pull after a change.
    std::shared_ptr<internal::ParameterBoard> board;
  };

  // INVALID_ARGUMENT for a spec that fails ValidateSpec or a bad server index.
  static absl::StatusOr<std::unique_ptr<ServerShard>> Create(PsSpec spec, Options options);
  ~ServerShard();

  const PsSpec& spec() const { return spec_; }
  const ShardPlan& plan() const { return plan_; }

  // PS6. FAILED_PRECONDITION if `fingerprint` is not this job's spec, naming
  // the first line that differs; INVALID_ARGUMENT for a bad trainer id.
  // Returns the clock the trainer continues from and its new session.
  absl::StatusOr<JoinReply> Join(int trainer, const std::string& fingerprint);

  // Sets the value of dense tables that have none yet (first writer wins).
  // values[i] is the flat chunk this server holds. Returns how many tables
  // were set by this call.
  absl::StatusOr<int> InitDense(int trainer, const std::vector<TableRequest>& values);

  // Calls `done` once the pull at `clock` may be served (PS1, PS4), with the
  // values or an error; at once in kAsync. `deadline` bounds the wait (PS5).
  // `from_board` (with Options::board): dense values are published on the
  // board instead of returned, and the result names their version.
  void Pull(int trainer, int64_t clock, std::vector<TableRequest> tables, absl::Time deadline,
            std::function<void(absl::StatusOr<PullResult>)> done, int64_t session = kAnySession,
            bool from_board = false);

  // Applies (kAsync, SSP) or records (kSync) the gradients of `clock`;
  // `end_clock` marks the trainer's last push of that clock. Returns the
  // clock the trainer is at afterwards.
  absl::StatusOr<int64_t> Push(int trainer, int64_t clock, bool end_clock,
                               std::vector<TableRequest> grads, int64_t session = kAnySession,
                               uint64_t push_id = 0);
  // PS9: how many push ids of a trainer session are remembered.
  static constexpr size_t kRememberedPushes = 1024;

  // If a pull at `clock` could be served now (PS1, PS4) and every dense
  // table has a value: publishes the dense values on Options::board (if
  // they changed since it was last written) and returns the board's
  // version, which such a pull may read instead; else -1 (also without a
  // board). PsServer answers each push with it, so that a trainer of this
  // host whose next pull would not wait reads the board without a message
  // (ps/client.h).
  int64_t BoardVersionFor(int64_t clock);

  // PS5: drops (or fails) trainers that kept a parked pull waiting longer
  // than trainer_timeout, and fails pulls past their deadline. PsServer calls
  // it periodically; tests call it with a fake clock.
  void CheckWaits();

  // Hands `line` (prefixed "ps server <k>: ") to Options::log after the
  // lines the shard queued before it (see Thread-safety above).
  void Log(const std::string& line) ABSL_LOCKS_EXCLUDED(mu_);

  ShardStats Stats() const;

  // For the hang report: each trainer's finished clock and liveness, and
  // the parked pulls with the trainers that keep each waiting.
  struct Waits {
    std::vector<int64_t> finished;
    std::vector<bool> live;
    struct Parked {
      int trainer = -1;
      int64_t clock = 0;
      absl::Time since;
      std::vector<int> blockers;
    };
    std::vector<Parked> parked;
  };
  Waits CurrentWaits() const;

  // Parameters, optimizer state and clocks at one instant, taken under the
  // shard's lock between two applied updates (PS8).
  absl::StatusOr<std::string> Serialize() const;
  // DATA_LOSS for bytes that are not a checkpoint; FAILED_PRECONDITION for a
  // checkpoint of another spec or server. On error nothing changes.
  absl::Status Restore(const std::string& bytes);

  // The full value of this server's chunk of a dense table, or of the given
  // embedding rows, without clocks or counters (tests and checkpoints).
  absl::StatusOr<at::Tensor> Peek(const std::string& table, const at::Tensor& ids) const;

 private:
  struct Contribution {
    int trainer;
    int table;
    at::Tensor ids;
    at::Tensor grad;
  };
  struct Waiter {
    int trainer;
    int64_t clock;
    std::vector<TableRequest> tables;
    absl::Time since;
    absl::Time deadline;
    std::function<void(absl::StatusOr<PullResult>)> done;
    bool from_board = false;
  };
  using Ready = std::vector<std::pair<Waiter, absl::StatusOr<PullResult>>>;
  // What a locked section leaves for after mu_ is released (RunDeferred):
  // parked pulls that became ready, and whether it queued log lines.
  struct Deferred {
    Ready ready;
    bool logged = false;
  };

  ServerShard(PsSpec spec, Options options);
  absl::Status Init();

  int TableIndex(const std::string& name) const;
  absl::Status CheckTrainer(int trainer) const;
  absl::Status CheckSession(int trainer, int64_t session) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidatePull(const std::vector<TableRequest>& tables) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidatePush(const std::vector<TableRequest>& grads) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PullResult ReadLocked(int64_t clock, const std::vector<TableRequest>& tables, bool from_board)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the board if it is behind dense_version_ (SD2).
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A dense value changed: the next from_board pull publishes again.
  void DenseChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++dense_version_; }
  void ApplyLocked(int table, const at::Tensor& ids, const at::Tensor& grad)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // kSync: applies every clock that all live trainers finished.
  void AdvanceSyncLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplySyncClockLocked(int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PullReadyLocked(int64_t clock) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MinLiveClockLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Trainers that keep a pull at `clock` from being served.
  std::vector<int> BlockersLocked(int64_t clock) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RejoinLocked(int trainer, Deferred* after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectReadyLocked(Ready* ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a line for the log callback.
  void LogLocked(std::string line, Deferred* after) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Emits the queued log lines (unless another thread is emitting them),
  // then completes the ready pulls.
  void RunDeferred(Deferred after) ABSL_LOCKS_EXCLUDED(mu_);
  void EmitLog() ABSL_LOCKS_EXCLUDED(mu_);

  const PsSpec spec_;
  const Options options_;
  const RealClock real_clock_;
  const Clock* const clock_;  // options_.clock or real_clock_
  const ShardPlan plan_;
  const bool sync_;  // kSync (or SSP with s = 0)

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<internal::DenseSlot>> dense_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<internal::EmbeddingSlot>> embedding_ ABSL_GUARDED_BY(mu_);
  std::vector<TableStats> stats_ ABSL_GUARDED_BY(mu_);
  // Clocks (PS1, PS4-PS6). finished_[t]: clocks trainer t finished.
  std::vector<int64_t> finished_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> live_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> session_ ABSL_GUARDED_BY(mu_);  // per trainer, bumped by Join
  int64_t applied_clock_ ABSL_GUARDED_BY(mu_) = 0;
  // Bumped by every change of a dense value; what the board is compared to.
  int64_t dense_version_ ABSL_GUARDED_BY(mu_) = 0;
  // kSync: pushes recorded per clock, applied when the clock completes.
  std::map<int64_t, std::vector<Contribution>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  int64_t max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t applied_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stale_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t duplicate_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  // PS9: per trainer, the push ids of its session seen (and their order,
  // oldest first, to forget the oldest past kRememberedPushes).
  std::vector<absl::flat_hash_set<uint64_t>> push_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::deque<uint64_t>> push_order_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  // Log lines not yet handed to the callback, oldest first, and whether a
  // thread is handing them over (it takes lines queued meanwhile too).
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  bool emitting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::ps

#endif  // BATON_PS_SERVER_SHARD_H_
