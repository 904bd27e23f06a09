// Per-worker bookkeeping of distributed autograd (not a public header): the
// contexts this worker holds, their send functions, participants and
// gradients; the call hook that records send/recv functions; and the recv
// autograd node. See dist_autograd/dist_autograd.h for the protocol.
//
// Thread-safety: Container and ContextState are safe for concurrent use.
// ContextState::exec_mu() serializes the local engine runs of one context.
#ifndef BATON_DIST_AUTOGRAD_INTERNAL_CONTAINER_H_
#define BATON_DIST_AUTOGRAD_INTERNAL_CONTAINER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/function.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/torch_compat.h"
#include "dist_autograd/dist_autograd.h"
#include "rpc/agent.h"
#include "rpc/call_hook.h"

namespace baton::dist_autograd::internal {

inline constexpr char kExtension[] = "dist_autograd";
inline constexpr char kPropagateFn[] = "__dist_autograd.propagate";
inline constexpr char kReleaseFn[] = "__dist_autograd.release";

// The gradient handler's typed signature: (context id, the receiver's
// send-function message id, one gradient per edge). The release handler is a
// raw protocol handler (payload: proto::ReleaseContext) that runs inline.
const rpc::Function<bool(int64_t, int64_t, std::vector<at::Tensor>)>& PropagateFunction();

// Context and send-function message ids:
//   worker id (16 bits) | creator's incarnation mod 1024 (10) | counter (38)
// A restarted incarnation (Runtime::incarnation) never reuses the ids of
// the 511 before it. The counter wraps after 2^38 ids of one incarnation,
// and an id collides only with a context that old still alive.
inline constexpr int kIncarnationBits = 10;
inline constexpr int kCounterBits = 38;
inline int64_t MakeId(int worker, int64_t incarnation, uint64_t counter) {
  return (int64_t{worker} << 48) |
         (static_cast<int64_t>(static_cast<uint64_t>(incarnation) &
                               ((uint64_t{1} << kIncarnationBits) - 1))
          << kCounterBits) |
         static_cast<int64_t>(counter & ((uint64_t{1} << kCounterBits) - 1));
}
inline int CreatorOf(int64_t id) { return static_cast<int>(id >> 48); }
// Whether `id` was made by `incarnation` of its creator or by one of the
// 511 incarnations before it (incarnations wrap at 1024).
inline bool MadeByOrBefore(int64_t id, int64_t incarnation) {
  const uint64_t mask = (uint64_t{1} << kIncarnationBits) - 1;
  const uint64_t made = (static_cast<uint64_t>(id) >> kCounterBits) & mask;
  return ((static_cast<uint64_t>(incarnation) - made) & mask) < (mask + 1) / 2;
}

// The grad_fn of tensors received in a context. It is never run by the
// engine: distributed backward captures the gradients that reach it and
// sends them to `sender` (see RunLocal). Running it means someone called
// local backward on a graph that crosses workers, which is an error.
class RecvRpcBackward : public torch::autograd::Node {
 public:
  RecvRpcBackward(int64_t context_id, int sender, int64_t sender_message_id)
      : context_id_(context_id), sender_(sender), sender_message_id_(sender_message_id) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  // torch's name for the node that plays this role, so that graph tools
  // and programs that look for it by name find it.
  std::string name() const override { return "torch::distributed::autograd::RecvRpcBackward"; }

  int64_t context_id() const { return context_id_; }
  int sender() const { return sender_; }
  int64_t sender_message_id() const { return sender_message_id_; }

 private:
  const int64_t context_id_;
  const int sender_;
  const int64_t sender_message_id_;
};

class ContextState {
 public:
  explicit ContextState(int64_t id) : id_(id) {}
  int64_t id() const { return id_; }

  void AddParticipant(int worker);
  std::vector<int> Participants() const;

  void AddSend(int64_t message_id, torch::autograd::edge_list edges);
  // The edges of a send function; NOT_FOUND if this context has none by that id.
  absl::StatusOr<torch::autograd::edge_list> SendEdges(int64_t message_id) const;
  size_t num_sends() const;
  // Every send function, by message id (a copy).
  std::vector<std::pair<int64_t, torch::autograd::edge_list>> Sends() const;

  // The recv function of a message received in this context, kept while
  // the context lives (the received tensors' history, D3).
  void AddRecv(torch_compat::NodePtr<RecvRpcBackward> node);
  std::vector<torch_compat::NodePtr<RecvRpcBackward>> Recvs() const;

  void Accumulate(const at::Tensor& leaf, const at::Tensor& grad);
  GradientMap Gradients() const;
  at::Tensor Gradient(const at::Tensor& leaf) const;
  void SetGradient(const at::Tensor& leaf, at::Tensor grad);

  // Marks the start of a Backward from this worker. FAILED_PRECONDITION if a
  // previous one ran without retain_graph.
  absl::Status BeginBackward(bool retain_graph);

  absl::Mutex& exec_mu() { return exec_mu_; }

  // While a Backward that started on this worker under a profiler runs: the
  // thread-local state of the thread that called it, so that the local
  // runs of its gradients arriving here record into that profile (torch's
  // distributed engine does the same). Null otherwise.
  void set_profiled_pass(std::shared_ptr<const at::ThreadLocalState> state);
  std::shared_ptr<const at::ThreadLocalState> profiled_pass() const;

