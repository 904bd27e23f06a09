// MakeTempDir: a fresh directory for one test's files.
//
// Contract: creates and returns a new directory named `name`-XXXXXX under
// $TEST_TMPDIR (Bazel's per-test scratch directory, removed with the test's
// outputs) or /tmp. Aborts if it cannot: a test cannot go on without it.
//
// Thread-safety: safe to call from any thread (mkdtemp).
#ifndef BATON_TESTING_TEMP_DIR_H_
#define BATON_TESTING_TEMP_DIR_H_

#include <string>

namespace baton::testing {

std::string MakeTempDir(const std::string& name);

}  // namespace baton::testing

#endif  // BATON_TESTING_TEMP_DIR_H_
