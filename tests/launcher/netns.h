// A fixture for launcher tests across two "hosts": two network namespaces
// joined by a veth pair, so each node has its own address, and a silent
// network partition between them (every packet dropped on both ends: no
// link-down, no reset). Needs root and `ip netns`; the tests skip
// themselves otherwise.
//
// Thread-safety: one test thread.
#ifndef BATON_TESTS_LAUNCHER_NETNS_H_
#define BATON_TESTS_LAUNCHER_NETNS_H_

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/launcher/fixture.h"

namespace baton::launcher::testing {

// Runs a shell command quietly; its exit status.
inline int Sh(const std::string& command) {
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
    const std::string& va = veth_[0] = absl::StrCat("bv", ::getpid(), "a");
    const std::string& vb = veth_[1] = absl::StrCat("bv", ::getpid(), "b");
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
  // A silent partition between the nodes, as issue reports make it: a
  // token bucket of one byte on both ends of the veth pair drops every
  // packet (no link-down, no reset). Heal() lifts it.
  void Partition() {
    for (int n = 0; n < 2; ++n) {
      ASSERT_EQ(Sh(absl::StrCat("ip netns exec ", ns_[n], " tc qdisc add dev ", veth_[n],
                                " root tbf rate 1kbit burst 1 latency 1ms")),
                0)
          << "tc qdisc (the partition) failed";
    }
  }
  void Heal() {
    for (int n = 0; n < 2; ++n) {
      Sh(absl::StrCat("ip netns exec ", ns_[n], " tc qdisc del dev ", veth_[n], " root"));
    }
  }
  std::string ns_[2], addr_[2], veth_[2];
  bool created_ = false;
};

}  // namespace baton::launcher::testing

#endif  // BATON_TESTS_LAUNCHER_NETNS_H_
