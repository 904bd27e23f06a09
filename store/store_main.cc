// baton-store: runs the rendezvous store as its own process.
//   baton-store [--address HOST:PORT]   (default 127.0.0.1:29500)
// The job token, if any, comes from BATON_JOB_TOKEN. Stops on SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "store/store_server.h"

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:29500";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--address") == 0 && i + 1 < argc) {
      address = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--address HOST:PORT]\n", argv[0]);
      return 2;
    }
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  baton::store::StoreServerOptions options;
  options.address = address;
  if (const char* t = std::getenv("BATON_JOB_TOKEN")) options.job_token = t;
  auto server = baton::store::StoreServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "baton-store: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("baton-store listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  (*server)->Shutdown();
  return 0;
}
