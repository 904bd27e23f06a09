// A job for tests/launcher/partition_test.cc: two workers on two nodes
// (baton-run --nnodes 2 --nproc_per_node 1). Rank 0 calls echo() on rank 1
// every 100 ms with a 3 s deadline and appends each outcome to
// --out=DIR/calls.log, one line per call:
//
//   <start, ms since the epoch> <duration ms> ok
//   <start, ms since the epoch> <duration ms> <status code name> <message>
//
// until DIR/stop exists; then it calls finish() on rank 1 (retrying until it
// answers, for at most --finish_timeout_s), and both shut down gracefully.
// Rank 0 exits 0 when its last echo() succeeded; rank 1 when finish() came.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/agent.h"
#include "tests/launcher/job_flags.h"

namespace baton {
namespace {

using rpc::CallOptions;
using rpc::Function;

const Function<int64_t(int64_t)> echo_fn("echo");
const Function<int64_t()> finish_fn("finish");

using ::baton::testing::Fail;
using ::baton::testing::Flag;

int Run(int argc, char** argv) {
  const std::string out = Flag(argc, argv, "out");
  if (out.empty()) return Fail("--out=DIR");
  int finish_timeout_s = 120;
  (void)absl::SimpleAtoi(Flag(argc, argv, "finish_timeout_s"), &finish_timeout_s);
  auto options = rpc::AgentOptions::FromEnv("w");
  if (!options.ok()) return Fail(options.status().ToString());
  const int rank = options->rank;
  options->timeouts.init = absl::Seconds(60);

  absl::Notification finished;
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  (void)registry->Register(echo_fn, [](int64_t v) { return v; });
  (void)registry->Register(finish_fn, [&finished]() -> int64_t {
    if (!finished.HasBeenNotified()) finished.Notify();
    return 0;
  });
  auto agent = rpc::RpcAgent::Create(*options, registry);
  if (!agent.ok()) return Fail(agent.status().ToString());
  std::printf("rank %d: started\n", rank);
  std::fflush(stdout);

  if (rank != 0) {
    if (!finished.WaitForNotificationWithTimeout(absl::Seconds(600))) {
      return Fail("finish() never came");
    }
  } else {
    std::ofstream log(out + "/calls.log", std::ios::app);
    bool last_ok = false;
    for (int64_t i = 0; access((out + "/stop").c_str(), F_OK) != 0; ++i) {
      const absl::Time start = absl::Now();
      auto r = (*agent)->rpc_async(CallOptions{absl::Seconds(3)}, 1, echo_fn, i).result();
      const int64_t took = absl::ToInt64Milliseconds(absl::Now() - start);
      last_ok = r.ok() && *r == i;
      log << absl::ToUnixMillis(start) << " " << took << " "
          << (r.ok() ? std::string(last_ok ? "ok" : "wrong-value")
                     : absl::StrCat(absl::StatusCodeToString(r.status().code()), " ",
                                    r.status().message()))
          << std::endl;
      // The calls' pace (one every 100 ms); not synchronization.
      absl::SleepFor(absl::Milliseconds(100) - (absl::Now() - start));
    }
    const absl::Time until = absl::Now() + absl::Seconds(finish_timeout_s);
    absl::Status fin;
    do {
      fin = (*agent)->rpc_async(CallOptions{absl::Seconds(3)}, 1, finish_fn).result().status();
      if (!fin.ok()) absl::SleepFor(absl::Milliseconds(200));  // a retry's pace, not a wait
    } while (!fin.ok() && absl::Now() < until);
    if (!fin.ok()) return Fail(absl::StrCat("finish(): ", fin.ToString()));
    if (!last_ok) return Fail("the last echo() failed");
  }
  if (absl::Status s = (*agent)->Shutdown(); !s.ok()) return Fail(s.ToString());
  std::printf("rank %d: RESULT OK\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Run(argc, argv); }
