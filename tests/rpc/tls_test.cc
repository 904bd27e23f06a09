// Mutual TLS between workers (AgentOptions::security.tls, base/tls.h): the store and
// the gRPC streams accept only peers with a certificate from the job's CA.
// Certificates are made at test time by tools/make_certs.sh (openssl) in the
// test's temporary directory. Real agents and gRPC on loopback, in threads
// of one process.
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/agent.h"
#include "testing/multiprocess.h"

namespace baton::rpc {
namespace {

const Function<int64_t(int64_t)> echo_fn("echo");

// CA + certificate "node" in dir/; a second CA and "rogue" in dir/other/.
std::string Certificates() {
  static const std::string dir = [] {
    const std::string d = absl::StrCat(::testing::TempDir(), "/certs");
    const std::string cmd = absl::StrCat("bash tools/make_certs.sh ", d, " node && ",
                                         "bash tools/make_certs.sh ", d, "/other rogue");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}

TlsFiles Node() {
  const std::string d = Certificates();
  return {d + "/ca.pem", d + "/node.pem", d + "/node.key", ""};
}

AgentOptions Options(int rank, int port, TlsFiles tls) {
  AgentOptions o;
  o.name = absl::StrCat("w", rank);
  o.rank = rank;
  o.world_size = 2;
  o.master_port = port;
  o.security.job_token = "tls-test-token-0123456789";
  o.security.tls = std::move(tls);
  o.timeouts.init = absl::Seconds(3);
  o.transport.same_host_shm = false;
  o.transport.local_transport = AgentOptions::LocalTransport::kNetwork;  // the streams use TLS
  return o;
}

std::shared_ptr<FunctionRegistry> Registry() {
  auto r = std::make_shared<FunctionRegistry>();
  (void)r->Register(echo_fn, [](int64_t v) { return v; });
  return r;
}

// Starts rank 0 with `tls0` and rank 1 with `tls1`; returns both results.
std::pair<absl::StatusOr<std::unique_ptr<RpcAgent>>, absl::StatusOr<std::unique_ptr<RpcAgent>>> Job(
    TlsFiles tls0, TlsFiles tls1) {
  const int port = baton::testing::FreePort();
  absl::StatusOr<std::unique_ptr<RpcAgent>> a0, a1;
  std::thread t0([&] { a0 = RpcAgent::Create(Options(0, port, tls0), Registry()); });
  a1 = RpcAgent::Create(Options(1, port, tls1), Registry());
  t0.join();
  return {std::move(a0), std::move(a1)};
}

TEST(Tls, WorkersWithCertificatesOfTheJobsCaTalkOverMutualTls) {
  auto [a0, a1] = Job(Node(), Node());
  ASSERT_TRUE(a0.ok()) << a0.status();
  ASSERT_TRUE(a1.ok()) << a1.status();
  EXPECT_EQ((*a0)->rpc_sync(1, echo_fn, 3), 3);
  EXPECT_EQ((*a1)->rpc_sync(0, echo_fn, 4), 4);
  EXPECT_EQ((*a1)->rpc_sync(1, echo_fn, 5), 5);
  EXPECT_FALSE((*a0)->runtime().uses_shm_transport(1));
  std::thread s([&] { EXPECT_TRUE((*a1)->Shutdown().ok()); });
  EXPECT_TRUE((*a0)->Shutdown().ok());
  s.join();
}

TEST(Tls, PlainTextWorkerCannotReachATlsStore) {
  auto [a0, a1] = Job(Node(), TlsFiles{});
  EXPECT_FALSE(a1.ok());
  EXPECT_FALSE(a0.ok());  // rank 1 never registered
}

TEST(Tls, CertificateOfAnotherCaIsRefused) {
  const std::string d = Certificates() + "/other";
  auto [a0, a1] = Job(Node(), TlsFiles{d + "/ca.pem", d + "/rogue.pem", d + "/rogue.key", ""});
  EXPECT_FALSE(a1.ok());
  EXPECT_FALSE(a0.ok());
}

TEST(Tls, MissingOrPartialFilesFailCreateNamingThem) {
  TlsFiles missing = Node();
  missing.key_file = "/nonexistent/node.key";
  auto a = RpcAgent::Create(Options(0, baton::testing::FreePort(), missing), Registry());
  ASSERT_EQ(a.status().code(), absl::StatusCode::kNotFound) << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "/nonexistent/node.key")) << a.status();
  TlsFiles partial = Node();
  partial.cert_file.clear();
  a = RpcAgent::Create(Options(0, baton::testing::FreePort(), partial), Registry());
  ASSERT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "certificate (--tls_cert")) << a.status();
}

}  // namespace
}  // namespace baton::rpc
