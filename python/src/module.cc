// The extension module baton._C: a thin binding of baton's public C++ API
// (rpc/agent.h, rref/rref.h, dist_autograd/dist_autograd.h,
// dist_optim/functional_optimizer.h, ps/client.h and ps/server.h,
// rl/cartpole.h; calls of C++ functions by signature in cpp_call.h) for the
// Python package in python/baton/. Python semantics (torch.distributed.rpc's API, pickling,
// exception classes) live in the Python modules; this file only moves
// values across and manages the GIL:
// - every call that may block (a wait, a call that may meet a full flow
//   control window, start-up, shutdown, backward) releases the GIL;
// - Python code run by the runtime (user functions, future callbacks)
//   takes the GIL on the executor thread that runs it, and only for as long
//   as Python runs.
// Errors cross as baton._C.StatusError(code, message), code being the
// absl::StatusCode number; baton/_errors.py maps them to exception classes.
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/functional_optimizer.h"
#include "dist_optim/optimizer_options.h"
#include "ps/client.h"
#include "ps/server.h"
#include "ps/spec.h"
#include "python/src/autograd_context.h"
#include "python/src/cpp_call.h"
#include "python/src/hosted_optimizer.h"
#include "python/src/profiler.h"
#include "python/src/py_value.h"
#include "python/src/torch_agent.h"
#include "python/src/torch_future.h"
#include "rl/cartpole.h"
#include "rpc/agent.h"
#include "rref/rref.h"
#ifdef BATON_PYTHON_CUDA_IPC
#include "rpc/cuda/ipc_channel.h"
#endif

namespace baton::python {
namespace {

using rpc::Future;
using rpc::Promise;

// The remote functions every Python call goes through: the pickled
// (function, args, kwargs) in, the function's result out. rpc_sync and
// rpc_async use kPyCall, whose result is pickled at once, under the GIL the
// call already holds; remote() uses kPyRemote, whose result stays a live
// object on its owner (local_value() returns that object).
const rpc::Function<PyObj(PyObj)> kPyCall("__baton.py.call");
const rpc::Function<PyObj(PyObj)> kPyRemote("__baton.py.remote");

// baton._C.StatusError, the module's exception type, set once at import
// (one per interpreter, like every Python exception class).
PyObject* g_status_error = nullptr;

[[noreturn]] void Raise(const absl::Status& s) {
  AcquireGil gil;
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
    if (!future_.ready()) {
      py::gil_scoped_release nogil;
      // A reply on one host often comes within microseconds: look again for
      // a short while before sleeping (a wake-up costs more than the call).
      const absl::Time spin_end = absl::Now() + absl::Microseconds(50);
      while (!future_.ready() && absl::Now() < spin_end) sched_yield();
      if (!future_.WaitFor(Seconds(timeout, absl::InfiniteDuration()))) {
        Raise(absl::DeadlineExceededError(
            absl::StrCat("future not complete after ", *timeout, " s")));
      }
    }
    const auto& r = future_.result();
    if (!r.ok()) Raise(r.status());
    return ToPython(*r);
  }

  // fn() runs under the GIL once the future completes (on the agent's
  // executor for RPC futures); its result completes the returned future.
  std::shared_ptr<PyFuture> Then(py::function fn) const {
    PyRef callback(std::move(fn));
    Future<PyObj> next = future_.Then([callback](const Future<PyObj>&) -> absl::StatusOr<PyObj> {
      AcquireGil gil;
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
          absl::StrCat(what,
                       "() on a future returned by an RPC: only a Future() made by the "
                       "user can be completed by hand")));
    }
  }
  Future<PyObj> future_;
  std::optional<Promise<PyObj>> promise_;
};

// ---- RRefs ----

using PyRRef = rref::RRef<PyObj>;

// ---- The agent ----

// Something installed on an agent's registry before the agent starts, and
// stopped once the agent stopped serving.
class RegistryInstaller {
 public:
  virtual ~RegistryInstaller() = default;
  virtual absl::Status Install(rpc::FunctionRegistry& registry) = 0;
  virtual absl::Status Stop() { return absl::OkStatus(); }
};

// ---- baton.ps: specs from the dicts python/baton/ps.py builds ----

