// PsClient: a trainer's handle on the parameter servers of a job.
//
//   ps::PsClient::Options o;
//   o.trainer = role_rank;                 // 0..spec.num_trainers-1
//   o.servers = {"ps0", "ps1"};            // worker names, server index order
//   auto client = ps::PsClient::Create(*agent, spec, o).value();  // joins
//   at::Tensor w = client->Pull("w").value();                  // whole dense table
//   at::Tensor rows = client->PullRows("emb", ids).value();    // [ids..., dim]
//   client->PushRows("emb", ids, row_grads, /*end_step=*/true).value();
//
// Contract:
// - Create() validates the spec, then joins every server (bounded by
//   Options::timeout): a server with another spec fails it with
//   FAILED_PRECONDITION naming the difference. The client continues from the
//   clock the servers give it (PS6 in ps/server_shard.h).
// - Every operation returns a Future that completes by Options::timeout;
//   requests go to all servers concerned at once, one message per server.
// - Dense tables are split into chunks by ShardPlan; Pull assembles them,
//   Push sends each server a view of its chunk of the gradient (no copy: do
//   not modify the gradient until the push's future completes).
// - PullRows/PushRows accept ids of any shape. Duplicate ids are merged on
//   the client (pulled once; gradients summed), and each server receives
//   only its own rows, in ascending id order.
// - Clocks: a step ends with a push whose end_step is true (sent to every
//   server, empty where a server holds none of its rows) or with Step().
//   Pulls wait on the servers according to the consistency mode.
// - Same host (Options::same_host_shm, and the server's): dense pulls read
//   the server's parameter board and dense pushes write this trainer's
//   gradient box (ps/internal/shared_tables.h, SD1-SD5); the messages carry
//   only clocks and versions. A push's reply names the board version that
//   a pull at the trainer's next clock may read if such a pull would not
//   wait (kAsync: always; kSync: this push completed the clock); the next
//   dense pull at that clock then reads it (or a newer one) from the board
//   with no message at all, and the server's TableStats::pulls does not
//   count it (local_pulls below does). A board read that finds no whole
//   version is
//   pulled again with its values; a box the server still reads (a second
//   push before the first was applied) sends the push with its values.
//   Between hosts, everything travels in the messages. SameHost() counts
//   which way each went.
// - Errors are the servers' (INVALID_ARGUMENT naming the table and the id or
//   shape, ...) or the RPC's (DEADLINE_EXCEEDED, UNAVAILABLE naming the
//   server), annotated with the operation and the table.
//
// Thread-safety: safe for concurrent use; the clock is shared, so one
// training loop per client is the intended use.
#ifndef BATON_PS_CLIENT_H_
#define BATON_PS_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/sharding.h"
#include "ps/spec.h"
#include "ps/types.h"
#include "rpc/future.h"

namespace baton::rpc {
class RpcAgent;
class Runtime;
}  // namespace baton::rpc
namespace baton::ps::internal {
class ParameterBoard;
class GradientBox;
}  // namespace baton::ps::internal

namespace baton::ps {

class PsClient {
 public:
  struct Options {
    int trainer = 0;
    std::vector<std::string> servers;  // worker names; index = server index
    absl::Duration timeout = absl::Seconds(60);
    // Dense tables through shared memory with servers of this host: those
    // the agent reaches through its shared-memory channel
    // (Runtime::uses_shm; off with BATON_SHM=0).
    bool same_host_shm = true;
  };

  // How dense pulls and pushes went (see the contract).
  struct SameHostStats {
    int servers_with_board = 0;  // boards mapped at Join
    int servers_with_box = 0;    // boxes the servers mapped
    int64_t board_reads = 0;     // dense pulls read from a board
    int64_t local_pulls = 0;     // ... of which with no message
    int64_t board_retries = 0;   // ... that had to be pulled again with values
    int64_t box_pushes = 0;      // dense pushes through a box
    int64_t box_busy = 0;        // ... sent with values, the box still read
    int64_t bytes = 0;           // shared memory this client created (its boxes)
  };
  ~PsClient();

  static absl::StatusOr<std::unique_ptr<PsClient>> Create(rpc::RpcAgent& agent, PsSpec spec,
                                                          Options options);

