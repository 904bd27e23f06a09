// main() for test binaries with multi-process scenarios.
#include <gtest/gtest.h>

#include "testing/multiprocess.h"

int main(int argc, char** argv) {
  const int code = baton::testing::MaybeRunScenario(argc, argv);
  if (code >= 0) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
