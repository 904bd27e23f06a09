// free_port [N]: prints N (default 1) distinct ports drawn as
// testing::FreePort draws them (testing/ports.h), one per line, for shell
// tests; exits 1 if none was found.
#include <cstdio>
#include <cstdlib>

#include "testing/ports.h"

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 1;
  for (int i = 0; i < n; ++i) {
    const int port = baton::testing::FreePort();
    if (port < 0) {
      std::fprintf(stderr, "free_port: no free port below the ephemeral range\n");
      return 1;
    }
    std::printf("%d\n", port);
  }
  return 0;
}
