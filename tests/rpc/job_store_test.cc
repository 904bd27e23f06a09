// The connection to the job's store (rpc/internal/job_store.h), without an
// agent: which way each configuration takes, and what a wrong one says.
#include "rpc/internal/job_store.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/file_io.h"
#include "store/memory_store.h"
#include "testing/ports.h"

namespace baton::rpc::internal {
namespace {

AgentOptions Options(int rank, int port) {
  AgentOptions o;
  o.name = absl::StrCat("w", rank);
  o.rank = rank;
  o.world_size = 2;
  o.master_port = port;
  o.timeouts.init = absl::Seconds(20);
  return o;
}

TEST(JobStore, AJobThatMaySpanHostsNeedsATokenFromOutsideIt) {
  AgentOptions o = Options(1, 29999);
  o.master_addr = "10.1.2.3";
  const absl::Status s = JobStore::Connect(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "BATON_JOB_TOKEN")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "10.1.2.3:29999")) << s;
}

TEST(JobStore, AStoreOnEtcdNeedsATokenWhichNeverGoesThroughIt) {
  AgentOptions o = Options(0, 29999);
  o.etcd.endpoint = "127.0.0.1:1";
  const absl::Status s = JobStore::Connect(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "never goes through it")) << s;
}

TEST(JobStore, AMissingTlsFileFailsNamingIt) {
  AgentOptions o = Options(0, 29999);
  o.security.job_token = "t";
  o.security.tls = {"/nonexistent/ca.pem", "/nonexistent/cert.pem", "/nonexistent/key.pem", ""};
  const absl::Status s = JobStore::Connect(o).status();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "/nonexistent/")) << s;
}

TEST(JobStore, AnInjectedStoreIsUsedAsItIsWithTheTokenGiven) {
  AgentOptions o = Options(1, 29999);
  o.master_addr = "10.1.2.3";  // not read: the store is given
  o.store = std::make_shared<store::MemoryStore>();
  o.security.job_token = "given";
  absl::StatusOr<JobStore> job = JobStore::Connect(o);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->store, o.store);
  EXPECT_EQ(job->server, nullptr);
  EXPECT_EQ(job->token, "given");
}

TEST(JobStore, OnOneHostRankZeroMakesTheTokenAndHandsItOverInAPrivateFile) {
  const int port = testing::FreePort();
  ASSERT_GT(port, 0);
  absl::StatusOr<JobStore> zero = JobStore::Connect(Options(0, port));
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_NE(zero->server, nullptr);
  EXPECT_EQ(zero->token.size(), 32u);
  ASSERT_FALSE(zero->token_file.empty());
  struct stat st {};
  ASSERT_EQ(::stat(zero->token_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(ReadFile(zero->token_file).value_or(""), zero->token);

  absl::StatusOr<JobStore> one = JobStore::Connect(Options(1, port));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->server, nullptr);
  EXPECT_EQ(one->token, zero->token);
  EXPECT_TRUE(one->token_file.empty());
  // Both see one store.
  ASSERT_TRUE(zero->store->Set("k", "v").ok());
  EXPECT_EQ(one->store->Get("k", absl::Seconds(5)).value_or(""), "v");
  one->store.reset();
  zero->server->Shutdown(absl::Milliseconds(200));
  ::unlink(zero->token_file.c_str());
}

}  // namespace
}  // namespace baton::rpc::internal
