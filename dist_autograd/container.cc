// Bookkeeping and the call hook of distributed autograd.
#include <torch/csrc/autograd/variable.h>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "dist_autograd/context_graph.h"
#include "dist_autograd/internal/container.h"
#include "obs/state.h"
#include "proto/dist_autograd.pb.h"

namespace baton::dist_autograd {
namespace internal {
namespace {

thread_local const Container* tl_container = nullptr;
thread_local int64_t tl_context = 0;

// Released ids remembered per worker (guarantee D5); older ones are forgotten.
constexpr size_t kRememberReleased = 1 << 16;
// Contexts other workers may open here at once: a peer that sends messages
// for ever new context ids (and never releases them) cannot grow a worker
// without bound. Far above what a job holds live (one or a few per root).
constexpr size_t kMaxLiveContexts = 1 << 16;

std::string WorkerName(const rpc::Runtime* agent) {
  return agent != nullptr ? agent->self().name : std::string("?");
}

absl::StatusOr<proto::AutogradTag> ParseTag(const std::string& bytes) {
  proto::AutogradTag tag;
  if (!tag.ParseFromString(bytes) || tag.context_id() == 0) {
    return absl::DataLossError("undecodable distributed autograd tag");
  }
  return tag;
}

}  // namespace

torch::autograd::variable_list RecvRpcBackward::apply(torch::autograd::variable_list&&) {
  throw Error(absl::FailedPreconditionError(absl::StrCat(
      "local backward reached a tensor received over RPC in distributed autograd context ",
      context_id_, ": run dist_autograd::Backward for graphs that cross workers")));
}

void ContextState::AddParticipant(int worker) {
  absl::MutexLock lock(&mu_);
  participants_.insert(worker);
}

std::vector<int> ContextState::Participants() const {
  absl::MutexLock lock(&mu_);
  return std::vector<int>(participants_.begin(), participants_.end());
}

void ContextState::AddSend(int64_t message_id, torch::autograd::edge_list edges) {
  absl::MutexLock lock(&mu_);
  sends_[message_id] = std::move(edges);
}

absl::StatusOr<torch::autograd::edge_list> ContextState::SendEdges(int64_t message_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sends_.find(message_id);
  if (it == sends_.end()) {
    return absl::NotFoundError(absl::StrCat("no send function with message id ", message_id,
                                            " in distributed autograd context ", id_));
  }
  return it->second;
}

std::vector<std::pair<int64_t, torch::autograd::edge_list>> ContextState::Sends() const {
  absl::MutexLock lock(&mu_);
  return {sends_.begin(), sends_.end()};
}

void ContextState::AddRecv(torch_compat::NodePtr<RecvRpcBackward> node) {
  absl::MutexLock lock(&mu_);
  recvs_.push_back(std::move(node));
}

std::vector<torch_compat::NodePtr<RecvRpcBackward>> ContextState::Recvs() const {
  absl::MutexLock lock(&mu_);
  return recvs_;
}

size_t ContextState::num_sends() const {
  absl::MutexLock lock(&mu_);
  return sends_.size();
}

void ContextState::Accumulate(const at::Tensor& leaf, const at::Tensor& grad) {
  absl::MutexLock lock(&mu_);
  grads_.Accumulate(leaf, grad);
}

GradientMap ContextState::Gradients() const {
  absl::MutexLock lock(&mu_);
  return grads_;
}

at::Tensor ContextState::Gradient(const at::Tensor& leaf) const {
  absl::MutexLock lock(&mu_);
  return grads_.Get(leaf);
}

void ContextState::SetGradient(const at::Tensor& leaf, at::Tensor grad) {
  absl::MutexLock lock(&mu_);
  grads_.Set(leaf, std::move(grad));
}

void ContextState::set_profiled_pass(std::shared_ptr<const at::ThreadLocalState> state) {
  absl::MutexLock lock(&mu_);
  profiled_pass_ = std::move(state);
}

std::shared_ptr<const at::ThreadLocalState> ContextState::profiled_pass() const {
  absl::MutexLock lock(&mu_);
  return profiled_pass_;
}

absl::Status ContextState::BeginBackward(bool retain_graph) {
  absl::MutexLock lock(&mu_);
  if (graph_released_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "distributed autograd context ", id_,
        ": backward already ran without retain_graph; pass retain_graph=true to the first "
        "Backward to run it again"));
  }
  if (!retain_graph) graph_released_ = true;
  return absl::OkStatus();
}

