// Failing a torch.futures.Future with a Python exception, as torch's own
// RPC fails its futures: the error is the future's error (not a value that
// raises when read), so torch.futures.wait_all() and collect_all() return
// at the first failure, and wait() raises the exception with its own type.
//
// Thread-safety: call with the GIL held.
#ifndef BATON_PYTHON_SRC_TORCH_FUTURE_H_
#define BATON_PYTHON_SRC_TORCH_FUTURE_H_

#include <pybind11/pybind11.h>

namespace baton::python {

// Registers _C.fail_torch_future(future, exception) in `m`. TypeError if
// `future` is not a torch._C.Future, RuntimeError if it already completed.
void BindTorchFuture(pybind11::module_& m);

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_TORCH_FUTURE_H_
