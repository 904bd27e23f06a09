// baton._C.Agent and baton._C.RRef (py_agent.h).
#include "python/src/py_agent.h"
#include "base/status_macros.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <utility>

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "dist_autograd/dist_autograd.h"
#include "group/group.h"
#include "group/supervisor.h"
#include "python/src/cpp_call.h"
#include "python/src/hosted_optimizer.h"
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
// A group reduce's members run the call through kPyTensor: its result must
// be a tensor, which the hops add up (group/group.h).
const rpc::Function<at::Tensor(PyObj)> kPyTensor("__baton.py.tensor");

rpc::WorkerRef Ref(const py::object& to) {
  if (py::isinstance<py::str>(to)) return rpc::WorkerRef(to.cast<std::string>());
  if (py::isinstance<py::int_>(to)) return rpc::WorkerRef(to.cast<int>());
  Raise(absl::InvalidArgumentError(
      absl::StrCat("a worker is named by its name, rank or WorkerInfo, not by a ",
                   std::string(py::str(py::type::handle_of(to).attr("__name__"))))));
}

py::tuple Info(const rpc::WorkerInfo& w) { return py::make_tuple(w.name, w.id); }

// The group of a Python group call or reduce; raises what Group::Of refuses.
group::Group MakeGroup(rpc::RpcAgent& agent, const std::vector<py::object>& members,
                       std::optional<double> timeout, int fanout, std::string label,
                       const group::Supervisor* supervisor) {
  std::vector<rpc::WorkerRef> refs;
  refs.reserve(members.size());
  for (const py::object& m : members) refs.push_back(Ref(m));
  group::GroupOptions options;
  options.fanout = fanout;
  options.timeout = Seconds(timeout, absl::ZeroDuration());
  options.label = std::move(label);
  absl::StatusOr<group::Group> g = group::Group::Of(agent, refs, options);
  Check(g.status());
  return supervisor != nullptr ? supervisor->Watching(*std::move(g)) : *std::move(g);
}

