// The part of torch's distributed-autograd container that drop-in mode uses
// (python/src/torch_agent.h): a context of torch's with a baton context's id,
// current on the thread that holds the baton context, so that TorchScript's
// forks and continuations carry the id to the threads they run on.
//
// pip's torch ships the container's header; Debian's libtorch-dev 1.13 does
// not, though its libtorch_cpu exports the class. Without the header, the
// few out-of-line members used are declared here as torch declares them
// (same names and parameters, so the same symbols); nothing reads the
// class's layout.
#ifndef BATON_PYTHON_SRC_TORCH_DIST_AUTOGRAD_H_
#define BATON_PYTHON_SRC_TORCH_DIST_AUTOGRAD_H_

#if __has_include(<torch/csrc/distributed/autograd/context/container.h>)
#include <torch/csrc/distributed/autograd/context/container.h>
#else
#include <cstdint>
#include <memory>

#include <c10/macros/Export.h>

namespace torch::distributed::autograd {

class DistAutogradContext;

class TORCH_API DistAutogradContainer {
 public:
  static DistAutogradContainer& getInstance();
  const std::shared_ptr<DistAutogradContext> getOrCreateContext(int64_t context_id);
  void releaseContextIfPresent(int64_t context_id);
  static void forceCurrentContextId(int64_t contextId);
  static int64_t currentContextId();

  DistAutogradContainer() = delete;
  DistAutogradContainer(const DistAutogradContainer&) = delete;
  DistAutogradContainer& operator=(const DistAutogradContainer&) = delete;
};

}  // namespace torch::distributed::autograd
#endif

#endif  // BATON_PYTHON_SRC_TORCH_DIST_AUTOGRAD_H_
