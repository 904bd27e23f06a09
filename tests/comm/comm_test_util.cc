#include "tests/comm/comm_test_util.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#ifndef BATON_TEST_WITHOUT_GLOO
#include "comm/gloo_backend.h"
#endif
#include "store/store_client.h"
#include "testing/multiprocess.h"

#ifdef BATON_TEST_WITH_NCCL
#include <cuda_runtime.h>

#include "comm/nccl_backend.h"
#endif

namespace baton::comm::testing {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::atoi(v);
}

}  // namespace

std::vector<std::string> CompiledBackends() {
  std::vector<std::string> out;
#ifndef BATON_TEST_WITHOUT_GLOO
  out.push_back("gloo");
#endif
#ifdef BATON_TEST_WITH_NCCL
  out.push_back("nccl");
#endif
  return out;
}

std::string WhyUnavailable(const std::string& backend, int world) {
#ifndef BATON_TEST_WITHOUT_GLOO
  if (backend == "gloo") return "";
#endif
  (void)world;  // used by the CUDA build only
#ifdef BATON_TEST_WITH_NCCL
  if (backend == "nccl") {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    if (count < world) {
      return absl::StrCat("nccl needs ", world, " GPUs (one per rank), found ", count);
    }
    return "";
  }
#endif
  return absl::StrCat("backend ", backend, " is not compiled in this build");
}

BackendFactory FactoryFor(const std::string& backend) {
#ifdef BATON_TEST_WITH_NCCL
  if (backend == "nccl") return NcclBackendFactory();
#endif
  (void)backend;
#ifndef BATON_TEST_WITHOUT_GLOO
  return GlooBackendFactory();
#else
  return nullptr;
#endif
}

at::Device Worker::device() const {
  if (backend == "nccl") return at::Device(at::kCUDA, rank);
  return at::Device(at::kCPU);
}

ProcessGroup Worker::MakeGroup(GroupOptions options) const {
  absl::StatusOr<ProcessGroup> pg =
      ProcessGroup::Create(store, rank, world, FactoryFor(backend), options);
  WCHECK_OK(pg.status());
  return *pg;
}

void Worker::Finish() {
  WCHECK_OK(store::Barrier(*store, "test/finish", rank, world, absl::Seconds(60)));
  // Rank 0 serves the store: it leaves last, once everyone has seen the
  // barrier complete.
  if (rank != 0) {
    WCHECK_OK(store->Set(absl::StrCat("test/left/", rank), "1"));
    return;
  }
  std::vector<std::string> keys;
  for (int r = 1; r < world; ++r) keys.push_back(absl::StrCat("test/left/", r));
  WCHECK_OK(store->Wait(keys, absl::Seconds(60)));
  if (server) server->Shutdown(absl::Seconds(1));
}

Worker StartWorker() {
  Worker w;
  w.rank = EnvInt("RANK", 0);
  w.world = EnvInt("WORLD_SIZE", 1);
  if (const char* b = std::getenv("BATON_TEST_BACKEND")) w.backend = b;
  const std::string host = std::getenv("MASTER_ADDR") ? std::getenv("MASTER_ADDR") : "127.0.0.1";
  const std::string address = absl::StrCat(host, ":", EnvInt("MASTER_PORT", 29500));
  if (w.rank == 0) {
    auto server = store::StoreServer::Start({address, ""});
    WCHECK_OK(server.status());
    w.server = *std::move(server);
  }
  store::StoreClientOptions options;
  options.address = address;
  options.call_timeout = absl::Seconds(30);
  w.store = std::make_shared<store::StoreClient>(options);
  return w;
}

std::map<std::string, std::string> BackendEnv(const std::string& backend) {
  return {{"BATON_TEST_BACKEND", backend}};
}

}  // namespace baton::comm::testing