 private:
  const int64_t id_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<int> participants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, torch::autograd::edge_list> sends_ ABSL_GUARDED_BY(mu_);
  std::vector<torch_compat::NodePtr<RecvRpcBackward>> recvs_ ABSL_GUARDED_BY(mu_);
  GradientMap grads_ ABSL_GUARDED_BY(mu_);
  bool graph_released_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const at::ThreadLocalState> profiled_pass_ ABSL_GUARDED_BY(mu_);
  absl::Mutex exec_mu_;
};

// The agent a Context was made on, until that agent tears down (a shutdown
// hook clears it). A Context holds this, not the agent, so that it may
// outlive the agent: under `mu`, `agent` is either alive or null.
struct AgentLink {
  absl::Mutex mu;
  rpc::Runtime* agent ABSL_GUARDED_BY(mu) = nullptr;
};

class Container : public std::enable_shared_from_this<Container> {
 public:
  Container() = default;

  // The link to `agent`, one per agent (made on first use).
  std::shared_ptr<AgentLink> LinkTo(rpc::Runtime& agent);

  // A new context created by incarnation `incarnation` of worker `self`
  // (not current anywhere yet).
  std::shared_ptr<ContextState> Create(int self, int64_t incarnation);
  // The context, or null.
  std::shared_ptr<ContextState> Find(int64_t id) const;
  // The context, created if this worker never saw it. FAILED_PRECONDITION if
  // it was released here (guarantee D5); RESOURCE_EXHAUSTED if this worker
  // already holds 65536 contexts.
  absl::StatusOr<std::shared_ptr<ContextState>> GetOrCreate(int64_t id, rpc::Runtime* agent);
  // Releases, here and on their participants, the contexts that
  // `incarnation` of `creator`, or an earlier one, created (it died:
  // guarantee D4). Returns how many.
  int ReleaseCreatedBy(rpc::Runtime* agent, int creator, int64_t incarnation);
  // Removes the context here (remembering that it was released) and sends
  // the release to its participants except `from` (-1: none). No-op if absent.
  void Release(rpc::Runtime* agent, int64_t id, int from);
  std::vector<int64_t> Ids() const;

  int64_t NextMessageId(int self, int64_t incarnation) {
    return MakeId(self, incarnation, next_message_.fetch_add(1));
  }

  // Backward passes running on this worker (BackwardPassesRunning): one
  // started here, until it ends; the local part of one started elsewhere,
  // while it runs. A PassScope counts one for its lifetime.
  class PassScope {
   public:
    explicit PassScope(Container& c) : c_(c) { c_.passes_.fetch_add(1); }
    ~PassScope() { c_.passes_.fetch_sub(1); }
    PassScope(const PassScope&) = delete;
    PassScope& operator=(const PassScope&) = delete;

   private:
    Container& c_;
  };
  int passes() const { return passes_.load(); }

  // The context current on this thread, if it belongs to this container.
  int64_t Current() const;
  // Makes `id` current on this thread for `c` (0: none); returns nothing.
  static void SetCurrent(const Container* c, int64_t id);
  static const Container* CurrentContainer();
  static int64_t CurrentId();

 private:
  void SendRelease(rpc::Runtime* agent, int64_t id, int to, bool broadcast_if_dead);

  std::atomic<uint64_t> next_context_{1};
  std::atomic<uint64_t> next_message_{1};
  std::atomic<int> passes_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int64_t, std::shared_ptr<ContextState>> contexts_ ABSL_GUARDED_BY(mu_);
  // Recently released ids (bounded), so late messages cannot resurrect them.
  absl::flat_hash_set<int64_t> released_ ABSL_GUARDED_BY(mu_);
  std::deque<int64_t> released_order_ ABSL_GUARDED_BY(mu_);
  // Agents this container listens to for peer failures (once each).
  absl::flat_hash_set<const rpc::Runtime*> watched_ ABSL_GUARDED_BY(mu_);
  // Links of running agents; a link leaves when its agent tears down.
  absl::flat_hash_map<const rpc::Runtime*, std::shared_ptr<AgentLink>> links_ ABSL_GUARDED_BY(mu_);
};

// The call hook: tags messages sent in a context and records send/recv
// functions (see dist_autograd.h, "What is recorded").
class AutogradHook : public rpc::CallHook {
 public:
  explicit AutogradHook(std::weak_ptr<Container> container) : container_(std::move(container)) {}
  absl::Status OnSend(const rpc::MessageInfo& message, const std::vector<at::Tensor>& tensors,
                      std::map<std::string, std::string>& extensions) override;
  absl::Status OnReceive(const rpc::MessageInfo& message, const std::vector<at::Tensor*>& tensors,
                         const std::map<std::string, std::string>& extensions) override;
  std::unique_ptr<rpc::CallScope> EnterCall(
      const rpc::MessageInfo& request,
      const std::map<std::string, std::string>& extensions) override;

 private:
  std::weak_ptr<Container> container_;
};

// One message of gradients for a send function on another worker.
struct Outgoing {
  int to = -1;
  int64_t context_id = 0;
  int64_t message_id = 0;
  std::vector<at::Tensor> grads;
};

// Steps 1-3 of the mode: runs the local engine from `roots` with `grads`,
// accumulates leaf gradients into `ctx`, and returns the gradients to send.
// An error of the engine names this worker (`self`, its rank) as torch's
// do: "Error on Node <rank>: <the node's error>".
absl::StatusOr<std::vector<Outgoing>> RunLocal(ContextState& ctx, int self,
                                               const torch::autograd::edge_list& roots,
                                               const std::vector<at::Tensor>& grads);

// Sends `outgoing` and completes when all are answered (first error wins).
rpc::Future<bool> SendGradients(rpc::Runtime& agent, std::vector<Outgoing> outgoing,
                                absl::Time deadline);

// Registers the propagate and release handlers on `registry`.
absl::Status RegisterHandlers(rpc::FunctionRegistry& registry, std::weak_ptr<Container> c);

}  // namespace baton::dist_autograd::internal

#endif  // BATON_DIST_AUTOGRAD_INTERNAL_CONTAINER_H_
