// GoogleTest assertions over multi-process results (tests/multiprocess.h).
// Header-only, for test binaries that link GoogleTest.
#ifndef BATON_TESTS_MULTIPROCESS_GTEST_H_
#define BATON_TESTS_MULTIPROCESS_GTEST_H_

#include <vector>

#include <gtest/gtest.h>

#include "tests/multiprocess.h"

namespace baton::testing {

// Every worker exited 0, was not signalled and did not time out; a failure
// prints every worker's output.
inline void ExpectAllSucceeded(const std::vector<WorkerResult>& results) {
  for (const auto& r : results) {
    EXPECT_TRUE(r.exit_code == 0 && r.signal == 0 && !r.timed_out) << Describe(results);
  }
}

}  // namespace baton::testing

#endif  // BATON_TESTS_MULTIPROCESS_GTEST_H_
