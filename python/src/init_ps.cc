// The parameter server from Python: baton._C.PsServerHost and PsClient,
// with the specs python/baton/ps.py builds as dicts (bindings.h).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "ps/client.h"
#include "ps/server.h"
#include "ps/spec.h"
#include "python/src/binding.h"
#include "python/src/bindings.h"
#include "python/src/py_agent.h"
#include "python/src/py_future.h"

namespace baton::python {
namespace {

c10::ScalarType DtypeOf(py::handle h) {
  if (!THPDtype_Check(h.ptr())) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("a dtype is a torch.dtype, not ", std::string(py::repr(h)))));
  }
  return reinterpret_cast<THPDtype*>(h.ptr())->scalar_type;
}

ps::PsSpec SpecFrom(const py::dict& d) {
  ps::PsSpec spec;
  for (py::handle th : d["tables"].cast<py::list>()) {
    py::dict t = py::reinterpret_borrow<py::dict>(th);
    const std::string name = t["name"].cast<std::string>();
    const std::string kind = t["kind"].cast<std::string>();
    if (kind == "dense") {
      py::tuple opt = t["optimizer"].cast<py::tuple>();
      auto o = OptimizerOptionsFrom(opt[0].cast<std::string>(), opt[1].cast<py::dict>());
      if (!o.ok()) Raise(Annotate(o.status(), absl::StrCat("ps table '", name, "'")));
      spec.tables.push_back(ps::TableSpec::Dense(name, t["shape"].cast<std::vector<int64_t>>(),
                                                 DtypeOf(t["dtype"]), *o));
    } else {
      py::tuple init = t["init"].cast<py::tuple>();
      const std::string ik = init[0].cast<std::string>();
      ps::RowInit ri =
          ik == "uniform"  ? ps::RowInit::Uniform(init[1].cast<double>(), init[2].cast<uint64_t>())
          : ik == "normal" ? ps::RowInit::Normal(init[1].cast<double>(), init[2].cast<uint64_t>())
                           : ps::RowInit::Zeros();
      py::tuple opt = t["optimizer"].cast<py::tuple>();
      const std::string ok = opt[0].cast<std::string>();
      const double lr = opt[1].cast<double>();
      ps::RowOptimizer ro = ok == "adagrad"           ? ps::RowOptimizer::Adagrad(lr)
                            : ok == "rowwise_adagrad" ? ps::RowOptimizer::RowWiseAdagrad(lr)
                            : ok == "lazy_adam"       ? ps::RowOptimizer::LazyAdam(lr)
                                                      : ps::RowOptimizer::SGD(lr);
      spec.tables.push_back(ps::TableSpec::Embedding(
          name, t["rows"].cast<int64_t>(), t["dim"].cast<int64_t>(), ri, ro, DtypeOf(t["dtype"])));
    }
  }
  py::tuple c = d["consistency"].cast<py::tuple>();
  const std::string mode = c[0].cast<std::string>();
  spec.consistency = mode == "sync"    ? ps::Consistency::Sync()
                     : mode == "async" ? ps::Consistency::Async()
                                       : ps::Consistency::BoundedStaleness(c[1].cast<int64_t>());
  spec.num_trainers = d["num_trainers"].cast<int>();
  spec.trainer_timeout = absl::Seconds(d["trainer_timeout"].cast<double>());
  spec.straggler_policy = d["straggler_policy"].cast<std::string>() == "fail"
                              ? ps::StragglerPolicy::kFail
                              : ps::StragglerPolicy::kDrop;
  Check(ps::ValidateSpec(spec));
  return spec;
}

// A parameter server hosted by this Python worker.
class PsServerHost : public RegistryInstaller {
 public:
  PsServerHost(const py::dict& spec, int server, int num_servers, const std::string& checkpoint_dir,
               int64_t checkpoint_every_clocks)
      : spec_(SpecFrom(spec)) {
    options_.server = server;
    options_.num_servers = num_servers;
    options_.checkpoint_dir = checkpoint_dir;
    options_.checkpoint_every_clocks = checkpoint_every_clocks;
  }
  absl::Status Install(rpc::FunctionRegistry& registry) override {
    if (server_ != nullptr) return absl::FailedPreconditionError("this PsServer already serves");
    ASSIGN_OR_RETURN(server_, ps::PsServer::Create(spec_, options_, registry));
    return absl::OkStatus();
  }
  absl::Status Stop() override { return server_ == nullptr ? absl::OkStatus() : server_->Stop(); }
  std::string Stats() {
    if (server_ == nullptr) Raise(absl::FailedPreconditionError("the PsServer is not serving"));
    return server_->shard().Stats().DebugString();
  }
  int64_t RestoredClock() const { return server_ == nullptr ? -1 : server_->restored_clock(); }

