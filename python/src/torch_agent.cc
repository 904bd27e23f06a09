#include "python/src/torch_agent.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/rpc/message.h>
#include <torch/csrc/distributed/rpc/py_rref.h>
#include <torch/csrc/distributed/rpc/python_rpc_handler.h>
#include <torch/csrc/distributed/rpc/request_callback_impl.h>
#include <torch/csrc/distributed/rpc/rpc_agent.h>
#include <torch/csrc/distributed/rpc/rref_context.h>
#include <torch/csrc/jit/python/module_python.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/library.h>

#include "absl/strings/str_cat.h"
#include "dist_autograd/dist_autograd.h"
#include "python/src/torch_dist_autograd.h"
#include "rpc/future.h"

namespace baton::python {
namespace {

namespace trpc = torch::distributed::rpc;

// (message type, payload, tensors): a torch Message on the wire.
using WireMessage = std::tuple<int64_t, std::string, std::vector<at::Tensor>>;
const rpc::Function<WireMessage(int64_t, std::string, std::vector<at::Tensor>)> kTorchMessage(
    "__baton.torch.message");

trpc::WorkerInfo TorchInfo(const rpc::WorkerInfo& w) {
  return trpc::WorkerInfo(w.name, static_cast<int64_t>(w.id));
}

// torch's wording for a call that ran past its deadline (the suites match
// "RPC ran for more than set timeout"); baton's status text otherwise, which
// names the worker and the cause.
std::string TorchErrorText(const absl::Status& status, absl::Duration timeout) {
  if (absl::IsDeadlineExceeded(status)) {
    return absl::StrCat("RPC ran for more than set timeout (", absl::ToInt64Milliseconds(timeout),
                        " ms) and will now be marked with an error: ", status.message());
  }
  return status.ToString();
}

// A FORWARD_AUTOGRAD_REQ's parts (torch's RpcWithAutograd format): the
// wrapped request's payload is the message's payload up to the metadata,
// which is a pickled tuple (wrapped type, context id, message id, sender)
// followed by its size as a big-endian int64.
struct AutogradRequest {
  int64_t context_id = 0;
  int64_t wrapped_type = 0;
  size_t wrapped_size = 0;
};

absl::StatusOr<AutogradRequest> ParseAutogradRequest(const trpc::Message& message) {
  const std::vector<char>& p = message.payload();
  auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("torch's FORWARD_AUTOGRAD_REQ message is malformed: ", why));
  };
  if (p.size() < sizeof(int64_t)) return bad("shorter than its metadata's size");
  uint64_t size = 0;
  for (size_t i = p.size() - sizeof(int64_t); i < p.size(); ++i) {
    size = (size << 8) | static_cast<unsigned char>(p[i]);
  }
  if (size == 0 || size > p.size() - sizeof(int64_t)) return bad("its metadata's size is wrong");
  const size_t start = p.size() - sizeof(int64_t) - size;
  c10::IValue metadata;
  try {
    metadata = torch::jit::unpickle(p.data() + start, size);
  } catch (const std::exception& e) {
    return bad(absl::StrCat("its metadata does not unpickle: ", e.what()));
  }
  if (!metadata.isTuple() || metadata.toTupleRef().elements().size() < 4) {
    return bad("its metadata is not a tuple of four");
  }
  const auto& fields = metadata.toTupleRef().elements();
  if (!fields[0].isInt() || !fields[1].isInt()) return bad("its metadata's fields are not ints");
  return AutogradRequest{fields[1].toInt(), fields[0].toInt(), start};
}

}  // namespace

