// The extension module baton._C: a thin binding of baton's public C++ API
// (rpc/agent.h, rref/rref.h, dist_autograd/dist_autograd.h,
// dist_optim/functional_optimizer.h) for the Python package in
// python/baton/. Python semantics (torch.distributed.rpc's API, pickling,
// exception classes) live in the Python modules; this file only moves
// values across and manages the GIL:
// - every call that may block (a wait, a call that may meet a full flow
//   control window, start-up, shutdown, backward) releases the GIL;
// - Python code run by the runtime (user functions, future callbacks)
//   takes the GIL on the executor thread that runs it, and only for as long
//   as Python runs.
// Errors cross as baton._C.StatusError(code, message), code being the
// absl::StatusCode number; baton/_errors.py maps them to exception classes.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/utils/pybind.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/functional_optimizer.h"
#include "dist_optim/optimizer_options.h"
#include "python/src/cpp_call.h"
#include "python/src/py_value.h"
#include "rpc/agent.h"
#include "rref/rref.h"

namespace baton::python {
namespace {

using rpc::Future;
using rpc::Promise;

// The one remote function every Python call goes through: the pickled
// (function, args, kwargs) in, the function's result out.
const rpc::Function<PyObj(PyObj)> kPyCall("__baton.py.call");

PyObject* g_status_error = nullptr;  // baton._C.StatusError, set at import

[[noreturn]] void Raise(const absl::Status& s) {
  py::gil_scoped_acquire gil;
  PyErr_SetObject(g_status_error,
                  py::make_tuple(static_cast<int>(s.code()), std::string(s.message())).ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

absl::Duration Seconds(std::optional<double> s, absl::Duration fallback) {
  if (!s.has_value()) return fallback;
  if (*s <= 0) return absl::InfiniteDuration();
  return absl::Seconds(*s);
}

// A value handed to Python: (True, obj) for a live object, (False, (bytes,
// [Tensor], [RRef])) for pickled parts that the Python layer unpickles.
py::object ToPython(const PyObj& v) {
  if (v.live.valid()) return py::make_tuple(true, v.live.get());
  py::list tensors;
  for (const at::Tensor& t : v.tensors) tensors.append(py::cast(t));
  py::list rrefs;
  for (const auto& r : v.rrefs) rrefs.append(py::cast(r));
  return py::make_tuple(false, py::make_tuple(py::bytes(v.pickle), tensors, rrefs));
}

PyObj FromParts(py::bytes pickle, const std::vector<at::Tensor>& tensors,
                const std::vector<rref::RRef<PyObj>>& rrefs) {
  PyObj v;
  v.pickle = pickle;
  v.tensors = tensors;
  v.rrefs = rrefs;
  return v;
}

// Dropping a baton object can send messages and wait for room in a peer's
// flow-control window (an RRef's deletion), and a runtime thread that drops
// a tensor Python has seen takes the GIL: so no baton object is destroyed
// while its thread holds the GIL.
template <typename T>
struct ReleaseGilDelete {
  void operator()(T* p) const {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      delete p;
    } else {
      delete p;
    }
  }
};

// ---- Futures ----

class PyFuture {
 public:
  explicit PyFuture(Future<PyObj> f, std::optional<Promise<PyObj>> p = std::nullopt)
      : future_(std::move(f)), promise_(std::move(p)) {}
  // A future completed from Python (torch.futures.Future()).
  static std::shared_ptr<PyFuture> Make() {
    Promise<PyObj> p;
    return New(p.future(), p);
  }
  static std::shared_ptr<PyFuture> New(Future<PyObj> f,
                                       std::optional<Promise<PyObj>> p = std::nullopt) {
    return std::shared_ptr<PyFuture>(new PyFuture(std::move(f), std::move(p)),
                                     ReleaseGilDelete<PyFuture>());
  }

  bool done() const { return future_.ready(); }

  // The value; raises StatusError. timeout None or <= 0: no limit of its own
  // (an RPC's future completes by its deadline).
  py::object Wait(std::optional<double> timeout) const {
    {
      py::gil_scoped_release nogil;
      if (!future_.WaitFor(Seconds(timeout, absl::InfiniteDuration()))) {
        Raise(absl::DeadlineExceededError(
            absl::StrCat("future not complete after ", *timeout, " s")));
      }
    }
    const auto& r = future_.result();
    if (!r.ok()) Raise(r.status());
    return ToPython(*r);
  }

  // (code, message) of a failed future, None if it succeeded or is pending.
  py::object Error() const {
    if (!future_.ready()) return py::none();
    const auto& r = future_.result();
    if (r.ok()) return py::none();
    return py::make_tuple(static_cast<int>(r.status().code()), std::string(r.status().message()));
  }

  // fn() runs under the GIL once the future completes (on the agent's
  // executor for RPC futures); its result completes the returned future.
  std::shared_ptr<PyFuture> Then(py::function fn) const {
    PyRef callback(std::move(fn));
    Future<PyObj> next = future_.Then([callback](const Future<PyObj>&) -> absl::StatusOr<PyObj> {
      py::gil_scoped_acquire gil;
      try {
        PyObj out;
        out.live = PyRef(callback.get()());
        return out;
      } catch (py::error_already_set& e) {
        return StatusFromPython(e, "a future's callback");
      }
    });
    return PyFuture::New(std::move(next));
  }

  bool SetResult(py::object value) {
    CheckPromise("set_result");
    PyObj v;
    v.live = PyRef(std::move(value));
    py::gil_scoped_release nogil;  // callbacks may run here and take the GIL
    return promise_->SetValue(std::move(v));
  }
  bool SetError(int code, const std::string& message) {
    CheckPromise("set_exception");
    py::gil_scoped_release nogil;
    return promise_->SetError(absl::Status(static_cast<absl::StatusCode>(code), message));
  }

  const Future<PyObj>& future() const { return future_; }

 private:
  void CheckPromise(const char* what) const {
    if (!promise_.has_value()) {
      Raise(absl::FailedPreconditionError(
          absl::StrCat(what, "() on a future returned by an RPC: only a Future() made by the "
                             "user can be completed by hand")));
    }
  }
  Future<PyObj> future_;
  std::optional<Promise<PyObj>> promise_;
};

// ---- RRefs ----

using PyRRef = rref::RRef<PyObj>;

// ---- The agent ----

struct AgentConfig {
  std::string name;
  // tcp://host:port in init_method, in front of MASTER_ADDR and MASTER_PORT.
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<double> rpc_timeout;
  std::optional<double> init_timeout;
  std::optional<double> shutdown_timeout;
  // <= 0: no limit while the missing workers live (torch's shutdown()).
  std::optional<double> shutdown_wait_for_peers;
  std::optional<int> parallelism;
  std::optional<double> restart_wait;
};

class PyAgent {
 public:
  // dumps(obj) -> (bytes, [Tensor], [RRef]); run(bytes, tensors, rrefs,
  // caller) -> (is_async, value or Future).
  static std::shared_ptr<PyAgent> Create(const AgentConfig& config, py::function dumps,
                                         py::function run) {
    auto lookup = [&config](absl::string_view var) -> std::optional<std::string> {
      if (var == baton::kEnvRank && config.rank.has_value()) return std::to_string(*config.rank);
      if (var == baton::kEnvWorldSize && config.world_size.has_value()) {
        return std::to_string(*config.world_size);
      }
      if (var == "BATON_WORKER_NAME" && !config.name.empty()) return config.name;
      if (var == baton::kEnvMasterAddr && config.master_addr.has_value()) {
        return *config.master_addr;
      }
      if (var == baton::kEnvMasterPort && config.master_port.has_value()) {
        return std::to_string(*config.master_port);
      }
      const char* v = std::getenv(std::string(var).c_str());
      if (v == nullptr) return std::nullopt;
      return std::string(v);
    };
    auto options = rpc::AgentOptions::FromEnv("worker", lookup);
    if (!options.ok()) Raise(Annotate(options.status(), "init_rpc"));
    if (config.rpc_timeout.has_value()) {
      options->rpc_timeout = Seconds(config.rpc_timeout, options->rpc_timeout);
    }
    if (config.init_timeout.has_value()) {
      options->init_timeout = Seconds(config.init_timeout, options->init_timeout);
    }
    if (config.shutdown_timeout.has_value()) {
      options->shutdown_timeout = Seconds(config.shutdown_timeout, options->shutdown_timeout);
    }
    if (config.shutdown_wait_for_peers.has_value()) {
      options->shutdown_wait_for_peers =
          Seconds(config.shutdown_wait_for_peers, absl::InfiniteDuration());
    }
    if (config.parallelism.has_value()) options->parallelism = *config.parallelism;
    if (config.restart_wait.has_value()) {
      options->restart_wait = absl::Seconds(*config.restart_wait);
    }

    auto self = std::shared_ptr<PyAgent>(new PyAgent());
    self->registry_ = std::make_shared<rpc::FunctionRegistry>();
    auto runtime = std::make_shared<PyRuntime>();
    runtime->dumps = PyRef(std::move(dumps));
    self->registry_->SetExtension(runtime);
    self->rrefs_ = rref::RRefService::Install(*self->registry_);
    Check(dist_autograd::Install(*self->registry_));
    PyRef runner(std::move(run));
    Check(self->registry_->Register(
        kPyCall, [runner](const rpc::CallContext& ctx, PyObj msg) -> Future<PyObj> {
          return RunPython(runner, ctx, std::move(msg));
        }));
    absl::StatusOr<std::unique_ptr<rpc::RpcAgent>> agent;
    {
      py::gil_scoped_release nogil;
      agent = rpc::RpcAgent::Create(*options, self->registry_);
    }
    Check(agent.status());
    self->agent_ = *std::move(agent);
    self->rrefs_->Attach(self->agent_.get());
    return self;
  }

  ~PyAgent() {
    // Threads of the agent may wait for the GIL: let them finish.
    py::gil_scoped_release nogil;
    agent_.reset();
  }

  rpc::RpcAgent& agent() const {
    if (agent_ == nullptr) Raise(absl::FailedPreconditionError("the RPC agent is shut down"));
    return *agent_;
  }

  std::shared_ptr<PyFuture> Call(const py::object& to, py::bytes pickle,
                                 const std::vector<at::Tensor>& tensors,
                                 const std::vector<PyRRef>& rrefs,
                                 std::optional<double> timeout) {
    rpc::RpcAgent& a = agent();
    const rpc::WorkerRef ref = Ref(to);
    PyObj msg = FromParts(pickle, tensors, rrefs);
    rpc::CallOptions opts{Seconds(timeout, absl::ZeroDuration())};
    py::gil_scoped_release nogil;
    return PyFuture::New(a.rpc_async(opts, ref, kPyCall, std::move(msg)));
  }

  PyRRef Remote(const py::object& to, py::bytes pickle, const std::vector<at::Tensor>& tensors,
                const std::vector<PyRRef>& rrefs, std::optional<double> timeout) {
    rpc::RpcAgent& a = agent();
    const rpc::WorkerRef ref = Ref(to);
    PyObj msg = FromParts(pickle, tensors, rrefs);
    rpc::CallOptions opts{Seconds(timeout, absl::ZeroDuration())};
    py::gil_scoped_release nogil;
    try {
      return rref::remote(a, opts, ref, kPyCall, std::move(msg));
    } catch (const Error& e) {
      Raise(e.status());
    }
  }

  // A function registered in C++ (rpc/function.h), called by name with its
  // signature ("(Tensor,int64)->Tensor"); see python/src/cpp_call.h.
  std::shared_ptr<PyFuture> CallCpp(const py::object& to, const std::string& function,
                                    const std::string& signature, const py::object& args,
                                    std::optional<double> timeout) {
    rpc::RpcAgent& a = agent();
    auto sig = Signature::Parse(signature);
    Check(sig.status());
    auto worker = a.worker(Ref(to));
    Check(Annotate(worker.status(), absl::StrCat("call of C++ function '", function, "'")));
    auto payload = EncodeCall(a, worker->id, function, *sig, args);
    Check(payload.status());
    auto shared_sig = std::make_shared<const Signature>(*std::move(sig));
    rpc::CallOptions opts{Seconds(timeout, absl::ZeroDuration())};
    Future<rpc::Payload> raw;
    {
      py::gil_scoped_release nogil;
      raw = a.CallRaw(worker->id, function, shared_sig->text, *std::move(payload), opts);
    }
    rpc::RpcAgent* ap = &a;
    const int peer = worker->id;
    Future<PyObj> out = raw.Then(
        [ap, peer, function, shared_sig](const Future<rpc::Payload>& f) -> absl::StatusOr<PyObj> {
          const auto& r = f.result();
          if (!r.ok()) return r.status();
          DynValue v;
          std::deque<at::Tensor> tensors;
          absl::Status s = DecodeResult(*ap, peer, function, *shared_sig, *r, &v, &tensors);
          if (!s.ok()) return s;
          py::gil_scoped_acquire gil;
          PyObj o;
          o.live = PyRef(ToPython(v, tensors));
          return o;
        });
    return PyFuture::New(std::move(out));
  }

  PyRRef MakeOwned(py::object value) {
    PyObj v;
    v.live = PyRef(std::move(value));
    return rref::MakeOwned(agent(), std::move(v));
  }

  py::tuple Self() const { return Info(agent().self()); }
  py::tuple Worker(const py::object& to) const {
    auto w = agent().worker(Ref(to));
    Check(w.status());
    return Info(*w);
  }
  py::list Workers() const {
    py::list out;
    for (const auto& w : agent().workers()) out.append(Info(w));
    return out;
  }
  int64_t Incarnation() const { return agent().incarnation(); }

  void Shutdown(bool graceful) {
    if (agent_ == nullptr) return;
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = agent_->Shutdown(graceful);
      agent_.reset();
    }
    Check(s);
  }

  // What every owner table holds (tests).
  py::dict RRefState() const {
    rref::RRefDebugState st = rrefs_->DebugState();
    py::dict d;
    d["owned"] = st.owned.size();
    d["held"] = st.held.size();
    d["early"] = st.early_entries;
    d["unanswered"] = st.unanswered_messages;
    d["text"] = st.ToString();
    return d;
  }
  void WaitRRefsEmpty(double timeout) const {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = rrefs_->WaitUntilEmpty(absl::Seconds(timeout));
    }
    Check(s);
  }
  py::dict Stats() const {
    rpc::AgentStats s = agent().stats();
    py::dict d;
    d["pending_outgoing"] = s.pending_outgoing;
    d["running_incoming"] = s.running_incoming;
    d["executor_threads"] = s.executor_threads;
    d["shm_frames_sent"] = s.shm_frames_sent;
    d["peer_failures"] = s.peer_failures;
    return d;
  }
  bool UsesShm(int peer) const { return agent().uses_shm(peer); }