std::shared_ptr<ContextState> Container::Create(int self, int64_t incarnation) {
  const int64_t id = MakeId(self, incarnation, next_context_.fetch_add(1));
  auto state = std::make_shared<ContextState>(id);
  absl::MutexLock lock(&mu_);
  contexts_[id] = state;
  return state;
}

std::shared_ptr<ContextState> Container::Find(int64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(id);
  return it == contexts_.end() ? nullptr : it->second;
}

absl::StatusOr<std::shared_ptr<ContextState>> Container::GetOrCreate(int64_t id,
                                                                     rpc::Runtime* agent) {
  // A participant releases the contexts of a creator that dies (D4): listen
  // to this agent's peer failures from the first context it brings.
  bool watch = false;
  {
    absl::MutexLock lock(&mu_);
    watch = agent != nullptr && watched_.insert(agent).second;
  }
  if (watch) {
    std::weak_ptr<Container> weak = weak_from_this();
    agent->AddPeerFailureListener([weak, agent](const rpc::PeerFailure& f) {
      if (auto c = weak.lock()) c->ReleaseCreatedBy(agent, f.peer, f.incarnation);
    });
  }
  absl::MutexLock lock(&mu_);
  auto it = contexts_.find(id);
  if (it != contexts_.end()) return it->second;
  if (released_.contains(id)) {
    return absl::FailedPreconditionError(absl::StrCat("distributed autograd context ", id,
                                                      " was already released on worker '",
                                                      WorkerName(agent), "'"));
  }
  if (contexts_.size() >= kMaxLiveContexts) {
    return absl::ResourceExhaustedError(
        absl::StrCat("worker '", WorkerName(agent), "' already holds ", contexts_.size(),
                     " distributed autograd contexts, the most it keeps; context ", id,
                     " was refused (contexts end when their dist_autograd::Context does)"));
  }
  auto state = std::make_shared<ContextState>(id);
  contexts_[id] = state;
  return state;
}

std::shared_ptr<AgentLink> Container::LinkTo(rpc::Runtime& agent) {
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(&agent);
    if (it != links_.end()) return it->second;
  }
  auto link = std::make_shared<AgentLink>();
  if (!agent.running()) return link;  // already torn down: no agent to use
  {
    absl::MutexLock lock(&link->mu);
    link->agent = &agent;
  }
  {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = links_.emplace(&agent, link);
    if (!inserted) return it->second;
  }
  std::weak_ptr<Container> weak = weak_from_this();
  rpc::Runtime::ShutdownHook hook;
  hook.release = [weak, link, key = &agent] {
    {
      absl::MutexLock lock(&link->mu);
      link->agent = nullptr;
    }
    if (auto c = weak.lock()) {
      absl::MutexLock lock(&c->mu_);
      c->links_.erase(key);
    }
  };
  agent.AddShutdownHook(std::move(hook));
  return link;
}

void Container::Release(rpc::Runtime* agent, int64_t id, int from) {
  std::shared_ptr<ContextState> state;
  {
    absl::MutexLock lock(&mu_);
    auto it = contexts_.find(id);
    if (it != contexts_.end()) {
      state = std::move(it->second);
      contexts_.erase(it);
    }
    if (released_.insert(id).second) {
      released_order_.push_back(id);
      if (released_order_.size() > kRememberReleased) {
        released_.erase(released_order_.front());
        released_order_.pop_front();
      }
    }
  }
  if (state == nullptr || agent == nullptr || !agent->running()) return;
  const int self = agent->self().id;
  for (int p : state->Participants()) {
    if (p != from && p != self) SendRelease(agent, id, p, /*broadcast_if_dead=*/true);
  }
  // `state` (its send functions and thus the graph) is freed here, outside mu_.
}

void Container::SendRelease(rpc::Runtime* agent, int64_t id, int to, bool broadcast_if_dead) {
  proto::ReleaseContext msg;
  msg.set_context_id(id);
  rpc::Payload payload;
  payload.bytes = msg.SerializeAsString();
  rpc::CallOptions opts;
  opts.timeout = std::min(agent->options().timeouts.rpc, agent->options().timeouts.shutdown);
  rpc::Future<rpc::Payload> f = agent->CallRaw(to, kReleaseFn, "", std::move(payload), opts);
  if (!broadcast_if_dead) return;
  auto self = weak_from_this();
  f.OnReady([self, agent, id, to](const absl::StatusOr<rpc::Payload>& r) {
    if (r.ok()) return;
    const absl::StatusCode code = r.status().code();
    if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) {
      return;
    }
    // `to` is dead or stuck: workers only it knew of would keep the context.
    auto c = self.lock();
    if (c == nullptr || !agent->running()) return;
    for (const auto& w : agent->workers()) {
      if (w.id != to && w.id != agent->self().id) {
        c->SendRelease(agent, id, w.id, /*broadcast_if_dead=*/false);
      }
    }
  });
}