c10::ScalarType DtypeOf(py::handle h) {
  if (!THPDtype_Check(h.ptr())) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("a dtype is a torch.dtype, not ", std::string(py::repr(h)))));
  }
  return reinterpret_cast<THPDtype*>(h.ptr())->scalar_type;
}

absl::StatusOr<dist_optim::OptimizerOptions> OptionsFrom(const std::string& kind,
                                                         const py::dict& kw);

ps::PsSpec SpecFrom(const py::dict& d) {
  ps::PsSpec spec;
  for (py::handle th : d["tables"].cast<py::list>()) {
    py::dict t = py::reinterpret_borrow<py::dict>(th);
    const std::string name = t["name"].cast<std::string>();
    const std::string kind = t["kind"].cast<std::string>();
    if (kind == "dense") {
      py::tuple opt = t["optimizer"].cast<py::tuple>();
      auto o = OptionsFrom(opt[0].cast<std::string>(), opt[1].cast<py::dict>());
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
    auto server = ps::PsServer::Create(spec_, options_, registry);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
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

struct AgentConfig {
  // Installed before the agent starts (a hosted PsServer).
  std::vector<std::shared_ptr<RegistryInstaller>> installers;
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
  // TensorPipeRpcBackendOptions.device_maps, as CUDA device indexes.
  std::map<std::string, std::map<int, int>> device_maps;
  // Drop-in mode: torch's agent starts right after the rendezvous (what
  // TorchScript's requests need; one that arrives first waits for it).
  bool torch_agent = false;
};

// The waits for the GIL of the Python functions a worker runs for others,
// while profiling is on (torch's GIL profiling).
struct GilProfile {
  std::atomic<bool> enabled{false};
  std::atomic<int64_t> waits{0};
  std::atomic<int64_t> total_us{0};
  void Record(absl::Duration wait) {
    total_us.fetch_add(absl::ToInt64Microseconds(wait), std::memory_order_relaxed);
    waits.fetch_add(1, std::memory_order_relaxed);
  }
  int64_t AverageMicros() const {
    const int64_t n = waits.load();
    return n == 0 ? 0 : total_us.load() / n;
  }
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
    options->device_maps = config.device_maps;
    options->front_ends = {"python"};

    auto self = std::shared_ptr<PyAgent>(new PyAgent());
    self->registry_ = std::make_shared<rpc::FunctionRegistry>();
    auto runtime = std::make_shared<PyRuntime>();
    runtime->dumps = PyRef(std::move(dumps));
    self->registry_->SetExtension(runtime);
    self->rrefs_ = rref::RRefService::Install(*self->registry_);
    for (const auto& installer : config.installers) Check(installer->Install(*self->registry_));
    self->installers_ = config.installers;
    Check(dist_autograd::Install(*self->registry_));
    Check(InstallOptimizerHost(*self->registry_));
    auto torch_host = TorchAgentHost::Install(*self->registry_, config.torch_agent);
    Check(torch_host.status());
    self->torch_ = *std::move(torch_host);
    PyRef runner(std::move(run));
    std::shared_ptr<GilProfile> gil = self->gil_profile_;
    auto call = [runner, runtime, gil](const rpc::CallContext& c, PyObj m) {
      return RunPython(runner, runtime.get(), *gil, c, std::move(m));
    };
    auto remote = [runner, gil](const rpc::CallContext& c, PyObj m) {
      return RunPython(runner, nullptr, *gil, c, std::move(m));
    };
    Check(self->registry_->Register(
        kPyCall, [call](const rpc::CallContext& ctx, PyObj msg) -> Future<PyObj> {
          return AfterForksAnswered(ctx, std::move(msg), call);
        }));
    Check(self->registry_->Register(
        kPyRemote, [remote](const rpc::CallContext& ctx, PyObj msg) -> Future<PyObj> {
          return AfterForksAnswered(ctx, std::move(msg), remote);
        }));
    rpc::AgentCollaborators collaborators;
#ifdef BATON_PYTHON_CUDA_IPC
    // CUDA tensors to the other processes of this host go through CUDA IPC
    // (docs/cuda.md) unless BATON_CUDA_IPC=0; the host carries them
    // otherwise, and always between hosts.
    std::shared_ptr<rpc::cuda::CudaIpcChannel> channel;
    if (const char* ipc = std::getenv("BATON_CUDA_IPC");
        ipc == nullptr || std::string(ipc) != "0") {
      channel = rpc::cuda::CudaIpcChannel::Install(*self->registry_);
      collaborators.cuda_channel = channel;
    }
#endif
    absl::StatusOr<std::unique_ptr<rpc::RpcAgent>> agent;
    {
      py::gil_scoped_release nogil;
      agent = rpc::RpcAgent::Create(*options, self->registry_, std::move(collaborators));
    }
    Check(agent.status());
    self->agent_ = *std::move(agent);
#ifdef BATON_PYTHON_CUDA_IPC
    if (channel != nullptr) channel->Attach(self->agent_.get());
#endif
    self->rrefs_->Attach(self->agent_.get());
    return self;
  }

  ~PyAgent() {
    // Threads of the agent may wait for the GIL: let them finish.
    py::gil_scoped_release nogil;
    torch_->Stop().IgnoreError();  // it calls through agent_
    agent_.reset();
  }

  // Drop-in mode: torch's current RPC agent becomes this agent's (what
  // TorchScript's RPC operators call; python/src/torch_agent.h).
  void StartTorchAgent(double rpc_timeout_s) {
    Check(torch_->Start(&agent(), absl::Seconds(rpc_timeout_s)));
  }

  TorchAgentHost& torch_host() const { return *torch_; }

  rpc::RpcAgent& agent() const {
    if (agent_ == nullptr) Raise(absl::FailedPreconditionError("the RPC agent is shut down"));
    return *agent_;
  }

  // `label`: the Python function, naming the call in metrics, hang reports
  // and the timeline (rpc::CallOptions::label).
  std::shared_ptr<PyFuture> Call(const py::object& to, py::bytes pickle,
                                 const std::vector<at::Tensor>& tensors,
                                 const std::vector<PyRRef>& rrefs, std::optional<double> timeout,
                                 std::string label) {
    rpc::RpcAgent& a = agent();
    const rpc::WorkerRef ref = Ref(to);
    PyObj msg = FromParts(pickle, tensors, rrefs);
    rpc::CallOptions opts{Seconds(timeout, absl::ZeroDuration()), std::move(label)};
    py::gil_scoped_release nogil;
    return PyFuture::New(a.rpc_async(opts, ref, kPyCall, std::move(msg)));
  }

  PyRRef Remote(const py::object& to, py::bytes pickle, const std::vector<at::Tensor>& tensors,
                const std::vector<PyRRef>& rrefs, std::optional<double> timeout,
                std::string label) {
    rpc::RpcAgent& a = agent();
    const rpc::WorkerRef ref = Ref(to);
    PyObj msg = FromParts(pickle, tensors, rrefs);
    rpc::CallOptions opts{Seconds(timeout, absl::ZeroDuration()), std::move(label)};
    py::gil_scoped_release nogil;
    try {
      return rref::remote(a, opts, ref, kPyRemote, std::move(msg));
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
          AcquireGil gil;
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
  // The names of the workers that run baton's Python front end (a mixed
  // job's C++ workers do not).
  py::list PythonWorkers() const {
    py::list out;
    for (const auto& w : agent().workers()) {
      if (std::find(w.front_ends.begin(), w.front_ends.end(), "python") != w.front_ends.end()) {
        out.append(w.name);
      }
    }
    return out;
  }
  int64_t Incarnation() const { return agent().incarnation(); }

  void Shutdown(bool graceful) {
    if (agent_ == nullptr) return;
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = agent_->Shutdown(graceful);
      // After the shutdown agreement (no scripted call is coming), before
      // the agent it calls through goes.
      absl::Status torch_stopped = torch_->Stop();
      if (s.ok()) s = torch_stopped;
      for (const auto& installer : installers_) {
        absl::Status stopped = installer->Stop();
        if (s.ok()) s = stopped;
      }
      agent_.reset();
    }
    Check(s);
  }

  // Shutdown's agreement on its own (RpcAgent::EnterShutdown).
  void EnterShutdown() {
    if (agent_ == nullptr) return;
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = agent_->EnterShutdown();
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
  // torch's _rref_context_get_debug_info() counts: owned RRefs that some
  // other worker holds (a local RRef(value) never sent is not counted, as
  // in torch), the forks of them that this owner knows, user RRefs forked
  // on from here and not yet confirmed by their owner, and ids seen before
  // their creation message.
  py::dict RRefDebugCounts() const {
    rref::RRefDebugState st = rrefs_->DebugState();
    size_t shared = 0;
    size_t forks = 0;
    for (const auto& owned : st.owned) {
      if (!owned.forks.empty()) ++shared;
      forks += owned.forks.size();
    }
    py::dict d;
    d["num_owner_rrefs"] = shared;
    d["num_forks"] = forks;
    d["num_pending_users"] = st.unconfirmed.size();
    d["num_pending_futures"] = st.early_entries;
    return d;
  }
  // The user RRefs this worker still holds, as (RRef id, fork id, owner):
  // shutdown's leak check, after the step that releases them.
  py::list HeldRRefs() const {
    rref::RRefDebugState st = rrefs_->DebugState();
    py::list out;
    for (const auto& held : st.held) {
      out.append(py::make_tuple(held.rref.ToString(), held.fork.ToString(), held.owner));
    }
    return out;
  }
  // Releases every user RRef this worker holds and waits (up to `timeout`
  // seconds) until their owners confirmed (G6); what a graceful shutdown
  // does after every worker arrived.
  void SettleRRefs(double timeout) const {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = rrefs_->context()->Settle(absl::Now() + absl::Seconds(timeout));
    }
    Check(s);
  }
  void WaitRRefsEmpty(double timeout) const {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = rrefs_->WaitUntilEmpty(absl::Seconds(timeout));
    }
    Check(s);
  }
  // torch's enable_gil_profiling: time each wait for the GIL of the
  // Python functions this worker runs for others (Stats'
  // gil_average_wait_time_us while on).
  void EnableGilProfiling(bool on) { gil_profile_->enabled.store(on); }

  py::dict Stats() const {
    rpc::AgentStats s = agent().stats();
    py::dict d;
    d["pending_outgoing"] = s.pending_outgoing;
    d["running_incoming"] = s.running_incoming;
    d["executor_threads"] = s.executor_threads;
    d["executor_parallelism"] = s.executor_parallelism;
    d["shm_frames_sent"] = s.shm_frames_sent;
    d["shm_bulk_bytes_copied_out"] = s.shm_bulk_bytes_copied_out;
    d["shm_bulk_bytes_copied_in"] = s.shm_bulk_bytes_copied_in;
    d["peer_failures"] = s.peer_failures;
    if (gil_profile_->enabled.load()) d["gil_average_wait_time_us"] = gil_profile_->AverageMicros();
    return d;
  }

 private:
  PyAgent() = default;

  static rpc::WorkerRef Ref(const py::object& to) {
    if (py::isinstance<py::str>(to)) return rpc::WorkerRef(to.cast<std::string>());
    if (py::isinstance<py::int_>(to)) return rpc::WorkerRef(to.cast<int>());
    Raise(absl::InvalidArgumentError(
        absl::StrCat("a worker is named by its name, rank or WorkerInfo, not by a ",
                     std::string(py::str(py::type::handle_of(to).attr("__name__"))))));
  }
  static py::tuple Info(const rpc::WorkerInfo& w) { return py::make_tuple(w.name, w.id); }

  // Runs `run` at once, or, when the call brought RRefs forked to this
  // worker by another user whose ForkRequests are not answered yet, on the
  // executor once they are (G12, rref/rref_context.h): no thread waits.
  template <typename Run>
  static Future<PyObj> AfterForksAnswered(const rpc::CallContext& ctx, PyObj msg, Run run) {
    std::vector<rpc::Future<void>> waits;
    for (const PyRRef& r : msg.rrefs) {
      if (r.handle()->fork_answer_pending()) waits.push_back(r.handle()->fork_answered());
    }
    if (waits.empty()) return run(ctx, std::move(msg));
    rpc::Promise<void> all(ctx.agent != nullptr ? ctx.agent->executor() : nullptr);
    auto left = std::make_shared<std::atomic<size_t>>(waits.size());
    for (const rpc::Future<void>& w : waits) {
      w.OnReady([all, left](const auto&) {
        if (left->fetch_sub(1) == 1) all.SetValue();
      });
    }
    rpc::Promise<PyObj> out;
    // The context's function name is a view of the request: keep a copy.
    auto call = std::make_shared<std::pair<rpc::CallContext, std::string>>(ctx, ctx.function);
    call->first.function = call->second;
    all.future().Then(
        [call, msg = std::move(msg), run = std::move(run), out](const rpc::Future<void>&) mutable {
          // What the hooks set for user code (a distributed autograd
          // context), as on the request's own thread.
          const rpc::CallContext& c = call->first;
          rpc::FunctionRegistry::CallScopes scopes;
          if (c.registry != nullptr && c.registry->has_call_hooks())
            scopes = c.registry->EnterCall(c);
          run(c, std::move(msg)).OnReady([out](const auto& r) { out.Set(r); });
        });
    return out.future();
  }

  // `pickle_with`: pickle a result at once (kPyCall) with this runtime's
  // pickler; null: keep it live (kPyRemote).
  static Future<PyObj> RunPython(const PyRef& runner, const PyRuntime* pickle_with,
                                 GilProfile& profile, const rpc::CallContext& ctx, PyObj msg) {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) {
      return rpc::MakeErrorFuture<PyObj>(
          absl::UnavailableError("the Python interpreter of this worker is shutting down"));
    }
    const bool timed = profile.enabled.load(std::memory_order_relaxed);
    const absl::Time asked = timed ? absl::Now() : absl::InfinitePast();
    AcquireGil gil;
    if (timed) profile.Record(absl::Now() - asked);
    try {
      py::object caller =
          ctx.caller != nullptr ? py::object(py::str(ctx.caller->name)) : py::object(py::none());
      py::list tensors;
      for (at::Tensor& t : msg.tensors) tensors.append(py::cast(std::move(t)));
      py::list rrefs;
      for (auto& r : msg.rrefs) rrefs.append(py::cast(std::move(r)));
      py::tuple out = runner.get()(py::bytes(msg.pickle), tensors, rrefs, caller);
      if (out[0].cast<bool>()) {
        return out[1].cast<std::shared_ptr<PyFuture>>()->future();
      }
      PyObj v;
      if (pickle_with == nullptr) {
        v.live = PyRef(out[1]);
        return rpc::MakeReadyFuture<PyObj>(std::move(v));
      }
      py::tuple parts = pickle_with->dumps.get()(out[1]);
      v.pickle = parts[0].cast<std::string>();
      for (py::handle t : parts[1].cast<py::list>()) v.tensors.push_back(t.cast<at::Tensor>());
      for (py::handle r : parts[2].cast<py::list>()) v.rrefs.push_back(r.cast<PyRRef>());
      return rpc::MakeReadyFuture<PyObj>(std::move(v));
    } catch (py::error_already_set& e) {
      return rpc::MakeErrorFuture<PyObj>(StatusFromPython(e, ""));
    } catch (const std::exception& e) {
      return rpc::MakeErrorFuture<PyObj>(absl::UnknownError(e.what()));
    }
  }

  std::shared_ptr<rpc::FunctionRegistry> registry_;
  std::vector<std::shared_ptr<RegistryInstaller>> installers_;
  std::shared_ptr<rref::RRefService> rrefs_;
  std::shared_ptr<TorchAgentHost> torch_;
  std::shared_ptr<GilProfile> gil_profile_ = std::make_shared<GilProfile>();
  std::unique_ptr<rpc::RpcAgent> agent_;
};

// ---- Distributed autograd ----

class PyAutogradContext {
 public:
  explicit PyAutogradContext(std::shared_ptr<PyAgent> agent)
      : agent_(std::move(agent)),
        context_(std::make_unique<dist_autograd::Context>(agent_->agent())),
        torch_mirror_(agent_->torch_host().MirrorContext(context_->id())) {}
  int64_t id() const { return context_->id(); }
  void Release() {
    py::gil_scoped_release nogil;
    torch_mirror_.reset();
    context_.reset();
  }

 private:
  std::shared_ptr<PyAgent> agent_;
  std::unique_ptr<dist_autograd::Context> context_;
  // TorchScript's view of the context in drop-in mode (torch_agent.h).
  std::unique_ptr<TorchContextMirror> torch_mirror_;
};

// Runs f with the GIL released.
template <typename F>
auto ReleasingGil(F f) {
  py::gil_scoped_release nogil;
  return f();
}
// The value (a tensor, a list of tensors, or None) as a live Python
// object, made on the executor under the GIL.
template <typename T>
std::shared_ptr<PyFuture> Wrap(Future<T> f) {
  return PyFuture::New(f.Then([](const Future<T>& done) -> absl::StatusOr<PyObj> {
    const auto& r = done.result();
    if (!r.ok()) return r.status();
    AcquireGil gil;
    PyObj o;
    if constexpr (std::is_void_v<T>) {
      o.live = PyRef(py::none());
    } else {
      o.live = PyRef(py::cast(*r));
    }
    return o;
  }));
}

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

absl::StatusOr<dist_optim::OptimizerOptions> OptionsFrom(const std::string& kind,
                                                         const py::dict& kw) {  // NOLINT
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
  BindTorchFuture(m);
  BindAutogradNodes(m);
  BindProfiler(m);

  py::class_<PyFuture, std::shared_ptr<PyFuture>>(m, "Future")
      .def(py::init(&PyFuture::Make))
      .def("done", &PyFuture::done)
      .def("wait", &PyFuture::Wait, py::arg("timeout") = py::none())
      .def("then", &PyFuture::Then)
      .def("set_result", &PyFuture::SetResult)
      .def("set_error", &PyFuture::SetError);

  py::class_<PyRRef, std::unique_ptr<PyRRef, ReleaseGilDelete<PyRRef>>>(m, "RRef")
      .def("is_owner", &PyRRef::is_owner)
      .def("owner_id", &PyRRef::owner_id)
      .def("id", &PyRRef::id)
      // ((worker, local), (worker, local)): the RRef's id and its fork's.
      .def("ids",
           [](const PyRRef& r) {
             const auto rref = r.rref_id();
             const auto fork = r.fork_id();
             return py::make_tuple(py::make_tuple(rref.worker, rref.local),
                                   py::make_tuple(fork.worker, fork.local));
           })
      .def("confirmed_by_owner", [](const PyRRef& r) { return r.handle()->confirmed_by_owner(); })
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
      .def(
          "to_here",
          [](const PyRRef& r, std::optional<double> timeout) {
            py::gil_scoped_release nogil;
            try {
              return PyFuture::New(r.to_here_async(Seconds(timeout, absl::ZeroDuration())));
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
      .def_readwrite("installers", &AgentConfig::installers)
      .def_readwrite("torch_agent", &AgentConfig::torch_agent)
      .def_readwrite("rank", &AgentConfig::rank)
      .def_readwrite("master_addr", &AgentConfig::master_addr)
      .def_readwrite("master_port", &AgentConfig::master_port)
      .def_readwrite("world_size", &AgentConfig::world_size)
      .def_readwrite("rpc_timeout", &AgentConfig::rpc_timeout)
      .def_readwrite("init_timeout", &AgentConfig::init_timeout)
      .def_readwrite("shutdown_timeout", &AgentConfig::shutdown_timeout)
      .def_readwrite("shutdown_wait_for_peers", &AgentConfig::shutdown_wait_for_peers)
      .def_readwrite("parallelism", &AgentConfig::parallelism)
      .def_readwrite("restart_wait", &AgentConfig::restart_wait)
      .def_readwrite("device_maps", &AgentConfig::device_maps);

  py::class_<PyAgent, std::shared_ptr<PyAgent>>(m, "Agent")
      .def_static("create", &PyAgent::Create)
      .def("call", &PyAgent::Call, py::arg("to"), py::arg("pickle"), py::arg("tensors"),
           py::arg("rrefs"), py::arg("timeout"), py::arg("label") = std::string())
      .def("remote", &PyAgent::Remote, py::arg("to"), py::arg("pickle"), py::arg("tensors"),
           py::arg("rrefs"), py::arg("timeout"), py::arg("label") = std::string())
      .def("make_owned", &PyAgent::MakeOwned)
      .def("call_cpp", &PyAgent::CallCpp)
      .def("self_info", &PyAgent::Self)
      .def("worker", &PyAgent::Worker)
      .def("workers", &PyAgent::Workers)
      .def("python_workers", &PyAgent::PythonWorkers)
      .def("incarnation", &PyAgent::Incarnation)
      .def("shutdown", &PyAgent::Shutdown)
      .def("enter_shutdown", &PyAgent::EnterShutdown)
      .def("shutdown_timeout",
           [](const PyAgent& self) {
             return absl::ToDoubleSeconds(self.agent().options().shutdown_timeout);
           })
      .def("start_torch_agent", &PyAgent::StartTorchAgent, py::arg("rpc_timeout"))
      .def("rref_state", &PyAgent::RRefState)
      .def("rref_debug_counts", &PyAgent::RRefDebugCounts)
      .def("held_rrefs", &PyAgent::HeldRRefs)
      .def("settle_rrefs", &PyAgent::SettleRRefs)
      .def("wait_rrefs_empty", &PyAgent::WaitRRefsEmpty)
      .def("stats", &PyAgent::Stats)
      .def("enable_gil_profiling", &PyAgent::EnableGilProfiling)
      // The hang report's snapshot of this worker (obs/state.h), as JSON.
      .def("state_json",
           [](const PyAgent& self) {
             const baton::rpc::RpcAgent& a = self.agent();
             py::gil_scoped_release nogil;
             return a.StateJson();
           })
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
      .def("live_autograd_contexts",
           [](PyAgent& a) { return baton::dist_autograd::LiveContexts(a.agent()); })
      .def("backward_passes_running",
           [](PyAgent& a) { return baton::dist_autograd::BackwardPassesRunning(a.agent()); })
      .def("describe_autograd_context",
           [](PyAgent& a, int64_t context_id) {
             auto described = DescribeAutogradContext(a.agent(), context_id);
             Check(described.status());
             return *std::move(described);
           })
      .def("current_context_id",
           [](PyAgent& a) { return baton::dist_autograd::CurrentContextId(a.agent()); });

  py::class_<PyAutogradContext, std::shared_ptr<PyAutogradContext>>(m, "AutogradContext")
      .def("id", &PyAutogradContext::id)
      .def("release", &PyAutogradContext::Release);

  py::class_<baton::dist_optim::FunctionalOptimizer>(m, "FunctionalOptimizer")
      .def(py::init(
          [](const std::string& kind, const py::dict& kwargs, std::vector<at::Tensor> params) {
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

  // An optimizer hosted for a DistributedOptimizer (python/src/hosted_optimizer.h).
  py::class_<HostedOptimizer, std::shared_ptr<HostedOptimizer>>(m, "HostedOptimizer")
      .def(py::init([](PyAgent& a, const std::string& key, const std::string& kind,
                       const py::dict& kwargs, std::vector<at::Tensor> params) {
        auto o = OptionsFrom(kind, kwargs);
        Check(o.status());
        auto hosted = HostedOptimizer::Create(a.agent(), key, *o, std::move(params));
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

  py::class_<RegistryInstaller, std::shared_ptr<RegistryInstaller>>(m, "RegistryInstaller");
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

  m.attr("PYTHON_ERROR_PREFIX") = kPythonErrorPrefix;
  // Drop-in mode: baton's RRefs in TorchScript (torch_agent.h).
  m.def("install_torch_rref_conversion", &InstallRRefConversion);
  m.def("torch_owner_rref", &TorchOwnerRRef, py::arg("value"), py::arg("type_hint") = py::none(),
        py::arg("value_type") = "");
  m.def("torch_fork_for_user", &TorchForkForUser, py::arg("owner"));
  m.def("torch_user_rref", &TorchUserRRef);
  m.def("canonical_signature", [](const std::string& text) {
    auto sig = Signature::Parse(text);
    Check(sig.status());
    return sig->text;
  });
}