 private:
  ps::PsSpec spec_;
  ps::ServerOptions options_;
  std::unique_ptr<ps::PsServer> server_;
};

// A trainer's client of the parameter servers.
class PyPsClient {
 public:
  PyPsClient(std::shared_ptr<PyAgent> agent, const py::dict& spec, int trainer,
             std::vector<std::string> servers, double timeout)
      : agent_(std::move(agent)) {
    ps::PsClient::Options o;
    o.trainer = trainer;
    o.servers = std::move(servers);
    o.timeout = absl::Seconds(timeout);
    ps::PsSpec s = SpecFrom(spec);
    rpc::RpcAgent& a = agent_->agent();
    absl::StatusOr<std::unique_ptr<ps::PsClient>> client;
    {
      py::gil_scoped_release nogil;
      client = ps::PsClient::Create(a, std::move(s), o);
    }
    Check(client.status());
    client_ = *std::move(client);
  }

  void InitDense(const std::vector<std::string>& tables, const std::vector<at::Tensor>& values) {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->InitDense(tables, values);
    }
    Check(s);
  }
  std::shared_ptr<PyFuture> Pull(const std::string& table) {
    return Wrap(ReleasingGil([&] { return client_->Pull(table); }));
  }
  std::shared_ptr<PyFuture> PullDense(const std::vector<std::string>& tables) {
    return Wrap(ReleasingGil([&] { return client_->PullDense(tables); }));
  }
  std::shared_ptr<PyFuture> PullDenseInto(const std::vector<std::string>& tables,
                                          std::vector<at::Tensor> into) {
    return Wrap(ReleasingGil([&] { return client_->PullDenseInto(tables, std::move(into)); }));
  }
  std::shared_ptr<PyFuture> PullRows(const std::string& table, const at::Tensor& ids) {
    return Wrap(ReleasingGil([&] { return client_->PullRows(table, ids); }));
  }
  std::shared_ptr<PyFuture> Push(const std::string& table, const at::Tensor& grad, bool end_step) {
    return Wrap(ReleasingGil([&] { return client_->Push(table, grad, end_step); }));
  }
  std::shared_ptr<PyFuture> PushDense(const std::vector<std::string>& tables,
                                      const std::vector<at::Tensor>& grads, bool end_step) {
    return Wrap(ReleasingGil([&] { return client_->PushDense(tables, grads, end_step); }));
  }
  std::shared_ptr<PyFuture> PushRows(const std::string& table, const at::Tensor& ids,
                                     const at::Tensor& grads, bool end_step) {
    return Wrap(ReleasingGil([&] { return client_->PushRows(table, ids, grads, end_step); }));
  }
  std::shared_ptr<PyFuture> Step() {
    return Wrap(ReleasingGil([&] { return client_->Step(); }));
  }
  int64_t Clock() const { return client_->clock(); }
  std::vector<std::string> Stats() {
    absl::StatusOr<std::vector<ps::ShardStats>> st;
    {
      py::gil_scoped_release nogil;
      st = client_->Stats();
    }
    Check(st.status());
    std::vector<std::string> out;
    for (const auto& x : *st) out.push_back(x.DebugString());
    return out;
  }

 private:
  std::shared_ptr<PyAgent> agent_;  // outlives the client
  std::unique_ptr<ps::PsClient> client_;
};

}  // namespace

void BindPs(py::module_& m) {
  py::class_<PsServerHost, RegistryInstaller, std::shared_ptr<PsServerHost>>(m, "PsServerHost")
      .def(py::init<const py::dict&, int, int, const std::string&, int64_t>())
      .def("stats", &PsServerHost::Stats)
      .def("restored_clock", &PsServerHost::RestoredClock);
  py::class_<PyPsClient, std::shared_ptr<PyPsClient>>(m, "PsClient")
      .def(py::init<std::shared_ptr<PyAgent>, const py::dict&, int, std::vector<std::string>,
                    double>())
      .def("init_dense", &PyPsClient::InitDense)
      .def("pull", &PyPsClient::Pull)
      .def("pull_dense", &PyPsClient::PullDense)
      .def("pull_dense_into", &PyPsClient::PullDenseInto)
      .def("pull_rows", &PyPsClient::PullRows)
      .def("push", &PyPsClient::Push)
      .def("push_dense", &PyPsClient::PushDense)
      .def("push_rows", &PyPsClient::PushRows)
      .def("step", &PyPsClient::Step)
      .def("clock", &PyPsClient::Clock)
      .def("stats", &PyPsClient::Stats);
}

}  // namespace baton::python