int Container::ReleaseCreatedBy(rpc::Runtime* agent, int creator, int64_t incarnation) {
  std::vector<int64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, state] : contexts_) {
      if (CreatorOf(id) == creator && MadeByOrBefore(id, incarnation)) ids.push_back(id);
    }
  }
  for (int64_t id : ids) Release(agent, id, /*from=*/creator);
  return static_cast<int>(ids.size());
}

std::vector<int64_t> Container::Ids() const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> out;
  out.reserve(contexts_.size());
  for (const auto& [id, state] : contexts_) out.push_back(id);
  return out;
}

int64_t Container::Current() const { return tl_container == this ? tl_context : 0; }
void Container::SetCurrent(const Container* c, int64_t id) {
  tl_container = c;
  tl_context = id;
}
const Container* Container::CurrentContainer() { return tl_container; }
int64_t Container::CurrentId() { return tl_context; }

absl::Status AutogradHook::OnSend(const rpc::MessageInfo& message,
                                  const std::vector<at::Tensor>& tensors,
                                  std::map<std::string, std::string>& extensions) {
  if (absl::StartsWith(message.function, "__dist_autograd.")) return absl::OkStatus();
  auto c = container_.lock();
  if (c == nullptr) return absl::OkStatus();
  int64_t context_id = 0;
  if (message.is_request) {
    context_id = c->Current();
  } else if (message.request_extensions != nullptr) {
    auto it = message.request_extensions->find(kExtension);
    if (it != message.request_extensions->end()) {
      ASSIGN_OR_RETURN(auto tag, ParseTag(it->second));
      context_id = tag.context_id();
    }
  }
  if (context_id == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto state, c->GetOrCreate(context_id, message.runtime));
  (state)->AddParticipant(message.peer);
  proto::AutogradTag tag;
  tag.set_context_id(context_id);
  torch::autograd::edge_list edges;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined() && tensors[i].requires_grad()) {
      tag.add_grad_indices(static_cast<uint32_t>(i));
      edges.push_back(torch::autograd::impl::gradient_edge(tensors[i]));
    }
  }
  if (!edges.empty()) {
    const int self = message.runtime != nullptr ? message.runtime->self().id : 0;
    const int64_t incarnation = message.runtime != nullptr ? message.runtime->incarnation() : 0;
    const int64_t message_id = c->NextMessageId(self, incarnation);
    tag.set_message_id(message_id);
    (state)->AddSend(message_id, std::move(edges));
  }
  extensions[kExtension] = tag.SerializeAsString();
  return absl::OkStatus();
}

absl::Status AutogradHook::OnReceive(const rpc::MessageInfo& message,
                                     const std::vector<at::Tensor*>& tensors,
                                     const std::map<std::string, std::string>& extensions) {
  auto it = extensions.find(kExtension);
  if (it == extensions.end()) return absl::OkStatus();
  auto c = container_.lock();
  if (c == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto tag, ParseTag(it->second));
  auto state = c->GetOrCreate(tag.context_id(), message.runtime);
  if (!state.ok()) return state.status();
  (*state)->AddParticipant(message.peer);
  if (tag.grad_indices_size() == 0) return absl::OkStatus();
  auto node =
      torch_compat::MakeNode<RecvRpcBackward>(tag.context_id(), message.peer, tag.message_id());
  for (uint32_t index : tag.grad_indices()) {
    if (index >= tensors.size() || !tensors[index]->defined() ||
        !(tensors[index]->is_floating_point() || tensors[index]->is_complex())) {
      return absl::DataLossError(absl::StrCat(
          "distributed autograd tag names tensor ", index, " as requiring grad, but the message ",
          index >= tensors.size() ? "has fewer tensors" : "has no floating-point tensor there"));
    }
    at::Tensor& t = *tensors[index];
    if (t.requires_grad()) t.set_requires_grad(false);  // a leaf until now
    const uint32_t input_nr = node->add_input_metadata(t);
    torch::autograd::impl::set_gradient_edge(t, torch::autograd::Edge(node, input_nr));
  }
  (*state)->AddRecv(std::move(node));
  return absl::OkStatus();
}

