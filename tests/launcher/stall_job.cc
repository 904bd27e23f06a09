// A job for tests/launcher/state_report_test.cc that stalls on purpose: two
// workers whose calls form a cycle. Rank 0 calls outer() on rank 1; outer
// calls inner() on rank 0; inner creates --ready_file=PATH once the cycle
// stands and then waits, as both workers do, until the test stops the job
// (or 120 s pass). Exit 1 with the reason on any failure.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "rpc/agent.h"

namespace baton {
namespace {

constexpr absl::Duration kStall = absl::Seconds(120);
const rpc::Function<int64_t(int64_t)> outer_fn("outer");
const rpc::Function<int64_t(int64_t)> inner_fn("inner");

int Fail(const std::string& why) {
  std::fprintf(stderr, "FAIL: %s\n", why.c_str());
  return 1;
}

int Main(int argc, char** argv) {
  std::string ready;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--ready_file=")) ready = std::string(a);
  }
  if (ready.empty()) return Fail("usage: stall_job --ready_file=PATH");
  auto options = rpc::AgentOptions::FromEnv("w");
  if (!options.ok()) return Fail(options.status().ToString());
  options->timeouts.rpc = kStall;
  auto never = std::make_shared<absl::Notification>();
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  (void)registry->Register(outer_fn, [](const rpc::CallContext& ctx, int64_t v) {
    return ctx.agent->rpc_sync(0, inner_fn, v) + 1;
  });
  (void)registry->Register(inner_fn, [ready, never](int64_t v) {
    std::ofstream(ready) << "cycle\n";
    never->WaitForNotificationWithTimeout(kStall);
    return v;
  });
  auto agent = rpc::RpcAgent::Create(*options, registry);
  if (!agent.ok()) return Fail(agent.status().ToString());
  std::printf("rank %d: started\n", options->rank);
  std::fflush(stdout);
  if (options->rank == 0) {
    auto r = (*agent)->rpc_async(1, outer_fn, int64_t{1}).result();
    if (!r.ok()) return Fail(r.status().ToString());
  } else {
    never->WaitForNotificationWithTimeout(kStall);
  }
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