  const PsSpec& spec() const { return spec_; }
  const ShardPlan& plan() const { return plan_; }
  int trainer() const { return options_.trainer; }
  // The step this trainer is at (the smallest of its per-server clocks).
  int64_t clock() const;
  // Largest staleness a pull of this client returned with.
  int64_t max_staleness() const;

  // Gives dense tables their initial values on every server; tables that
  // already have one keep it (first writer wins). Blocks, bounded.
  absl::Status InitDense(const std::vector<std::string>& tables,
                         const std::vector<at::Tensor>& values);

  rpc::Future<at::Tensor> Pull(const std::string& table);
  // Several dense tables at once: one message per server.
  rpc::Future<std::vector<at::Tensor>> PullDense(const std::vector<std::string>& tables);
  // The same, written into `into` (tensors of the tables' shapes and dtypes,
  // e.g. parameters detached from autograd), which the future returns.
  // REQUIRES: nothing else writes or reads `into` until the future completes.
  rpc::Future<std::vector<at::Tensor>> PullDenseInto(const std::vector<std::string>& tables,
                                                     std::vector<at::Tensor> into);
  rpc::Future<at::Tensor> PullRows(const std::string& table, const at::Tensor& ids);

  rpc::Future<void> Push(const std::string& table, const at::Tensor& grad, bool end_step = false);
  rpc::Future<void> PushDense(const std::vector<std::string>& tables,
                              const std::vector<at::Tensor>& grads, bool end_step = false);
  rpc::Future<void> PushRows(const std::string& table, const at::Tensor& ids,
                             const at::Tensor& grads, bool end_step = false);
  // Ends the current step on every server (an empty push with end_step).
  rpc::Future<void> Step();

  SameHostStats SameHost() const;

  // Every server's counters and clocks, in server order.
  absl::StatusOr<std::vector<ShardStats>> Stats();
  // Asks every server to checkpoint now; returns the paths.
  absl::StatusOr<std::vector<std::string>> Checkpoint();

 private:
  struct Part;  // one server's part of a request
  PsClient(rpc::RpcAgent& agent, PsSpec spec, Options options);
  absl::Status Join();
  rpc::Future<std::vector<std::vector<at::Tensor>>> SendPulls(std::vector<Part> parts,
                                                              const std::string& what);
  rpc::Future<void> SendPushes(std::vector<Part> parts, bool end_step, const std::string& what);
  // The index of `table` in the spec; INVALID_ARGUMENT naming it if there is
  // no such table or it is of the other kind.
  absl::StatusOr<int> TableIndex(const std::string& table, TableKind kind) const;

  // Reads a dense pull's chunks from server `server`'s board (SD1, SD2),
  // if `board` (the reply's nonce) is the one mapped.
  absl::Status ReadBoard(int server, int64_t version, uint64_t board,
                         const std::vector<std::pair<int, at::Tensor>>& into);
  // Writes one server's dense gradients into its box; 0 if the box is busy
  // or absent (the push then carries them).
  uint64_t WriteBox(int server, const std::vector<std::pair<int, at::Tensor>>& grads);

  rpc::Runtime& agent_;
  const PsSpec spec_;
  const Options options_;
  const ShardPlan plan_;
  std::vector<int> server_ids_;  // worker ids; set by Create

  // Same-host dense tables, per server; set by Join (in Create), then only
  // read, except the boxes, which box_mu_ guards while they are written.
  struct SameHostServer;
  std::vector<std::unique_ptr<SameHostServer>> same_host_;
  absl::Mutex box_mu_;

  mutable absl::Mutex mu_;
  std::vector<int64_t> clock_ ABSL_GUARDED_BY(mu_);    // per server
  std::vector<int64_t> session_ ABSL_GUARDED_BY(mu_);  // per server, from Join
  // Per server: the id of the next push of this session (PS9).
  std::vector<uint64_t> next_push_id_ ABSL_GUARDED_BY(mu_);
  int64_t max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  SameHostStats same_host_stats_ ABSL_GUARDED_BY(mu_);
  // Per server, what the last push's reply named: a pull at `clock` may
  // read board version `version` (or a newer one) without a message.
  struct BoardFloor {
    int64_t clock = -1;
    int64_t version = -1;
  };
  std::vector<BoardFloor> board_floor_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::ps

#endif  // BATON_PS_CLIENT_H_