// Runs `run` at once, or, when the call brought RRefs forked to this
// worker by another user whose ForkRequests are not answered yet, on the
// executor once they are (G12, rref/rref_context.h): no thread waits.
template <typename Run>
Future<PyObj> AfterForksAnswered(const rpc::CallContext& ctx, PyObj msg, Run run) {
  std::vector<rpc::Future<void>> waits;
  for (const PyRRef& r : msg.rrefs) {
    if (r.handle()->fork_answer_pending()) waits.push_back(r.handle()->fork_answered());
  }
  if (waits.empty()) return run(ctx, std::move(msg));
  rpc::Promise<void> all(ctx.runtime != nullptr ? ctx.runtime->executor() : nullptr);
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
Future<PyObj> RunPython(const PyRef& runner, const PyRuntime* pickle_with, GilProfile& profile,
                        const rpc::CallContext& ctx, PyObj msg) {
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

}  // namespace

std::shared_ptr<PyAgent> PyAgent::Create(const AgentConfig& config, py::function dumps,
                                         py::function run) {
  // The process environment for what the config leaves unset.
  absl::StatusOr<rpc::AgentOptions> options = AgentOptionsFrom(config, /*env=*/nullptr);
  Check(options.status());

  auto self = std::shared_ptr<PyAgent>(new PyAgent());
  self->registry_ = std::make_shared<rpc::FunctionRegistry>();
  auto runtime = std::make_shared<PyRuntime>();
  runtime->dumps = PyRef(std::move(dumps));
  self->registry_->SetExtension(runtime);
  self->rrefs_ = rref::RRefService::Install(*self->registry_);
  for (const auto& installer : config.installers) Check(installer->Install(*self->registry_));
  self->installers_ = config.installers;
  Check(dist_autograd::Install(*self->registry_));
  Check(group::Install(*self->registry_));
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
  Check(self->registry_->Register(kPyCall,
                                  [call](const rpc::CallContext& ctx, PyObj msg) -> Future<PyObj> {
                                    return AfterForksAnswered(ctx, std::move(msg), call);
                                  }));
  Check(self->registry_->Register(
      kPyRemote, [remote](const rpc::CallContext& ctx, PyObj msg) -> Future<PyObj> {
        return AfterForksAnswered(ctx, std::move(msg), remote);
      }));
  Check(self->registry_->Register(
      kPyTensor, [remote](const rpc::CallContext& ctx, PyObj msg) -> Future<at::Tensor> {
        return AfterForksAnswered(ctx, std::move(msg), remote)
            .Then([](const Future<PyObj>& f) -> absl::StatusOr<at::Tensor> {
              if (!f.result().ok()) return f.result().status();
              const PyObj& v = *f.result();
              AcquireGil gil;
              py::object value = v.live.valid() ? v.live.get() : py::object(py::none());
              if (!THPVariable_Check(value.ptr())) {
                return absl::InvalidArgumentError(
                    absl::StrCat("a group reduce's function returned a ",
                                 std::string(py::str(py::type::handle_of(value).attr("__name__"))),
                                 ", not a tensor"));
              }
              return value.cast<at::Tensor>();
            });
      }));
  rpc::AgentCollaborators collaborators;
#ifdef BATON_PYTHON_CUDA_IPC
  // CUDA tensors to the other processes of this host go through CUDA IPC
  // (docs/cuda.md) unless BATON_CUDA_IPC=0; the host carries them
  // otherwise, and always between hosts.
  std::shared_ptr<rpc::cuda::CudaIpcChannel> channel;
  if (const char* ipc = std::getenv("BATON_CUDA_IPC"); ipc == nullptr || std::string(ipc) != "0") {
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

PyAgent::~PyAgent() {
  // Threads of the agent may wait for the GIL: let them finish.
  py::gil_scoped_release nogil;
  torch_->Stop().IgnoreError();  // it calls through agent_
  agent_.reset();
}

void PyAgent::StartTorchAgent(double rpc_timeout_s) {
  Check(torch_->Start(&agent(), absl::Seconds(rpc_timeout_s)));
}

rpc::RpcAgent& PyAgent::agent() const {
  if (agent_ == nullptr) Raise(absl::FailedPreconditionError("the RPC agent is shut down"));
  return *agent_;
}

std::shared_ptr<PyFuture> PyAgent::Call(const py::object& to, py::bytes pickle,
                                        const std::vector<at::Tensor>& tensors,
                                        const std::vector<PyRRef>& rrefs,
                                        std::optional<double> timeout, std::string label) {
  rpc::RpcAgent& a = agent();
  const rpc::WorkerRef ref = Ref(to);
  PyObj msg = FromParts(pickle, tensors, rrefs);
  rpc::CallOptions opts{Seconds(timeout, absl::ZeroDuration()), std::move(label)};
  py::gil_scoped_release nogil;
  return PyFuture::New(a.rpc_async(opts, ref, kPyCall, std::move(msg)));
}

PyRRef PyAgent::Remote(const py::object& to, py::bytes pickle,
                       const std::vector<at::Tensor>& tensors, const std::vector<PyRRef>& rrefs,
                       std::optional<double> timeout, std::string label) {
  rpc::RpcAgent& a = agent();
  const rpc::WorkerRef ref = Ref(to);
  PyObj msg = FromParts(pickle, tensors, rrefs);
  rpc::CallOptions opts{Seconds(timeout, absl::ZeroDuration()), std::move(label)};
  PyRRef r;
  {
    py::gil_scoped_release nogil;
    r = rref::remote(a, opts, ref, kPyRemote, std::move(msg));
  }
  // torch raises at the call for what fails before anything is sent (an
  // unknown worker, arguments that cannot be sent); C++ reports it through
  // the RRef.
  if (!r.handle()->attached()) Raise(r.created().status());
  return r;
}

std::vector<std::shared_ptr<PyFuture>> PyAgent::GroupCall(const std::vector<py::object>& members,
                                                          py::bytes pickle,
                                                          const std::vector<at::Tensor>& tensors,
                                                          const std::vector<PyRRef>& rrefs,
                                                          std::optional<double> timeout, int fanout,
                                                          bool discard_values, std::string label,
                                                          const group::Supervisor* supervisor) {
  if (!rrefs.empty()) {
    Raise(absl::InvalidArgumentError(
        "a group call cannot send RRefs: its arguments are encoded once for every member, and an "
        "RRef's fork is made for one destination; pass the RRef's value, or call each member"));
  }
  group::Group g = MakeGroup(agent(), members, timeout, fanout, std::move(label), supervisor);
  PyObj msg = FromParts(pickle, tensors, rrefs);
  std::vector<std::shared_ptr<PyFuture>> out;
  out.reserve(members.size());
  py::gil_scoped_release nogil;
  if (discard_values) {
    for (auto& f : g.broadcast_each(kPyCall, std::move(msg)).each) out.push_back(Wrap(f));
  } else {
    for (auto& f : g.call_each(kPyCall, std::move(msg)).each) out.push_back(PyFuture::New(f));
  }
  return out;
}

std::shared_ptr<PyFuture> PyAgent::GroupReduce(const std::vector<py::object>& members,
                                               py::bytes pickle,
                                               const std::vector<at::Tensor>& tensors,
                                               std::optional<double> timeout, int fanout, bool mean,
                                               std::string label,
                                               const group::Supervisor* supervisor) {
  group::Group g = MakeGroup(agent(), members, timeout, fanout, std::move(label), supervisor);
  PyObj msg = FromParts(pickle, tensors, {});
  Future<group::Reduced> reduced;
  {
    py::gil_scoped_release nogil;
    reduced =
        g.reduce(kPyTensor, mean ? group::ReduceOp::kMean : group::ReduceOp::kSum, std::move(msg));
  }
  return PyFuture::New(reduced.Then([](const Future<group::Reduced>& f) -> absl::StatusOr<PyObj> {
    if (!f.result().ok()) return f.result().status();
    const group::Reduced& r = *f.result();
    AcquireGil gil;
    py::list contributors;
    for (const rpc::WorkerInfo& w : r.contributors) contributors.append(w.name);
    py::list failures;
    for (const auto& [w, status] : r.failures) {
      failures.append(
          py::make_tuple(w.name, static_cast<int>(status.code()), std::string(status.message())));
    }
    PyObj out;
    out.live = PyRef(py::make_tuple(r.value.defined() ? py::cast(r.value) : py::object(py::none()),
                                    contributors, failures));
    return out;
  }));
}

std::shared_ptr<PyFuture> PyAgent::CallCpp(const py::object& to, const std::string& function,
                                           const std::string& signature, const py::object& args,
                                           std::optional<double> timeout) {
  rpc::Runtime& a = runtime();
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
  rpc::Runtime* ap = &a;
  const int peer = worker->id;
  Future<PyObj> out = raw.Then(
      [ap, peer, function, shared_sig](const Future<rpc::Payload>& f) -> absl::StatusOr<PyObj> {
        const auto& r = f.result();
        if (!r.ok()) return r.status();
        DynValue v;
        std::deque<at::Tensor> tensors;
        RETURN_IF_ERROR(DecodeResult(*ap, peer, function, *shared_sig, *r, &v, &tensors));
        AcquireGil gil;
        PyObj o;
        o.live = PyRef(ToPython(v, tensors));
        return o;
      });
  return PyFuture::New(std::move(out));
}

PyRRef PyAgent::MakeOwned(py::object value) {
  PyObj v;
  v.live = PyRef(std::move(value));
  return rref::MakeOwned(agent(), std::move(v));
}

py::tuple PyAgent::Self() const { return Info(agent().self()); }

py::tuple PyAgent::Worker(const py::object& to) const {
  auto w = agent().worker(Ref(to));
  Check(w.status());
  return Info(*w);
}

py::list PyAgent::Workers() const {
  py::list out;
  for (const auto& w : agent().workers()) out.append(Info(w));
  return out;
}

py::list PyAgent::PythonWorkers() const {
  py::list out;
  for (const auto& w : agent().workers()) {
    if (std::find(w.front_ends.begin(), w.front_ends.end(), "python") != w.front_ends.end()) {
      out.append(w.name);
    }
  }
  return out;
}

void PyAgent::Shutdown(bool graceful) {
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

void PyAgent::EnterShutdown() {
  if (agent_ == nullptr) return;
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = agent_->runtime().EnterShutdown();
  }
  Check(s);
}

py::dict PyAgent::RRefState() const {
  rref::RRefDebugState st = rrefs_->DebugState();
  py::dict d;
  d["owned"] = st.owned.size();
  d["held"] = st.held.size();
  d["early"] = st.early_entries;
  d["unanswered"] = st.unanswered_messages;
  d["text"] = st.ToString();
  return d;
}

py::dict PyAgent::RRefDebugCounts() const {
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

py::list PyAgent::HeldRRefs() const {
  rref::RRefDebugState st = rrefs_->DebugState();
  py::list out;
  for (const auto& held : st.held) {
    out.append(py::make_tuple(held.rref.ToString(), held.fork.ToString(), held.owner));
  }
  return out;
}

void PyAgent::SettleRRefs(double timeout) const {
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = rrefs_->context()->Settle(absl::Now() + absl::Seconds(timeout));
  }
  Check(s);
}

void PyAgent::WaitRRefsEmpty(double timeout) const {
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = rrefs_->WaitUntilEmpty(absl::Seconds(timeout));
  }
  Check(s);
}

py::dict PyAgent::Stats() const {
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

AgentClass BindAgent(py::module_& m) {
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
      .def_readwrite("dynamic_group", &AgentConfig::dynamic_group)
      .def_readwrite("rpc_timeout", &AgentConfig::rpc_timeout)
      .def_readwrite("init_timeout", &AgentConfig::init_timeout)
      .def_readwrite("shutdown_timeout", &AgentConfig::shutdown_timeout)
      .def_readwrite("shutdown_wait_for_peers", &AgentConfig::shutdown_wait_for_peers)
      .def_readwrite("parallelism", &AgentConfig::parallelism)
      .def_readwrite("restart_wait", &AgentConfig::restart_wait)
      .def_readwrite("device_maps", &AgentConfig::device_maps)
      .def_readwrite("devices", &AgentConfig::devices);

  py::class_<RegistryInstaller, std::shared_ptr<RegistryInstaller>>(m, "RegistryInstaller");

  AgentClass agent(m, "Agent");
  agent.def_static("create", &PyAgent::Create)
      .def("call", &PyAgent::Call, py::arg("to"), py::arg("pickle"), py::arg("tensors"),
           py::arg("rrefs"), py::arg("timeout"), py::arg("label") = std::string())
      .def("remote", &PyAgent::Remote, py::arg("to"), py::arg("pickle"), py::arg("tensors"),
           py::arg("rrefs"), py::arg("timeout"), py::arg("label") = std::string())
      .def("group_call", &PyAgent::GroupCall, py::arg("members"), py::arg("pickle"),
           py::arg("tensors"), py::arg("rrefs"), py::arg("timeout"), py::arg("fanout"),
           py::arg("discard_values"), py::arg("label") = std::string(),
           py::arg("supervisor") = nullptr)
      .def("group_reduce", &PyAgent::GroupReduce, py::arg("members"), py::arg("pickle"),
           py::arg("tensors"), py::arg("timeout"), py::arg("fanout"), py::arg("mean"),
           py::arg("label") = std::string(), py::arg("supervisor") = nullptr)
      .def("make_owned", &PyAgent::MakeOwned)
      .def("call_cpp", &PyAgent::CallCpp)
      .def("self_info", &PyAgent::Self)
      .def("worker", &PyAgent::Worker)
      .def("workers", &PyAgent::Workers)
      .def("python_workers", &PyAgent::PythonWorkers)
      // The names of the workers a supervisor dropped (Runtime::RetiredPeers).
      .def("retired_workers",
           [](const PyAgent& self) {
             absl::StatusOr<std::vector<int>> ranks;
             {
               py::gil_scoped_release nogil;
               ranks = self.runtime().RetiredPeers();
             }
             Check(ranks.status());
             py::list out;
             for (int r : *ranks) {
               auto w = self.runtime().worker(r);
               if (w.ok()) out.append(w->name);
             }
             return out;
           })
      .def("incarnation", &PyAgent::Incarnation)
      .def("shutdown", &PyAgent::Shutdown)
      .def("enter_shutdown", &PyAgent::EnterShutdown)
      .def("shutdown_timeout",
           [](const PyAgent& self) {
             return absl::ToDoubleSeconds(self.agent().options().timeouts.shutdown);
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
      .def("state_json", [](const PyAgent& self) {
        const baton::rpc::RpcAgent& a = self.agent();
        py::gil_scoped_release nogil;
        return a.StateJson();
      });
  return agent;
}

}  // namespace baton::python