class TorchAgent final : public trpc::RpcAgent {
 public:
  TorchAgent(rpc::RpcAgent* agent, absl::Duration rpc_timeout)
      : trpc::RpcAgent(TorchInfo(agent->self()), std::make_unique<trpc::RequestCallbackImpl>(),
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(rpc_timeout))),
        agent_(agent) {}

  c10::intrusive_ptr<trpc::JitFuture> send(const trpc::WorkerInfo& to,
                                           c10::intrusive_ptr<trpc::Message> message,
                                           const float timeout_s,
                                           const trpc::DeviceMap& /*device_map*/) override {
    TORCH_CHECK(rpcAgentRunning_.load(), "Node ", workerInfo_.id_, " tried to send() a message ",
                "of type ", message->type(), " but RPC is no longer running on this node.");
    absl::Duration timeout =
        timeout_s == trpc::kUnsetRpcTimeout
            ? absl::Milliseconds(getRpcTimeout().count())
            : absl::Milliseconds(static_cast<int64_t>(static_cast<double>(timeout_s) * 1000));
    if (timeout <= absl::ZeroDuration()) timeout = absl::InfiniteDuration();  // torch's 0: none
    auto future = c10::make_intrusive<trpc::JitFuture>(at::AnyClassType::get());
    int64_t type = message->type();
    size_t size = message->payload().size();
    // A request torch wrapped for its autograd: the wrapped one goes, inside
    // baton's context of that id (torch_agent.h, distributed autograd).
    std::unique_ptr<dist_autograd::ContextScope> scope;
    if (type == trpc::MessageType::FORWARD_AUTOGRAD_REQ) {
      absl::StatusOr<AutogradRequest> wrapped = ParseAutogradRequest(*message);
      absl::StatusOr<std::unique_ptr<dist_autograd::ContextScope>> entered =
          wrapped.ok() ? dist_autograd::ContextScope::Enter(*agent_, wrapped->context_id)
                       : wrapped.status();
      if (!entered.ok()) {
        future->setError(std::make_exception_ptr(std::runtime_error(absl::StrCat(
            "a TorchScript RPC in a distributed autograd context: ", entered.status().message()))));
        return future;
      }
      scope = *std::move(entered);
      type = wrapped->wrapped_type;
      size = wrapped->wrapped_size;
    }
    std::string payload(message->payload().begin(), message->payload().begin() + size);
    rpc::Future<WireMessage> reply = agent_->rpc_async(
        rpc::CallOptions{timeout, "torch message"}, rpc::WorkerRef(static_cast<int>(to.id_)),
        kTorchMessage, type, std::move(payload), message->tensors());
    // Then: on the agent's executor, since torch's callbacks may take the GIL.
    reply.Then([future, timeout](const rpc::Future<WireMessage>& done) {
      const auto& r = done.result();
      if (!r.ok()) {
        future->setError(
            std::make_exception_ptr(std::runtime_error(TorchErrorText(r.status(), timeout))));
        return;
      }
      const auto& [reply_type, reply_payload, reply_tensors] = *r;
      if (reply_type == trpc::MessageType::EXCEPTION) {
        future->setError(std::make_exception_ptr(std::runtime_error(reply_payload)));
        return;
      }
      auto response = c10::make_intrusive<trpc::Message>(
          std::vector<char>(reply_payload.begin(), reply_payload.end()),
          std::vector<at::Tensor>(reply_tensors), static_cast<trpc::MessageType>(reply_type));
      auto storages = response->getStorages();
      future->markCompleted(c10::IValue(std::move(response)), std::move(storages));
    });
    return future;
  }

  // One request from another worker's TorchAgent: torch's handler's
  // response, or its EXCEPTION response, is the reply.
  rpc::Future<WireMessage> Serve(int64_t type, std::string payload,
                                 std::vector<at::Tensor> tensors) {
    auto request = c10::make_intrusive<trpc::Message>(
        std::vector<char>(payload.begin(), payload.end()), std::move(tensors),
        static_cast<trpc::MessageType>(type), next_id_.fetch_add(1));
    rpc::Promise<WireMessage> promise;
    c10::intrusive_ptr<trpc::JitFuture> handled = (*cb_)(*request, {});
    handled->addCallback([promise, request](trpc::JitFuture& f) {
      if (f.hasError()) {
        promise.SetError(absl::UnknownError(f.tryRetrieveErrorMessage()));
        return;
      }
      auto response = f.value().toCustomClass<trpc::Message>();
      const std::vector<char>& p = response->payload();
      promise.SetValue(WireMessage{static_cast<int64_t>(response->type()),
                                   std::string(p.begin(), p.end()), response->tensors()});
    });
    return promise.future();
  }

  // The baton agent under this one (the scripted operators' way to it).
  rpc::RpcAgent& baton() const { return *agent_; }

  const trpc::WorkerInfo& getWorkerInfo(const std::string& name) const override {
    return Known(rpc::WorkerRef(name),
                 [&name](const trpc::WorkerInfo& w) { return w.name_ == name; });
  }
  const trpc::WorkerInfo& getWorkerInfo(trpc::worker_id_t id) const override {
    return Known(rpc::WorkerRef(static_cast<int>(id)),
                 [id](const trpc::WorkerInfo& w) { return w.id_ == id; });
  }
  // The group's workers now (a dynamic group's members change).
  std::vector<trpc::WorkerInfo> getWorkerInfos() const override {
    std::vector<trpc::WorkerInfo> out;
    for (const rpc::WorkerInfo& w : agent_->workers()) out.push_back(TorchInfo(w));
    return out;
  }
  // baton's shutdown agreement joins the job (baton.rpc.shutdown).
  void join(bool /*shutdown*/, float /*timeout*/) override {}
  void sync() override {}
  void startImpl() override {}
  void shutdownImpl() override {}
  std::unordered_map<std::string, std::string> getMetrics() override {
    return {{"agent", "baton"}, {"world_size", std::to_string(agent_->workers().size())}};
  }

 private:
  void addGilWaitTime(const std::chrono::microseconds /*gil_wait*/) override {}

  // torch's interface hands out references: each worker looked up is kept
  // here for the agent's life (a deque keeps them in place as it grows).
  template <typename Match>
  const trpc::WorkerInfo& Known(const rpc::WorkerRef& ref, Match match) const {
    {
      absl::MutexLock lock(&mu_);
      for (const trpc::WorkerInfo& w : infos_) {
        if (match(w)) return w;
      }
    }
    absl::StatusOr<rpc::WorkerInfo> w = agent_->worker(ref);
    TORCH_CHECK(w.ok(), "Unknown destination worker ",
                ref.name().empty() ? std::to_string(ref.id()) : ref.name(), ": ",
                std::string(w.status().message()));
    absl::MutexLock lock(&mu_);
    for (const trpc::WorkerInfo& known : infos_) {
      if (known.id_ == w->id) return known;
    }
    return infos_.emplace_back(TorchInfo(*w));
  }

  rpc::RpcAgent* const agent_;
  mutable absl::Mutex mu_;
  mutable std::deque<trpc::WorkerInfo> infos_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> next_id_{0};
};

