// PsClient: a trainer's handle on the parameter servers of a job.
//
//   ps::PsClient::Options o;
//   o.trainer = role_rank;                 // 0..spec.num_trainers-1
//   o.servers = {"ps0", "ps1"};            // worker names, server index order
//   auto client = ps::PsClient::Create(*agent, spec, o).value();
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
}

namespace baton::ps {

class PsClient {
 public:
  struct Options {
    int trainer = 0;
    std::vector<std::string> servers;  // worker names; index = server index
    absl::Duration timeout = absl::Seconds(60);
  };

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

  rpc::RpcAgent& agent_;
  const PsSpec spec_;
  const Options options_;
  const ShardPlan plan_;
  std::vector<int> server_ids_;  // worker ids; set by Create

  mutable absl::Mutex mu_;
  std::vector<int64_t> clock_ ABSL_GUARDED_BY(mu_);    // per server
  std::vector<int64_t> session_ ABSL_GUARDED_BY(mu_);  // per server, from Join
  int64_t max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace baton::ps

#endif  // BATON_PS_CLIENT_H_