namespace {

class AmbientContext : public rpc::CallScope {
 public:
  AmbientContext(const Container* c, int64_t id)
      : previous_container_(Container::CurrentContainer()), previous_id_(Container::CurrentId()) {
    Container::SetCurrent(c, id);
  }
  ~AmbientContext() override { Container::SetCurrent(previous_container_, previous_id_); }

 private:
  const Container* previous_container_;
  int64_t previous_id_;
};

}  // namespace

std::unique_ptr<rpc::CallScope> AutogradHook::EnterCall(
    const rpc::MessageInfo&, const std::map<std::string, std::string>& extensions) {
  auto c = container_.lock();
  int64_t id = 0;
  auto it = extensions.find(kExtension);
  if (c != nullptr && it != extensions.end()) {
    auto tag = ParseTag(it->second);
    if (tag.ok()) id = tag->context_id();
  }
  if (id == 0 && Container::CurrentId() == 0) return nullptr;  // nothing to set or clear
  return std::make_unique<AmbientContext>(id != 0 ? c.get() : nullptr, id);
}

}  // namespace internal

at::Tensor GradientMap::Get(const at::Tensor& t) const {
  auto it = index_.find(t.unsafeGetTensorImpl());
  return it == index_.end() ? at::Tensor() : items_[it->second].second;
}

void GradientMap::Accumulate(const at::Tensor& leaf, const at::Tensor& grad) {
  auto [it, inserted] = index_.emplace(leaf.unsafeGetTensorImpl(), items_.size());
  if (inserted) {
    items_.emplace_back(leaf, grad);
  } else {
    at::Tensor& g = items_[it->second].second;
    g = g + grad;
  }
}

void GradientMap::Set(const at::Tensor& leaf, at::Tensor grad) {
  auto [it, inserted] = index_.emplace(leaf.unsafeGetTensorImpl(), items_.size());
  if (inserted) {
    items_.emplace_back(leaf, std::move(grad));
  } else {
    items_[it->second].second = std::move(grad);
  }
}

absl::Status Install(rpc::FunctionRegistry& registry) {
  if (registry.GetExtension<internal::Container>() != nullptr) {
    return absl::AlreadyExistsError("dist_autograd is already installed on this registry");
  }
  auto container = std::make_shared<internal::Container>();
  RETURN_IF_ERROR(internal::RegisterHandlers(registry, container));
  registry.SetExtension(container);
  registry.AddCallHook(std::make_shared<internal::AutogradHook>(container));
  std::weak_ptr<internal::Container> weak = container;
  registry.AddMetricsCollector([weak](obs::MetricsWriter& w) {
    auto c = weak.lock();
    if (c == nullptr) return;
    w.Gauge("baton_autograd_contexts", "Distributed autograd contexts this worker holds.",
            static_cast<double>(c->Ids().size()));
  });
  // The hang report: open contexts and who takes part in each.
  registry.AddStateCollector([weak](obs::StateWriter& w) {
    auto c = weak.lock();
    if (c == nullptr) return;
    const std::vector<int64_t> ids = c->Ids();
    auto section = w.AddSection("dist_autograd");
    section.Field("contexts", static_cast<int64_t>(ids.size()));
    constexpr size_t kMaxListed = 32;
    for (size_t i = 0; i < ids.size() && i < kMaxListed; ++i) {
      auto ctx = c->Find(ids[i]);
      if (ctx == nullptr) continue;
      section.Line(absl::StrCat("context ", ids[i], ": participants [",
                                absl::StrJoin(ctx->Participants(), ","), "], ", ctx->num_sends(),
                                " send function(s)"));
    }
  });
  return absl::OkStatus();
}

namespace {

std::shared_ptr<internal::Container> ContainerOf(rpc::Runtime& agent) {
  return agent.registry().GetExtension<internal::Container>();
}

}  // namespace

Context::Context(rpc::RpcAgent& handle)
    : container_(ContainerOf(handle.runtime())),
      previous_container_(internal::Container::CurrentContainer()),
      previous_id_(internal::Container::CurrentId()) {
  if (container_ == nullptr) {
    throw Error(absl::FailedPreconditionError(
        "dist_autograd::Install was not called on this worker's function registry"));
  }
  rpc::Runtime& agent = handle.runtime();
  link_ = container_->LinkTo(agent);
  id_ = container_->Create(agent.self().id, agent.incarnation())->id();
  internal::Container::SetCurrent(container_.get(), id_);
}

