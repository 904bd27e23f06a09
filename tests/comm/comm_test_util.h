// Helpers for comm/ tests that run as real processes (testing/multiprocess.h):
// the store every worker shares, the backend under test, its device.
//
// Thread-safety: call from the worker's main thread.
#ifndef BATON_TESTS_COMM_COMM_TEST_UTIL_H_
#define BATON_TESTS_COMM_COMM_TEST_UTIL_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/process_group.h"
#include "store/store.h"
#include "store/store_server.h"

namespace baton::comm::testing {

// Backends this build can test: "gloo" always; "nccl" when built with
// BATON_TEST_WITH_NCCL (the CUDA build).
std::vector<std::string> CompiledBackends();
// Empty if `backend` can run `world` ranks here, else why not (for
// GTEST_SKIP), e.g. "nccl needs 2 GPUs (one per rank), found 1".
std::string WhyUnavailable(const std::string& backend, int world);

BackendFactory FactoryFor(const std::string& backend);

// One worker process: rank 0 serves the store at MASTER_PORT, everyone is a
// client. The backend comes from the BATON_TEST_BACKEND variable.
struct Worker {
  int rank = 0;
  int world = 1;
  std::string backend = "gloo";
  std::unique_ptr<store::StoreServer> server;
  std::shared_ptr<store::Store> store;

  // The device this rank's tensors live on for `backend`.
  at::Device device() const;
  // Creates the world group with a short timeout suitable for tests.
  ProcessGroup MakeGroup(GroupOptions options = {}) const;
  // Store barrier so rank 0 keeps the store up until everyone is done.
  void Finish();
};
Worker StartWorker();

// Extra environment selecting the backend for RunWorkers.
std::map<std::string, std::string> BackendEnv(const std::string& backend);

}  // namespace baton::comm::testing

#endif  // BATON_TESTS_COMM_COMM_TEST_UTIL_H_
