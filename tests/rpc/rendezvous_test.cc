// The rendezvous's cost to the job's store (issue 48, "the rendezvous at
// scale"): each worker's init sends the store a number of requests that
// does not grow with the number of workers (its round, its claim, its
// record, one read of every record, one read of the same-host links, two
// barriers), so the store's host answers O(n) requests for a job of n
// workers, not O(n^2). Real agents, the built-in store and gRPC on
// loopback, in threads of one process.
#include <algorithm>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "rpc/agent.h"
#include "rpc/function.h"
#include "rpc/runtime.h"
#include "store/store_client.h"
#include "testing/multiprocess.h"

namespace baton::rpc {
namespace {

constexpr char kToken[] = "rendezvous-test-token-0123456789";

const Function<int64_t(int64_t)> kTwice("twice");

std::shared_ptr<FunctionRegistry> Registry() {
  auto r = std::make_shared<FunctionRegistry>();
  (void)r->Register(kTwice, [](int64_t v) { return 2 * v; });
  return r;
}

// A job of `world` agents in this process over the built-in store, each
// started once rank 0 serves the store, so that none spends requests
// waiting for it to come up.
std::vector<std::unique_ptr<RpcAgent>> StartJob(int world, int link_peers_max = 64) {
  const int port = baton::testing::FreePort();
  auto options = [&](int rank) {
    AgentOptions o;
    o.transport.shm_link_peers_max = link_peers_max;
    o.name = absl::StrCat("w", rank);
    o.rank = rank;
    o.world_size = world;
    o.master_port = port;
    o.security.job_token = kToken;
    o.timeouts.init = absl::Seconds(30);
    return o;
  };
  std::vector<absl::StatusOr<std::unique_ptr<RpcAgent>>> created(world);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { created[0] = RpcAgent::Create(options(0), Registry()); });
  store::StoreClient probe({absl::StrCat("127.0.0.1:", port), kToken, absl::Seconds(30)});
  EXPECT_TRUE(probe.WaitForServer(absl::Seconds(30)).ok());
  for (int r = 1; r < world; ++r) {
    threads.emplace_back([&, r] { created[r] = RpcAgent::Create(options(r), Registry()); });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<RpcAgent>> agents;
  for (int r = 0; r < world; ++r) {
    if (!created[r].ok()) {
      ADD_FAILURE() << "rank " << r << ": " << created[r].status();
      continue;
    }
    agents.push_back(*std::move(created[r]));
  }
  return agents;
}

void ShutdownAll(std::vector<std::unique_ptr<RpcAgent>>& agents) {
  std::vector<std::thread> threads;
  for (auto& a : agents) threads.emplace_back([&a] { EXPECT_TRUE(a->Shutdown().ok()); });
  for (auto& t : threads) t.join();
}

// The most requests a worker other than rank 0 sent during its init, in a
// job of `world` workers.
int64_t MostRequestsPerWorker(int world) {
  std::vector<std::unique_ptr<RpcAgent>> agents = StartJob(world);
  EXPECT_EQ(agents.size(), static_cast<size_t>(world));
  int64_t most = -1;
  for (size_t r = 0; r < agents.size(); ++r) {
    const int64_t sent = agents[r]->runtime().store().RequestsSent();
    if (r == 0) {
      EXPECT_EQ(sent, 0) << "rank 0 uses the store it serves in-process";
    } else {
      most = std::max(most, sent);
    }
  }
  ShutdownAll(agents);
  return most;
}

TEST(Rendezvous, EachWorkerSendsTheStoreAsManyRequestsInAJobOfTwelveAsInAJobOfThree) {
  const int64_t small = MostRequestsPerWorker(3);
  const int64_t large = MostRequestsPerWorker(12);
  EXPECT_GT(small, 0);
  EXPECT_EQ(large, small);
  // What it is today (the store's connection, the group's kind, the round,
  // the incarnation, the store's instance, the rank's claim, the record and
  // its incarnation's mark, every record read, the probe, the links made
  // and read, two barriers of two, every record read again, the last
  // word); a change that adds a request per peer fails above.
  EXPECT_LE(large, 18);
}

// AgentOptions::transport.shm_link_peers_max: a host with more workers than that
// links none of them (n^2 links would cost n^2 rings of /dev/shm); its
// workers call each other over the network transport, and the calls work.
TEST(Rendezvous, AHostWithMoreWorkersThanTheLinkLimitLinksNoneAndCallsStillWork) {
  for (int limit : {0, 2, 1}) {
    std::vector<std::unique_ptr<RpcAgent>> agents = StartJob(3, limit);
    ASSERT_EQ(agents.size(), 3u);
    const bool linked = limit != 1;  // two other workers on this host
    for (int a = 0; a < 3; ++a) {
      for (int b = 0; b < 3; ++b) {
        if (a == b) continue;
        EXPECT_EQ(agents[a]->runtime().uses_shm_transport(b), linked)
            << "limit " << limit << ", " << a << " -> " << b;
        EXPECT_EQ(agents[a]->rpc_sync(b, kTwice, int64_t{a * 10 + b}), 2 * (a * 10 + b));
      }
    }
    ShutdownAll(agents);
  }
}

}  // namespace
}  // namespace baton::rpc
