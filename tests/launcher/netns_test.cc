// Two node agents in two network namespaces joined by a veth pair, so each
// node has its own address. Needs root and `ip netns`; skipped otherwise.
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/launcher/netns.h"

namespace baton::launcher::testing {
namespace {

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
