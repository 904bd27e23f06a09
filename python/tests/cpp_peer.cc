// A C++ worker of the Python suite's interop test (test_rpc.py): it
// registers typed functions, joins the job from the environment the harness
// sets (RANK, WORLD_SIZE, MASTER_*), serves until every worker shuts down,
// and exits 0.
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "base/status.h"
#include "rpc/agent.h"

namespace {

using baton::rpc::Function;

const Function<at::Tensor(at::Tensor, at::Tensor)> kAdd("cpp.add");
const Function<std::tuple<int64_t, double, std::string>(
    std::vector<int64_t>, std::map<std::string, double>, std::optional<std::string>)>
    kDescribe("cpp.describe");
const Function<std::vector<at::Tensor>(int32_t, bool)> kMake("cpp.make");
const Function<void(std::string)> kFail("cpp.fail");
const Function<void()> kNoop("cpp.noop");

}  // namespace

int main() {
  auto registry = std::make_shared<baton::rpc::FunctionRegistry>();
  auto check = [](const absl::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "cpp_peer: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  };
  check(registry->Register(kAdd, [](at::Tensor a, at::Tensor b) { return a + b; }));
  check(registry->Register(kDescribe, [](std::vector<int64_t> v, std::map<std::string, double> m,
                                         std::optional<std::string> note) {
    int64_t sum = 0;
    for (int64_t x : v) sum += x;
    double total = 0;
    for (const auto& [k, x] : m) total += x;
    return std::make_tuple(sum, total, note.value_or("none"));
  }));
  check(registry->Register(kMake, [](int32_t n, bool ones) {
    std::vector<at::Tensor> out;
    for (int32_t i = 0; i < n; ++i) out.push_back(ones ? at::ones({i + 1}) : at::zeros({i + 1}));
    return out;
  }));
  check(registry->Register(kNoop, [] {}));
  check(registry->Register(kFail, [](std::string why) -> absl::Status {
    return absl::FailedPreconditionError("cpp_peer refuses: " + why);
  }));
  auto options = baton::rpc::AgentOptions::FromEnv("cpp");
  check(options.status());
  options->timeouts.shutdown_wait_for_peers = absl::InfiniteDuration();
  auto agent = baton::rpc::RpcAgent::Create(*options, registry);
  check(agent.status());
  std::printf("cpp_peer %s ready\n", (*agent)->self().name.c_str());
  std::fflush(stdout);
  check((*agent)->Shutdown());
  std::printf("SCENARIO OK\n");
  return 0;
}
