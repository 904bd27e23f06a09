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
#include "rpc/runtime.h"
#include "store/store_client.h"
#include "testing/multiprocess.h"

namespace baton::rpc {
namespace {

constexpr char kToken[] = "rendezvous-test-token-0123456789";

// The most requests a worker other than rank 0 sent during its init, in a
// job of `world` workers.
int64_t MostRequestsPerWorker(int world) {
  const int port = baton::testing::FreePort();
  auto options = [&](int rank) {
    AgentOptions o;
    o.name = absl::StrCat("w", rank);
    o.rank = rank;
    o.world_size = world;
    o.master_port = port;
    o.job_token = kToken;
    o.init_timeout = absl::Seconds(30);
    return o;
  };
  std::vector<absl::StatusOr<std::unique_ptr<RpcAgent>>> agents(world);
  std::vector<std::thread> threads;
  threads.emplace_back(
      [&] { agents[0] = RpcAgent::Create(options(0), std::make_shared<FunctionRegistry>()); });
  // The others start once rank 0 serves the store, so that none spends
  // requests waiting for it to come up.
  store::StoreClient probe({absl::StrCat("127.0.0.1:", port), kToken, absl::Seconds(30)});
  EXPECT_TRUE(probe.WaitForServer(absl::Seconds(30)).ok());
  for (int r = 1; r < world; ++r) {
    threads.emplace_back(
        [&, r] { agents[r] = RpcAgent::Create(options(r), std::make_shared<FunctionRegistry>()); });
  }
  for (auto& t : threads) t.join();
  int64_t most = -1;
  for (int r = 0; r < world; ++r) {
    if (!agents[r].ok()) {
      ADD_FAILURE() << "rank " << r << ": " << agents[r].status();
      continue;
    }
    const int64_t sent = (*agents[r])->runtime().store().RequestsSent();
    if (r == 0) {
      EXPECT_EQ(sent, 0) << "rank 0 uses the store it serves in-process";
    } else {
      most = std::max(most, sent);
    }
  }
  threads.clear();
  for (int r = 0; r < world; ++r) {
    if (!agents[r].ok()) continue;
    threads.emplace_back([&, r] { EXPECT_TRUE((*agents[r])->Shutdown().ok()); });
  }
  for (auto& t : threads) t.join();
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

}  // namespace
}  // namespace baton::rpc
