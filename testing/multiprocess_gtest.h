// GoogleTest assertions over multi-process results (testing/multiprocess.h).
// Header-only, for test binaries that link GoogleTest.
#ifndef BATON_TESTING_MULTIPROCESS_GTEST_H_
#define BATON_TESTING_MULTIPROCESS_GTEST_H_

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/multiprocess.h"

namespace baton::testing {

// Every worker exited 0, was not signalled and did not time out; a failure
// prints every worker's output.
inline void ExpectAllSucceeded(const std::vector<WorkerResult>& results) {
  for (const auto& r : results) {
    EXPECT_TRUE(r.exit_code == 0 && r.signal == 0 && !r.timed_out) << Describe(results);
  }
}

// Base of a suite that runs each test once per same-host transport: the
// shared-memory rings (the default) and loopback gRPC (the path between
// hosts), through AgentOptions::FromEnv's BATON_TRANSPORT. Declare
//   class MySuite : public baton::testing::TransportTest {};
//   BATON_INSTANTIATE_TRANSPORTS(MySuite);
// and call Run() instead of RunWorkers() in TEST_P(MySuite, ...).
class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::vector<WorkerResult> Run(const std::string& scenario, int world_size, absl::Duration timeout,
                                std::map<std::string, std::string> env = {}) {
    env["BATON_TRANSPORT"] = GetParam();
    return RunWorkers(scenario, world_size, timeout, env);
  }
};

}  // namespace baton::testing

#define BATON_INSTANTIATE_TRANSPORTS(suite)                \
  INSTANTIATE_TEST_SUITE_P(                                \
      Transports, suite, ::testing::Values("shm", "grpc"), \
      [](const ::testing::TestParamInfo<std::string>& info) { return info.param; })

#endif  // BATON_TESTING_MULTIPROCESS_GTEST_H_