namespace {

// The baton agent of torch's current agent, for the scripted operators.
rpc::RpcAgent& BatonAgentForScript(const char* op) {
  auto current = trpc::RpcAgent::isCurrentRpcAgentSet()
                     ? std::dynamic_pointer_cast<TorchAgent>(trpc::RpcAgent::getCurrentRpcAgent())
                     : nullptr;
  TORCH_CHECK(current != nullptr, "dist_autograd.", op,
              "() in TorchScript needs baton's RPC agent started in drop-in mode "
              "(python -m baton.torch_rpc, then init_rpc)");
  return current->baton();
}

// TorchScript's dist_autograd.backward and get_gradients in drop-in mode
// (baton.distributed.autograd registers them as the builtins of its
// functions). Errors are torch's RuntimeError with baton's message.
void ScriptedBackward(int64_t context_id, std::vector<at::Tensor> roots, bool retain_graph) {
  rpc::RpcAgent& agent = BatonAgentForScript("backward");
  absl::Status s = dist_autograd::Backward(agent, context_id, roots, retain_graph);
  TORCH_CHECK(s.ok(), s.message());
}

c10::Dict<at::Tensor, at::Tensor> ScriptedGradients(int64_t context_id) {
  rpc::RpcAgent& agent = BatonAgentForScript("get_gradients");
  absl::StatusOr<dist_autograd::GradientMap> grads = dist_autograd::GetGradients(agent, context_id);
  TORCH_CHECK(grads.ok(), grads.status().message());
  c10::Dict<at::Tensor, at::Tensor> out;
  for (const auto& [leaf, grad] : grads->items()) out.insert(leaf, grad);
  return out;
}

}  // namespace

TORCH_LIBRARY(baton, m) {
  // Both act on the context's state: the compiler must neither drop nor
  // reorder them (torch declares its own the same way).
  m.def(
      torch::schema("dist_backward(int context_id, Tensor[] roots, bool retain_graph=False) -> ()",
                    c10::AliasAnalysisKind::CONSERVATIVE),
      &ScriptedBackward);
  m.def(torch::schema("get_gradients(int context_id) -> Dict(Tensor, Tensor)",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        &ScriptedGradients);
}

TorchContextMirror::TorchContextMirror(std::weak_ptr<TorchAgent> agent, int64_t id)
    : agent_(std::move(agent)), id_(id) {
  auto& container = torch::distributed::autograd::DistAutogradContainer::getInstance();
  previous_id_ = container.currentContextId();
  container.getOrCreateContext(id_);
  container.forceCurrentContextId(id_);
}

TorchContextMirror::~TorchContextMirror() {
  auto& container = torch::distributed::autograd::DistAutogradContainer::getInstance();
  container.forceCurrentContextId(previous_id_);
  // torch's release tells the workers its context sent to; it needs torch's
  // agent. Once that stopped, torch's container is gone with the job.
  if (agent_.lock() == nullptr) return;
  try {
    container.releaseContextIfPresent(id_);
  } catch (const std::exception&) {
    // Its agent stopped meanwhile: as above.
  }
}

std::unique_ptr<TorchContextMirror> TorchAgentHost::MirrorContext(int64_t context_id) {
  absl::MutexLock lock(&mu_);
  if (agent_ == nullptr) return nullptr;
  return std::unique_ptr<TorchContextMirror>(new TorchContextMirror(agent_, context_id));
}

std::shared_ptr<TorchAgent> TorchAgentHost::Current(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return agent_ != nullptr || !expect_start_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), std::min(deadline, absl::Now() + kStartWait));
  return agent_;
}

