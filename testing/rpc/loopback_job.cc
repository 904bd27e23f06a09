// A whole RPC job in one process over the loopback network (loopback_job.h).
#include "testing/rpc/loopback_job.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/status_macros.h"

namespace baton::rpc::testing {

absl::StatusOr<std::unique_ptr<LoopbackJob>> LoopbackJob::Start(LoopbackJobOptions options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be at least 1, got ", options.world_size));
  }
  std::unique_ptr<LoopbackJob> job(new LoopbackJob());
  job->options_ = options;
  job->network_ = std::make_unique<LoopbackNetwork>();
  job->store_ = std::make_shared<store::MemoryStore>();
  const int n = options.world_size;
  std::vector<absl::StatusOr<std::unique_ptr<RpcAgent>>> made(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      made[r] = job->StartOne(r, 0, /*rejoin=*/false);
      for (int start = 1; !made[r].ok() && start <= options.max_restarts; ++start) {
        made[r] = job->StartOne(r, start, /*rejoin=*/true);
      }
    });
  }
  for (auto& t : threads) t.join();
  absl::Status first;
  if (options.start_results != nullptr) options.start_results->clear();
  for (int r = 0; r < n; ++r) {
    if (!made[r].ok() && first.ok()) first = made[r].status();
    if (options.start_results != nullptr) options.start_results->push_back(made[r].status());
  }
  for (int r = 0; r < n; ++r) {
    job->agents_.push_back(made[r].ok() ? *std::move(made[r]) : nullptr);
  }
  job->killed_.assign(n, false);
  if (!first.ok()) return first;  // the destructor shuts down what was made
  if (options.attach) {
    for (int r = 0; r < n; ++r) options.attach(r, *job->agents_[r]);
  }
  return job;
}

absl::StatusOr<std::unique_ptr<RpcAgent>> LoopbackJob::StartOne(int rank, int start, bool rejoin) {
  AgentOptions o = OptionsFor(rank);
  o.restarts.rejoin = rejoin;
  auto registry = std::make_shared<FunctionRegistry>();
  if (options_.install) options_.install(rank, *registry);
  AgentCollaborators c;
  c.network_transport = network_->Factory();
  if (options_.clock != nullptr) c.timer = std::make_unique<DeadlineTimer>(options_.clock);
  if (options_.rendezvous_observer) {
    c.rendezvous_observer = [observer = options_.rendezvous_observer, rank,
                             start](RendezvousStep step) { return observer(rank, start, step); };
  }
  return RpcAgent::Create(std::move(o), std::move(registry), std::move(c));
}

AgentOptions LoopbackJob::OptionsFor(int rank) const {
  AgentOptions o;
  o.name = absl::StrCat(options_.name_prefix, rank);
  o.rank = rank;
  o.world_size = options_.world_size;
  o.store = store_;
  o.security.job_token = "loopback-job";
  o.timeouts.rpc = options_.rpc_timeout;
  o.timeouts.init = options_.init_timeout;
  o.timeouts.shutdown = options_.shutdown_timeout;
  o.transport.same_host_shm = false;
  o.transport.local_transport = AgentOptions::LocalTransport::kNetwork;
  if (options_.configure) options_.configure(rank, o);
  return o;
}

LoopbackJob::~LoopbackJob() { (void)ShutdownAll(/*graceful=*/false); }

absl::Status LoopbackJob::Restart(int rank, bool kill_first) {
  if (rank < 0 || rank >= world_size() || agents_[rank] == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no worker ", rank));
  }
  if (kill_first && !killed_[rank]) {
    RETURN_IF_ERROR(Kill(rank));
  }
  ASSIGN_OR_RETURN(auto agent, StartOne(rank, /*start=*/1, /*rejoin=*/true));
  replaced_.push_back(std::move(agents_[rank]));
  agents_[rank] = std::move(agent);
  killed_[rank] = false;
  if (options_.attach) options_.attach(rank, *agents_[rank]);
  return absl::OkStatus();
}

absl::Status LoopbackJob::Kill(int rank) {
  if (rank < 0 || rank >= world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("no worker ", rank));
  }
  absl::Status s = network_->Kill(rank);
  if (s.ok()) killed_[rank] = true;
  return s;
}

absl::Status LoopbackJob::ShutdownAll(bool graceful) {
  // Replaced incarnations first, as reaped processes.
  for (auto& a : replaced_) (void)a->Shutdown(/*graceful=*/false);
  replaced_.clear();
  const int n = world_size();
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    if (agents_[r] == nullptr) continue;
    threads.emplace_back([this, r, graceful, &results] {
      results[r] = agents_[r]->Shutdown(graceful && !killed_[r]);
    });
  }
  for (auto& t : threads) t.join();
  absl::Status first;
  for (int r = 0; r < n; ++r) {
    if (!results[r].ok() && first.ok() && !killed_[r]) {
      first = Annotate(results[r], absl::StrCat("worker ", r));
    }
  }
  for (auto& a : agents_) a.reset();
  return first;
}

}  // namespace baton::rpc::testing
