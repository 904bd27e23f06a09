// baton._C.CartPole (bindings.h).
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "python/src/bindings.h"
#include "rl/cartpole.h"

namespace baton::python {

void BindRl(py::module_& m) {
  // rl/cartpole.h: CartPole-v1 with gym's exact dynamics, for Python RL
  // jobs (python/examples/rl_cartpole.py, the gymnasium stand-in).
  py::class_<baton::rl::CartPole>(m, "CartPole")
      .def(py::init<uint64_t>(), py::arg("seed"))
      .def("reset",
           [](baton::rl::CartPole& env) {
             auto o = env.Reset();
             return std::vector<float>(o.begin(), o.end());
           })
      .def("step",
           [](baton::rl::CartPole& env, int action) {
             auto r = env.Step(action);
             if (!r.ok()) {
               throw py::value_error(std::string(r.status().message()));
             }
             const auto& o = r->observation;
             return py::make_tuple(std::vector<float>(o.begin(), o.end()), r->reward, r->terminated,
                                   r->truncated);
           })
      .def_property_readonly("steps", &baton::rl::CartPole::steps)
      .def_property_readonly_static("max_steps",
                                    [](py::object) { return baton::rl::CartPole::kMaxSteps; });
}

}  // namespace baton::python