absl::StatusOr<std::shared_ptr<TorchAgentHost>> TorchAgentHost::Install(
    rpc::FunctionRegistry& registry, bool expect_start) {
  auto host = std::make_shared<TorchAgentHost>();
  {
    absl::MutexLock lock(&host->mu_);
    host->expect_start_ = expect_start;
  }
  std::weak_ptr<TorchAgentHost> weak = host;
  absl::Status s = registry.Register(
      kTorchMessage,
      [weak](const rpc::CallContext& ctx, int64_t type, std::string payload,
             std::vector<at::Tensor> tensors) -> rpc::Future<WireMessage> {
        std::shared_ptr<TorchAgent> agent;
        if (auto host = weak.lock()) agent = host->Current(ctx.deadline);
        if (agent == nullptr) {
          return rpc::MakeErrorFuture<WireMessage>(absl::UnavailableError(
              absl::StrCat("a TorchScript RPC reached worker '", ctx.agent->self().name,
                           "', where torch's RPC agent is not running (drop-in mode starts it in "
                           "init_rpc and stops it in shutdown)")));
        }
        return agent->Serve(type, std::move(payload), std::move(tensors));
      });
  if (!s.ok()) return s;
  return host;
}

absl::Status TorchAgentHost::Start(rpc::RpcAgent* agent, absl::Duration rpc_timeout) {
  absl::MutexLock lock(&mu_);
  expect_start_ = false;  // started, or failed to: nobody waits any more
  if (agent_ != nullptr)
    return absl::FailedPreconditionError("torch's RPC agent is started already");
  if (trpc::RpcAgent::isCurrentRpcAgentSet()) {
    return absl::FailedPreconditionError(
        "torch's own RPC agent runs in this process (torch.distributed.rpc.init_rpc before "
        "drop-in mode); baton cannot serve TorchScript's RPC beside it");
  }
  try {
    auto torch_agent = std::make_shared<TorchAgent>(agent, rpc_timeout);
    // As torch's _set_and_start_rpc_agent: scripted types by qualified name
    // from Python's compilation unit.
    torch_agent->setTypeResolver(
        std::make_shared<trpc::TypeResolver>([](const c10::QualifiedName& name) {
          auto& handler = trpc::PythonRpcHandler::getInstance();
          return c10::StrongTypePtr(handler.jitCompilationUnit(),
                                    handler.parseTypeFromStr(name.qualifiedName()));
        }));
    trpc::RpcAgent::setCurrentRpcAgent(torch_agent);
    torch_agent->start();
    agent_ = std::move(torch_agent);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("starting torch's RPC agent over baton: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status TorchAgentHost::Stop() {
  std::shared_ptr<TorchAgent> agent;
  {
    absl::MutexLock lock(&mu_);
    expect_start_ = false;
    agent = std::move(agent_);
  }
  if (agent == nullptr) return absl::OkStatus();
  try {
    agent->shutdown();
    // Scripted RRefs still held are released here, as torch's shutdown()
    // does; baton's shutdown agreement already settled the job.
    auto released = trpc::RRefContext::getInstance().destroyInstance(/*ignoreRRefLeak=*/true);
    if (!released.empty()) {
      pybind11::gil_scoped_acquire gil;  // they hold Python objects
      released.clear();
    }
    trpc::RpcAgent::setCurrentRpcAgent(nullptr);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("stopping torch's RPC agent: ", e.what()));
  }
  return absl::OkStatus();
}

pybind11::object TorchOwnerRRef(const pybind11::object& value, const pybind11::object& type_hint,
                                const std::string& value_type) {
  namespace py = pybind11;
  if (!value_type.empty()) {
    c10::TypePtr type;
    {
      py::gil_scoped_release nogil;  // torch's type parser takes the GIL itself
      type = trpc::PythonRpcHandler::getInstance().parseTypeFromStr(value_type);
    }
    c10::IValue ivalue = torch::jit::toIValue(value, type);
    auto rref = trpc::RRefContext::getInstance().createOwnerRRef(type);
    rref->setValue(std::move(ivalue));
    return py::cast(trpc::PyRRef(std::move(rref)));
  }
  if (type_hint.is_none()) {
    if (auto module = torch::jit::as_module(value)) {
      auto rref = trpc::RRefContext::getInstance().createOwnerRRef(module->type());
      rref->setValue(module->_ivalue());
      return py::cast(trpc::PyRRef(std::move(rref)));
    }
  }
  return py::module_::import("torch._C._distributed_rpc").attr("PyRRef")(value, type_hint);
}

pybind11::tuple TorchForkForUser(const pybind11::object& owner) {
  namespace py = pybind11;
  if (!py::type::of(owner).is(py::type::of<trpc::PyRRef>())) {
    throw std::invalid_argument("a torch fork is made of a torch PyRRef");
  }
  auto rref = c10::static_intrusive_pointer_cast<trpc::RRef>(
      owner.cast<const trpc::PyRRef&>().toIValue().toRRef());
  if (!rref->isOwner()) throw std::invalid_argument("a torch fork for a user, of a torch user");
  const trpc::RRefForkData data = trpc::RRefContext::getInstance().prepareChildFork(rref);
  return py::make_tuple(data.ownerId_, data.rrefId_.createdOn_, data.rrefId_.localId_,
                        data.forkId_.createdOn_, data.forkId_.localId_, data.typeStr_);
}

pybind11::object TorchUserRRef(const pybind11::tuple& fork) {
  namespace py = pybind11;
  if (fork.size() != 6) throw std::invalid_argument("a torch fork is 6 values");
  auto& ctx = trpc::RRefContext::getInstance();
  const auto owner = fork[0].cast<trpc::worker_id_t>();
  const trpc::ForkId fork_id(fork[3].cast<trpc::worker_id_t>(), fork[4].cast<trpc::local_id_t>());
  const std::string type = fork[5].cast<std::string>();
  const trpc::RRefForkData data(
      owner, trpc::RRefId(fork[1].cast<trpc::worker_id_t>(), fork[2].cast<trpc::local_id_t>()),
      fork_id, owner, type);
  if (owner == ctx.getWorkerId())
    throw std::invalid_argument("a torch fork for a user, on its owner");
  c10::intrusive_ptr<trpc::RRef> rref;
  {
    // torch's type parser takes the GIL itself (and refuses a caller that
    // holds it), as its PyRRef._deserialize does.
    py::gil_scoped_release nogil;
    rref = ctx.getOrCreateRRef(data, trpc::PythonRpcHandler::getInstance().parseTypeFromStr(type));
    // The owner registered the fork before it answered: torch's way to say
    // a user is confirmed is the end of its pending state.
    ctx.addPendingUser(fork_id, rref);
    ctx.delPendingUser(fork_id);
  }
  return py::cast(trpc::PyRRef(std::move(rref)));
}

namespace {

// The conversion pybind11 tries when a value that is not a torch PyRRef is
// cast to one (TorchScript's argument and attribute conversion). It holds no
// state: baton's RRef class and its conversion are looked up in their module.
PyObject* BatonRRefToTorch(PyObject* obj, PyTypeObject* /*torch_type*/) {
  namespace py = pybind11;
  PyObject* api = PyImport_GetModule(py::str("baton.rpc.api").ptr());  // imported or null
  if (api == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  py::module_ module = py::reinterpret_steal<py::module_>(api);
  const int is_rref = PyObject_IsInstance(obj, module.attr("RRef").ptr());
  if (is_rref < 0) throw py::error_already_set();
  if (is_rref == 0) return nullptr;
  // An error (the owner unreachable, say) reaches the scripted call's caller.
  return module.attr("_torch_rref")(py::handle(obj)).release().ptr();
}

}  // namespace

void InstallRRefConversion() {
  namespace py = pybind11;
  py::object torch_rref = py::module_::import("torch._C._distributed_rpc").attr("PyRRef");
  py::detail::type_info* info =
      py::detail::get_type_info(reinterpret_cast<PyTypeObject*>(torch_rref.ptr()));
  if (info == nullptr) throw std::runtime_error("torch's PyRRef is not a pybind11 type here");
  auto& conversions = info->implicit_conversions;
  if (std::find(conversions.begin(), conversions.end(), &BatonRRefToTorch) == conversions.end()) {
    conversions.push_back(&BatonRRefToTorch);
  }
}

}  // namespace baton::python
