// main() for comm/ test binaries with multi-process scenarios (the same as
// tests/multiprocess_main.cc, which is not exported to other packages).
#include <gtest/gtest.h>

#include "tests/multiprocess.h"

int main(int argc, char** argv) {
  const int code = baton::testing::MaybeRunScenario(argc, argv);
  if (code >= 0) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
