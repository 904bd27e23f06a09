// Optimizers from Python: baton._C.FunctionalOptimizer, HostedOptimizer
// and torch.optim's options as baton's (bindings.h).
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "dist_optim/functional_optimizer.h"
#include "python/src/bindings.h"
#include "python/src/hosted_optimizer.h"

namespace baton::python {

absl::StatusOr<dist_optim::OptimizerOptions> OptimizerOptionsFrom(const std::string& kind,
                                                                  const py::dict& kwargs) {
  using dist_optim::OptimizerOptions;
  OptimizerOptions o;
  const double lr = kwargs.contains("lr") ? kwargs["lr"].cast<double>() : -1;
  if (kind == "SGD") {
    if (lr < 0) return absl::InvalidArgumentError("SGD needs lr");
    o = OptimizerOptions::SGD(lr);
  } else if (kind == "Adam") {
    o = OptimizerOptions::Adam(lr < 0 ? 1e-3 : lr);
  } else if (kind == "AdamW") {
    o = OptimizerOptions::AdamW(lr < 0 ? 1e-3 : lr);
  } else if (kind == "Adagrad") {
    o = OptimizerOptions::Adagrad(lr < 0 ? 1e-2 : lr);
  } else if (kind == "RMSprop") {
    o = OptimizerOptions::RMSprop(lr < 0 ? 1e-2 : lr);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown optimizer ", kind));
  }
  for (auto item : kwargs) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (key == "lr") continue;
    if (key == "momentum")
      o.momentum = v.cast<double>();
    else if (key == "dampening")
      o.dampening = v.cast<double>();
    else if (key == "nesterov")
      o.nesterov = v.cast<bool>();
    else if (key == "weight_decay")
      o.weight_decay = v.cast<double>();
    else if (key == "betas") {
      auto b = v.cast<std::pair<double, double>>();
      o.beta1 = b.first;
      o.beta2 = b.second;
    } else if (key == "eps")
      o.eps = v.cast<double>();
    else if (key == "amsgrad")
      o.amsgrad = v.cast<bool>();
    else if (key == "lr_decay")
      o.lr_decay = v.cast<double>();
    else if (key == "initial_accumulator_value")
      o.initial_accumulator_value = v.cast<double>();
    else if (key == "alpha")
      o.alpha = v.cast<double>();
    else if (key == "centered")
      o.centered = v.cast<bool>();
    else if ((key == "maximize" || key == "foreach" || key == "capturable" ||
              key == "differentiable" || key == "fused") &&
             (v.is_none() || !v.cast<bool>())) {
      continue;  // torch's flags at their defaults change nothing
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(kind, " has no option '", key, "' that baton supports"));
    }
  }
  RETURN_IF_ERROR(dist_optim::ValidateOptions(o));
  return o;
}

void BindOptimizers(py::module_& m) {
  py::class_<baton::dist_optim::FunctionalOptimizer>(m, "FunctionalOptimizer")
      .def(py::init(
          [](const std::string& kind, const py::dict& kwargs, std::vector<at::Tensor> params) {
            auto o = OptimizerOptionsFrom(kind, kwargs);
            Check(o.status());
            auto opt = baton::dist_optim::FunctionalOptimizer::Create(*o, std::move(params));
            Check(opt.status());
            return *std::move(opt);
          }))
      .def("step",
           [](baton::dist_optim::FunctionalOptimizer& o,
              const std::vector<std::optional<at::Tensor>>& maybe_grads) {
             // None: no gradient for that parameter (an undefined tensor).
             std::vector<at::Tensor> grads;
             grads.reserve(maybe_grads.size());
             for (const auto& g : maybe_grads) grads.push_back(g.has_value() ? *g : at::Tensor());
             absl::Status s;
             {
               py::gil_scoped_release nogil;
               s = o.Step(grads);
             }
             Check(s);
           })
      .def("options", [](const baton::dist_optim::FunctionalOptimizer& o) {
        return o.options().DebugString();
      });

  // An optimizer hosted for a DistributedOptimizer (python/src/hosted_optimizer.h).
  py::class_<HostedOptimizer, std::shared_ptr<HostedOptimizer>>(m, "HostedOptimizer")
      .def(py::init([](PyAgent& a, const std::string& key, const std::string& kind,
                       const py::dict& kwargs, std::vector<at::Tensor> params) {
        auto o = OptimizerOptionsFrom(kind, kwargs);
        Check(o.status());
        auto hosted = HostedOptimizer::Create(a.runtime(), key, *o, std::move(params));
        Check(hosted.status());
        return *std::move(hosted);
      }))
      .def("step", [](HostedOptimizer& o, int64_t context_id) {
        absl::Status s;
        {
          py::gil_scoped_release nogil;
          s = o.Step(context_id);
        }
        Check(s);
      });
  m.attr("OPTIMIZER_STEP") = py::make_tuple(kOptimizerStep.name(), kOptimizerStep.signature());
}

}  // namespace baton::python