 private:
  PyAgent() = default;

  static rpc::WorkerRef Ref(const py::object& to) {
    if (py::isinstance<py::str>(to)) return rpc::WorkerRef(to.cast<std::string>());
    if (py::isinstance<py::int_>(to)) return rpc::WorkerRef(to.cast<int>());
    Raise(absl::InvalidArgumentError(
        absl::StrCat("a worker is named by its name, rank or WorkerInfo, not by a ",
                     std::string(py::str(to.get_type().attr("__name__"))))));
  }
  static py::tuple Info(const rpc::WorkerInfo& w) { return py::make_tuple(w.name, w.id); }

  static Future<PyObj> RunPython(const PyRef& runner, const rpc::CallContext& ctx, PyObj msg) {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) {
      return rpc::MakeErrorFuture<PyObj>(
          absl::UnavailableError("the Python interpreter of this worker is shutting down"));
    }
    py::gil_scoped_acquire gil;
    try {
      py::object caller = ctx.caller != nullptr ? py::object(py::str(ctx.caller->name))
                                                : py::object(py::none());
      py::list tensors;
      for (at::Tensor& t : msg.tensors) tensors.append(py::cast(std::move(t)));
      py::list rrefs;
      for (auto& r : msg.rrefs) rrefs.append(py::cast(std::move(r)));
      py::tuple out = runner.get()(py::bytes(msg.pickle), tensors, rrefs, caller);
      if (out[0].cast<bool>()) {
        return out[1].cast<std::shared_ptr<PyFuture>>()->future();
      }
      PyObj v;
      v.live = PyRef(out[1]);
      return rpc::MakeReadyFuture<PyObj>(std::move(v));
    } catch (py::error_already_set& e) {
      return rpc::MakeErrorFuture<PyObj>(StatusFromPython(e, ""));
    } catch (const std::exception& e) {
      return rpc::MakeErrorFuture<PyObj>(absl::UnknownError(e.what()));
    }
  }

