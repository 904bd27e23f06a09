// The job token's secrecy (AgentOptions::security.job_token): a job that may span
// hosts must bring its own; a worker with another token is refused by the
// store; a one-host job without one shares it through a private file, never
// through the store. Real agents, store and gRPC on loopback, in threads of
// one process.
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/agent.h"
#include "store/store_client.h"
#include "testing/multiprocess.h"

namespace baton::rpc {
namespace {

const Function<int64_t(int64_t)> echo_fn("echo");

AgentOptions Options(int rank, int port, const std::string& token) {
  AgentOptions o;
  o.name = absl::StrCat("w", rank);
  o.rank = rank;
  o.world_size = 2;
  o.master_port = port;
  o.security.job_token = token;
  o.timeouts.init = absl::Seconds(3);
  o.transport.same_host_shm = false;
  return o;
}

std::shared_ptr<FunctionRegistry> Registry() {
  auto r = std::make_shared<FunctionRegistry>();
  (void)r->Register(echo_fn, [](int64_t v) { return v; });
  return r;
}

TEST(JobToken, WorkerThatMaySpanHostsWithoutATokenFailsSayingHowToProvideOne) {
  AgentOptions o = Options(1, baton::testing::FreePort(), "");
  o.master_addr = "10.255.255.1";  // not loopback: never contacted
  const absl::Time start = absl::Now();
  auto agent = RpcAgent::Create(o, Registry());
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_EQ(agent.status().code(), absl::StatusCode::kFailedPrecondition) << agent.status();
  EXPECT_TRUE(absl::StrContains(agent.status().message(), "BATON_JOB_TOKEN")) << agent.status();
  EXPECT_TRUE(absl::StrContains(agent.status().message(), "may span hosts")) << agent.status();
}

TEST(JobToken, WorkerWithAnotherTokenIsRejectedByTheStore) {
  const int port = baton::testing::FreePort();
  absl::StatusOr<std::unique_ptr<RpcAgent>> a0;
  std::thread t0(
      [&] { a0 = RpcAgent::Create(Options(0, port, "the-jobs-token-0123"), Registry()); });
  // The job's store is up, with rank 0 registered in it, before the
  // intruder comes: read with the job's token.
  store::StoreClient member(
      {absl::StrCat("127.0.0.1:", port), "the-jobs-token-0123", absl::Seconds(10)});
  const absl::Status up = member.Get("baton/r1/worker/0", absl::Seconds(10)).status();
  if (!up.ok()) {
    t0.join();
    FAIL() << "rank 0 never registered: " << up << "; rank 0: " << a0.status();
  }
  auto a1 = RpcAgent::Create(Options(1, port, "an-intruders-token"), Registry());
  ASSERT_FALSE(a1.ok());
  EXPECT_EQ(a1.status().code(), absl::StatusCode::kUnauthenticated) << a1.status();
  // Nor can a store client without a token read anything.
  store::StoreClient nosy({absl::StrCat("127.0.0.1:", port), "", absl::Seconds(1)});
  EXPECT_EQ(nosy.Get("baton/r1/worker/0", absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kUnauthenticated);
  t0.join();
  // Rank 0 never saw rank 1 register: it gives up at its init timeout.
  EXPECT_EQ(a0.status().code(), absl::StatusCode::kDeadlineExceeded) << a0.status();
}

TEST(JobToken, OneHostJobWithoutATokenSharesItThroughAPrivateFileNotTheStore) {
  const int port = baton::testing::FreePort();
  const std::string path = absl::StrCat("/tmp/baton-", ::getuid(), "/job-", port, ".token");
  absl::StatusOr<std::unique_ptr<RpcAgent>> a[2];
  std::thread t1([&] { a[1] = RpcAgent::Create(Options(1, port, ""), Registry()); });
  a[0] = RpcAgent::Create(Options(0, port, ""), Registry());
  t1.join();
  ASSERT_TRUE(a[0].ok()) << a[0].status();
  ASSERT_TRUE(a[1].ok()) << a[1].status();
  EXPECT_EQ((*a[1])->rpc_sync(0, echo_fn, 5), 5);
  struct stat file {
  }, dir{};
  ASSERT_EQ(::stat(path.c_str(), &file), 0) << path;
  ASSERT_EQ(::stat(path.substr(0, path.rfind('/')).c_str(), &dir), 0);
  EXPECT_EQ(file.st_mode & 0777, 0600u);
  EXPECT_EQ(dir.st_mode & 0777, 0700u);
  // The store holds no token, and refuses a client without it.
  RpcAgent& w0 = **a[0];
  EXPECT_EQ(w0.runtime()
                .store()
                .Get(w0.runtime().store_namespace() + "job_token", absl::Milliseconds(100))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  store::StoreClient nosy({absl::StrCat("127.0.0.1:", port), "", absl::Seconds(1)});
  EXPECT_EQ(nosy.Set("x", "y").code(), absl::StatusCode::kUnauthenticated);
  std::thread s1([&] { EXPECT_TRUE((*a[1])->Shutdown().ok()); });
  EXPECT_TRUE((*a[0])->Shutdown().ok());
  s1.join();
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "rank 0 removes the token file at shutdown";
}

}  // namespace
}  // namespace baton::rpc
