// The parameter server's shards served in one process, for the tests that
// drive ServerShard directly (server_shard_test.cc, server_shard_rows_test.cc):
// Cluster routes each request to the shard that holds it, as PsClient does.
//
// Thread-safety: a Cluster is used as its shards are (ServerShard is
// thread-safe); the functions are pure.
#ifndef BATON_TESTS_PS_SHARD_CLUSTER_H_
#define BATON_TESTS_PS_SHARD_CLUSTER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "ps/server_shard.h"
#include "ps/sharding.h"

namespace baton::ps::testing {

using dist_optim::OptimizerOptions;

// Serves several shards in one process the way PsClient routes requests.
class Cluster {
 public:
  Cluster(const PsSpec& spec, int servers, const Clock* clock = nullptr,
          ServerShard::Logger log = nullptr)
      : spec_(spec), plan_(ShardPlan::Make(spec, servers)) {
    for (int s = 0; s < servers; ++s) {
      ServerShard::Options o;
      o.server = s;
      o.num_servers = servers;
      o.clock = clock;
      o.log = log ? log : [](const std::string&) {};
      shards_.push_back(ServerShard::Create(spec, o).value());
    }
    for (int s = 0; s < servers; ++s) {
      for (int t = 0; t < spec.num_trainers; ++t) {
        EXPECT_TRUE(shards_[s]->Join(t, spec.Fingerprint()).ok());
      }
    }
  }

  ServerShard& shard(int s) { return *shards_[s]; }
  int size() const { return static_cast<int>(shards_.size()); }

  void InitDense(int table, const at::Tensor& value) {
    at::Tensor flat = value.reshape(-1).contiguous();
    for (const auto& c : plan_.chunks(table)) {
      ASSERT_TRUE(
          shards_[c.server]
              ->InitDense(0, {{spec_.tables[table].name, {}, flat.narrow(0, c.begin, c.size())}})
              .ok());
    }
  }

  // Blocking pull of a whole dense table (at `clock`).
  absl::StatusOr<at::Tensor> PullDense(int trainer, int64_t clock, int table,
                                       absl::Duration wait = absl::Seconds(10)) {
    const TableSpec& t = spec_.tables[table];
    at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
    for (const auto& c : plan_.chunks(table)) {
      auto r = Blocking(c.server, trainer, clock, {{t.name, {}, {}}}, wait);
      if (!r.ok()) return r.status();
      out.view(-1).narrow(0, c.begin, c.size()).copy_(r->values[0]);
    }
    return out;
  }

  absl::StatusOr<at::Tensor> PullRows(int trainer, int64_t clock, int table, at::Tensor ids) {
    const TableSpec& t = spec_.tables[table];
    at::Tensor out = at::empty({ids.numel(), t.dim}, at::TensorOptions().dtype(t.dtype));
    for (int s = 0; s < size(); ++s) {
      at::Tensor mask = (ids % size()) == s;
      at::Tensor pos = mask.nonzero().reshape(-1);
      if (pos.numel() == 0) continue;
      auto r =
          Blocking(s, trainer, clock, {{t.name, ids.index_select(0, pos), {}}}, absl::Seconds(10));
      if (!r.ok()) return r.status();
      out.index_copy_(0, pos, r->values[0]);
    }
    return out;
  }

  absl::StatusOr<PullResult> Blocking(int server, int trainer, int64_t clock,
                                      std::vector<TableRequest> reqs, absl::Duration wait) {
    auto result = std::make_shared<absl::StatusOr<PullResult>>();
    auto done = std::make_shared<absl::Notification>();
    shards_[server]->Pull(trainer, clock, std::move(reqs), absl::Now() + wait,
                          [result, done](absl::StatusOr<PullResult> r) {
                            *result = std::move(r);
                            done->Notify();
                          });
    if (!done->WaitForNotificationWithTimeout(wait + absl::Seconds(5))) {
      return absl::DeadlineExceededError("test: pull never completed");
    }
    return *result;
  }

  // Pushes a dense gradient (split into chunks) and/or rows, ending the clock.
  absl::Status Push(int trainer, int64_t clock, int table, const at::Tensor& grad,
                    const at::Tensor& ids = {}, bool end_clock = true) {
    const TableSpec& t = spec_.tables[table];
    for (int s = 0; s < size(); ++s) {
      std::vector<TableRequest> reqs;
      if (t.kind == TableKind::kDense) {
        DenseChunk c = plan_.ChunkOf(table, s);
        if (c.size() > 0) {
          reqs.push_back({t.name, {}, grad.reshape(-1).narrow(0, c.begin, c.size())});
        }
      } else {
        at::Tensor pos = ((ids % size()) == s).nonzero().reshape(-1);
        if (pos.numel() > 0) {
          reqs.push_back({t.name, ids.index_select(0, pos), grad.index_select(0, pos)});
        }
      }
      auto r = shards_[s]->Push(trainer, clock, end_clock, std::move(reqs));
      if (!r.ok()) return r.status();
    }
    return absl::OkStatus();
  }

 private:
  PsSpec spec_;
  ShardPlan plan_;
  std::vector<std::unique_ptr<ServerShard>> shards_;
};

// A dense linear model's tables, w [7, 300] and b [7].
inline PsSpec LinearSpec(torch::Dtype dtype, const OptimizerOptions& opt, Consistency c,
                         int trainers) {
  PsSpec spec;
  spec.tables = {TableSpec::Dense("w", {7, 300}, dtype, opt),
                 TableSpec::Dense("b", {7}, dtype, opt)};
  spec.consistency = c;
  spec.num_trainers = trainers;
  return spec;
}

inline void ExpectClose(const torch::Tensor& a, const torch::Tensor& b, double tol) {
  const double diff = (a - b).abs().max().item<double>();
  EXPECT_LE(diff, tol) << "max abs difference " << diff;
}

}  // namespace baton::ps::testing

#endif  // BATON_TESTS_PS_SHARD_CLUSTER_H_