Context::~Context() {
  internal::Container::SetCurrent(previous_container_, previous_id_);
  // Holding the link keeps the agent's teardown from passing its release
  // hook while the agent is used here; a null agent releases locally only.
  absl::MutexLock lock(&link_->mu);
  container_->Release(link_->agent, id_, /*from=*/-1);
}

int64_t CurrentContextId(rpc::RpcAgent& handle) {
  rpc::Runtime& agent = handle.runtime();
  auto c = ContainerOf(agent);
  return c == nullptr ? 0 : c->Current();
}

namespace {

absl::StatusOr<std::shared_ptr<internal::ContextState>> FindState(rpc::Runtime& agent,
                                                                  int64_t context_id) {
  auto c = ContainerOf(agent);
  if (c == nullptr) return absl::FailedPreconditionError("dist_autograd is not installed");
  auto state = c->Find(context_id);
  if (state == nullptr) {
    return absl::NotFoundError(absl::StrCat("Could not find autograd context with id: ", context_id,
                                            " on worker '", agent.self().name, "'"));
  }
  return state;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ContextScope>> ContextScope::Enter(rpc::RpcAgent& handle,
                                                                  int64_t context_id) {
  rpc::Runtime& agent = handle.runtime();
  ASSIGN_OR_RETURN(auto state, FindState(agent, context_id));
  std::unique_ptr<ContextScope> scope(
      new ContextScope(internal::Container::CurrentContainer(), internal::Container::CurrentId()));
  internal::Container::SetCurrent(ContainerOf(agent).get(), context_id);
  return scope;
}

ContextScope::~ContextScope() {
  internal::Container::SetCurrent(previous_container_, previous_id_);
}

const std::type_info& RecvFunctionType() { return typeid(internal::RecvRpcBackward); }

absl::StatusOr<ContextGraph> DescribeContext(rpc::RpcAgent& handle, int64_t context_id) {
  rpc::Runtime& agent = handle.runtime();
  ASSIGN_OR_RETURN(auto state, FindState(agent, context_id));
  ContextGraph graph;
  graph.id = context_id;
  graph.known_workers = (state)->Participants();
  graph.sends = (state)->Sends();
  for (auto& recv : (state)->Recvs()) {
    graph.recvs.emplace_back(recv->sender_message_id(), std::move(recv));
  }
  return graph;
}

absl::StatusOr<GradientMap> GetGradients(rpc::RpcAgent& handle, int64_t context_id) {
  rpc::Runtime& agent = handle.runtime();
  ASSIGN_OR_RETURN(auto state, FindState(agent, context_id));
  return (state)->Gradients();
}

absl::StatusOr<at::Tensor> GetGradient(rpc::RpcAgent& handle, int64_t context_id,
                                       const at::Tensor& leaf) {
  rpc::Runtime& agent = handle.runtime();
  ASSIGN_OR_RETURN(auto state, FindState(agent, context_id));
  return (state)->Gradient(leaf);
}

absl::Status SetGradient(rpc::RpcAgent& handle, int64_t context_id, const at::Tensor& leaf,
                         at::Tensor grad) {
  rpc::Runtime& agent = handle.runtime();
  ASSIGN_OR_RETURN(auto state, FindState(agent, context_id));
  if (!leaf.defined() || !grad.defined() || grad.sizes() != leaf.sizes() ||
      grad.scalar_type() != leaf.scalar_type()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetGradient in context ", context_id,
                     ": the gradient must match its tensor's shape and "
                     "dtype"));
  }
  (state)->SetGradient(leaf, std::move(grad));
  return absl::OkStatus();
}

std::vector<int64_t> LiveContexts(rpc::RpcAgent& handle) {
  rpc::Runtime& agent = handle.runtime();
  auto c = ContainerOf(agent);
  return c == nullptr ? std::vector<int64_t>() : c->Ids();
}

int BackwardPassesRunning(rpc::RpcAgent& handle) {
  rpc::Runtime& agent = handle.runtime();
  auto c = ContainerOf(agent);
  return c == nullptr ? 0 : c->passes();
}

}  // namespace baton::dist_autograd
