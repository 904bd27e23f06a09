// What the test jobs that baton-run starts (startup_job, partition_job)
// share: their flags and how they fail.
//
// Thread-safety: stateless.
#ifndef BATON_TESTS_LAUNCHER_JOB_FLAGS_H_
#define BATON_TESTS_LAUNCHER_JOB_FLAGS_H_

#include <cstdio>
#include <string>

#include "absl/strings/match.h"

namespace baton::testing {

// Prints "FAIL: why" and returns the job's failure exit code (1).
inline int Fail(const std::string& why) {
  std::fprintf(stderr, "FAIL: %s\n", why.c_str());
  std::fflush(stderr);
  return 1;
}

// The value of --name=VALUE, "1" for a bare --name, "" when absent.
inline std::string Flag(int argc, char** argv, const std::string& name) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], prefix)) return std::string(argv[i] + prefix.size());
    if (name == argv[i] + 2 && absl::StartsWith(argv[i], "--")) return "1";
  }
  return "";
}

}  // namespace baton::testing

#endif  // BATON_TESTS_LAUNCHER_JOB_FLAGS_H_