  std::shared_ptr<rpc::FunctionRegistry> registry_;
  std::shared_ptr<rref::RRefService> rrefs_;
  std::unique_ptr<rpc::RpcAgent> agent_;
};

// ---- Distributed autograd ----

class PyAutogradContext {
 public:
  explicit PyAutogradContext(std::shared_ptr<PyAgent> agent)
      : agent_(std::move(agent)),
        context_(std::make_unique<dist_autograd::Context>(agent_->agent())) {}
  int64_t id() const { return context_->id(); }
  void Release() {
    py::gil_scoped_release nogil;
    context_.reset();
  }

 private:
  std::shared_ptr<PyAgent> agent_;
  std::unique_ptr<dist_autograd::Context> context_;
};

absl::StatusOr<dist_optim::OptimizerOptions> OptionsFrom(const std::string& kind,
                                                         const py::dict& kw) {
  using dist_optim::OptimizerOptions;
  OptimizerOptions o;
  const double lr = kw.contains("lr") ? kw["lr"].cast<double>() : -1;
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
  for (auto item : kw) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (key == "lr") continue;
    if (key == "momentum") o.momentum = v.cast<double>();
    else if (key == "dampening") o.dampening = v.cast<double>();
    else if (key == "nesterov") o.nesterov = v.cast<bool>();
    else if (key == "weight_decay") o.weight_decay = v.cast<double>();
    else if (key == "betas") {
      auto b = v.cast<std::pair<double, double>>();
      o.beta1 = b.first;
      o.beta2 = b.second;
    } else if (key == "eps") o.eps = v.cast<double>();
    else if (key == "amsgrad") o.amsgrad = v.cast<bool>();
    else if (key == "lr_decay") o.lr_decay = v.cast<double>();
    else if (key == "initial_accumulator_value") o.initial_accumulator_value = v.cast<double>();
    else if (key == "alpha") o.alpha = v.cast<double>();
    else if (key == "centered") o.centered = v.cast<bool>();
    else if ((key == "maximize" || key == "foreach" || key == "capturable" ||
              key == "differentiable" || key == "fused") &&
             (v.is_none() || !v.cast<bool>())) {
      continue;  // torch's flags at their defaults change nothing
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(kind, " has no option '", key, "' that baton supports"));
    }
  }
  absl::Status s = dist_optim::ValidateOptions(o);
  if (!s.ok()) return s;
  return o;
}

}  // namespace
}  // namespace baton::python

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using namespace baton::python;  // NOLINT
  m.doc() = "baton's C++ runtime (see baton.rpc for the API)";

  static py::exception<std::runtime_error> status_error(m, "StatusError");
  g_status_error = status_error.ptr();

  py::class_<PyFuture, std::shared_ptr<PyFuture>>(m, "Future")
      .def(py::init(&PyFuture::Make))
      .def("done", &PyFuture::done)
      .def("wait", &PyFuture::Wait, py::arg("timeout") = py::none())
      .def("error", &PyFuture::Error)
      .def("then", &PyFuture::Then)
      .def("set_result", &PyFuture::SetResult)
      .def("set_error", &PyFuture::SetError);

  py::class_<PyRRef, std::unique_ptr<PyRRef, ReleaseGilDelete<PyRRef>>>(m, "RRef")
      .def("is_owner", &PyRRef::is_owner)
      .def("owner_id", &PyRRef::owner_id)
      .def("id", &PyRRef::id)
      .def("confirmed_by_owner",
           [](const PyRRef& r) { return r.handle()->confirmed_by_owner(); })
      .def("created",
           [](const PyRRef& r) {
             // Future<void> as a PyFuture whose value is None.
             Promise<PyObj> p;
             r.created().OnReady([p](const absl::StatusOr<std::monostate>& s) {
               if (!s.ok()) {
                 p.SetError(s.status());
               } else {
                 p.SetValue(PyObj());
               }
             });
             return PyFuture::New(p.future());
           })
      .def("to_here",
           [](const PyRRef& r, std::optional<double> timeout) {
             py::gil_scoped_release nogil;
             try {
               return PyFuture::New(
                   r.to_here_async(Seconds(timeout, absl::ZeroDuration())));
             } catch (const baton::Error& e) {
               Raise(e.status());
             }
           },
           py::arg("timeout") = py::none())
      .def("local_value", [](const PyRRef& r) {
        std::shared_ptr<PyObj> v;
        {
          py::gil_scoped_release nogil;
          try {
            v = r.local_value();
          } catch (const baton::Error& e) {
            Raise(e.status());
          }
        }
        return ToPython(*v);
      });

  py::class_<AgentConfig>(m, "AgentConfig")
      .def(py::init<>())
      .def_readwrite("name", &AgentConfig::name)
      .def_readwrite("rank", &AgentConfig::rank)
      .def_readwrite("master_addr", &AgentConfig::master_addr)
      .def_readwrite("master_port", &AgentConfig::master_port)
      .def_readwrite("world_size", &AgentConfig::world_size)
      .def_readwrite("rpc_timeout", &AgentConfig::rpc_timeout)
      .def_readwrite("init_timeout", &AgentConfig::init_timeout)
      .def_readwrite("shutdown_timeout", &AgentConfig::shutdown_timeout)
      .def_readwrite("shutdown_wait_for_peers", &AgentConfig::shutdown_wait_for_peers)
      .def_readwrite("parallelism", &AgentConfig::parallelism)
      .def_readwrite("restart_wait", &AgentConfig::restart_wait);

  py::class_<PyAgent, std::shared_ptr<PyAgent>>(m, "Agent")
      .def_static("create", &PyAgent::Create)
      .def("call", &PyAgent::Call)
      .def("remote", &PyAgent::Remote)
      .def("make_owned", &PyAgent::MakeOwned)
      .def("call_cpp", &PyAgent::CallCpp)
      .def("self_info", &PyAgent::Self)
      .def("worker", &PyAgent::Worker)
      .def("workers", &PyAgent::Workers)
      .def("incarnation", &PyAgent::Incarnation)
      .def("shutdown", &PyAgent::Shutdown)
      .def("rref_state", &PyAgent::RRefState)
      .def("wait_rrefs_empty", &PyAgent::WaitRRefsEmpty)
      .def("stats", &PyAgent::Stats)
      .def("uses_shm", &PyAgent::UsesShm)
      .def("autograd_context",
           [](std::shared_ptr<PyAgent> a) {
             return std::shared_ptr<PyAutogradContext>(new PyAutogradContext(std::move(a)),
                                                       ReleaseGilDelete<PyAutogradContext>());
           })
      .def("backward",
           [](PyAgent& a, int64_t context_id, const std::vector<at::Tensor>& roots,
              bool retain_graph, std::optional<double> timeout) {
             baton::rpc::RpcAgent& agent = a.agent();
             absl::Status s;
             {
               py::gil_scoped_release nogil;
               s = baton::dist_autograd::Backward(agent, context_id, roots, retain_graph,
                                                  Seconds(timeout, absl::ZeroDuration()));
             }
             Check(s);
           })
      .def("get_gradients",
           [](PyAgent& a, int64_t context_id) {
             auto g = baton::dist_autograd::GetGradients(a.agent(), context_id);
             Check(g.status());
             return g->items();
           })
      .def("current_context_id",
           [](PyAgent& a) { return baton::dist_autograd::CurrentContextId(a.agent()); });

  py::class_<PyAutogradContext, std::shared_ptr<PyAutogradContext>>(m, "AutogradContext")
      .def("id", &PyAutogradContext::id)
      .def("release", &PyAutogradContext::Release);

  py::class_<baton::dist_optim::FunctionalOptimizer>(m, "FunctionalOptimizer")
      .def(py::init([](const std::string& kind, const py::dict& kwargs,
                       std::vector<at::Tensor> params) {
        auto o = OptionsFrom(kind, kwargs);
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

  m.attr("PYTHON_ERROR_PREFIX") = kPythonErrorPrefix;
  m.def("canonical_signature", [](const std::string& text) {
    auto sig = Signature::Parse(text);
    Check(sig.status());
    return sig->text;
  });
}
