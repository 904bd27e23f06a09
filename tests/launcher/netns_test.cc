// Two node agents in two network namespaces joined by a veth pair, so each
// node has its own address. Needs root and `ip netns`; skipped otherwise.
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/launcher/fixture.h"

namespace baton::launcher::testing {
namespace {

int Sh(const std::string& command) {
  return std::system(absl::StrCat(command, " >/dev/null 2>&1").c_str());
}

class NetnsTest : public LauncherTest {
 protected:
  void SetUp() override {
    LauncherTest::SetUp();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root for ip netns";
    const int id = ::getpid() % 200 + 20;
    ns_[0] = absl::StrCat("baton", ::getpid(), "a");
    ns_[1] = absl::StrCat("baton", ::getpid(), "b");
    addr_[0] = absl::StrCat("10.231.", id, ".1");
    addr_[1] = absl::StrCat("10.231.", id, ".2");
    if (Sh(absl::StrCat("ip netns add ", ns_[0])) != 0) {
      GTEST_SKIP() << "ip netns is not available here";
    }
    created_ = true;
    const std::string va = absl::StrCat("bv", ::getpid(), "a"),
                      vb = absl::StrCat("bv", ::getpid(), "b");
    const std::vector<std::string> setup = {
        absl::StrCat("ip netns add ", ns_[1]),
        absl::StrCat("ip link add ", va, " type veth peer name ", vb),
        absl::StrCat("ip link set ", va, " netns ", ns_[0]),
        absl::StrCat("ip link set ", vb, " netns ", ns_[1]),
        absl::StrCat("ip -n ", ns_[0], " addr add ", addr_[0], "/24 dev ", va),
        absl::StrCat("ip -n ", ns_[1], " addr add ", addr_[1], "/24 dev ", vb),
        absl::StrCat("ip -n ", ns_[0], " link set ", va, " up"),
        absl::StrCat("ip -n ", ns_[1], " link set ", vb, " up"),
        absl::StrCat("ip -n ", ns_[0], " link set lo up"),
        absl::StrCat("ip -n ", ns_[1], " link set lo up"),
    };
    for (const std::string& c : setup) {
      if (Sh(c) != 0) GTEST_SKIP() << "could not set up the veth pair: " << c;
    }
  }
  void TearDown() override {
    LauncherTest::TearDown();
    if (created_) {
      // Deleting a namespace removes its end of the veth pair, and the pair.
      Sh(absl::StrCat("ip netns del ", ns_[0]));
      Sh(absl::StrCat("ip netns del ", ns_[1]));
    }
  }
  std::string ns_[2], addr_[2];
  bool created_ = false;
};

TEST_F(NetnsTest, TwoNodesWithTheirOwnAddresses) {
  const int port = 29600, rdzv = 29601;  // Fresh namespaces: all ports free.
  std::vector<std::unique_ptr<Launcher>> nodes;
  for (int n = 0; n < 2; ++n) {
    std::vector<std::string> flags = {"--nnodes",         "2",
                                      "--node_rank",      absl::StrCat(n),
                                      "--nproc_per_node", "2",
                                      "--master_addr",    addr_[0],
                                      "--master_port",    absl::StrCat(port),
                                      "--rdzv_port",      absl::StrCat(rdzv)};
    nodes.push_back(std::make_unique<Launcher>(
        marker_, Args(flags, "env"),
        std::map<std::string, std::string>{{"BATON_JOB_TOKEN", "netns-test-token-0123456789"}},
        std::vector<std::string>{"ip", "netns", "exec", ns_[n]}));
  }
  for (auto& n : nodes) ASSERT_EQ(n->Wait(absl::Seconds(60)), 0) << n->Output();
  for (int r = 0; r < 4; ++r) {
    auto env = Env(r, 0);
    EXPECT_EQ(env["MASTER_ADDR"], addr_[0]);
    EXPECT_EQ(env["GROUP_RANK"], absl::StrCat(r / 2));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["BATON_JOB_TOKEN"], "netns-test-token-0123456789");
  }
}

}  // namespace
}  // namespace baton::launcher::testing
