// Distributed autograd: forward graphs that cross workers through RPC are
// linked, and one backward pass runs across every worker that took part.
//
//   dist_autograd::Install(*registry);            // every worker, before RpcAgent::Create
//   {
//     dist_autograd::Context ctx(*agent);         // RAII; current on this thread
//     torch::Tensor y = agent->rpc_sync("w1", linear_fn, x);   // recorded
//     torch::Tensor loss = y.sum();
//     absl::Status s = dist_autograd::Backward(*agent, ctx.id(), {loss});
//     auto grads = dist_autograd::GetGradients(*agent, ctx.id());  // tensor -> grad
//   }                                             // released on every worker
//
// ## What is recorded
// Inside a context (on the thread that holds it, and inside remote code
// running for a request of that context), every RPC carries the context:
// rpc_sync/rpc_async arguments and results, remote() arguments, RRef method
// arguments and results, and to_here() results (calls a worker makes to
// itself through the agent included). For each message whose
// tensors require grad:
// - the sender records a *send function*: the gradient edges of those
//   tensors, under a message id unique to the sender;
// - the receiver gives the received tensors a *recv function*
//   (RecvRpcBackward) as their grad_fn, which remembers the sender and its
//   message id. The received tensors require grad.
// A message whose tensors need no grad still carries the context, so remote
// code that creates grad-requiring tensors (a remote layer's parameters) is
// recorded, and so is its reply. Every worker a message went to or came from
// is remembered as a participant of the context.
//
// ## Backward: the mode ("FAST" mode, as PyTorch calls it)
// Backward(ctx, roots) on worker A:
// 1. A runs LibTorch's engine locally from the roots (gradient 1 each). The
//    engine's outputs are the leaves reachable from the roots (their
//    AccumulateGrad nodes) and the recv functions reachable from them; the
//    gradients reaching them are *captured*, not applied: nothing is
//    accumulated into .grad, and recv functions do not run.
// 2. Leaf gradients are added to the context's gradients on A.
// 3. The gradients captured at each recv function are sent to the worker
//    that sent the tensors, addressed to its send function (one message per
//    recv function; an input with no gradient sends zeros).
// 4. When a worker receives gradients for one of its send functions, it does
//    steps 1-3 from that send function's edges, and answers once its own
//    outgoing gradient messages are answered. No thread waits meanwhile.
// 5. Backward returns when every gradient message it caused was answered, or
//    with the first error, annotated with the context id and the workers on
//    the path.
// Dependencies are computed per local run, over the local graph below the
// run's roots: a worker runs once per gradient message it receives. Nodes
// shared by two runs (a tensor used locally and also sent) run once per run,
// each with its part of the gradient; the sums are the same as one pass
// because backward functions are linear in their incoming gradient. Runs of
// one context on one worker are serialized; runs of different contexts are
// concurrent.
//
// ## Hooks at the leaves
// Step 2 runs the leaves' hooks (tensor hooks, their accumulators' pre- and
// post-hooks) inside one run of LibTorch's engine, as torch's distributed
// engine runs them inside its own: a callback a hook queues
// (Engine::queue_callback) runs when the step ends, before the pass goes
// on. Meanwhile each leaf whose accumulator has post-hooks, of this step or
// with a gradient in the context from an earlier one, holds the context's
// gradient in `.grad`; after the step the context takes what `.grad` then
// holds, and `.grad` is what it was before (D2 holds outside the step).
// That is what torch's DDP reducer needs: its post-hooks read the
// gradients, and a callback averages them over the trainers and writes
// them back, in the step where the last of them arrived (torch's reducer
// reads them through torch's own context). A leaf with post-hooks must
// therefore not be in two passes at once (DDP's parameters never are).
//
// ## Guarantees (tested by name in tests/dist_autograd/dist_autograd_test.cc)
// D1 Gradients equal single-process LibTorch autograd on the same
//    computation (up to floating-point summation order).
// D2 Nothing accumulates into .grad; each context has its own gradients.
// D3 A context's graph (send functions, received tensors' history) lives
//    until the context is released; retain_graph=false only forbids a second
//    Backward on the same context.
// D4 When a Context ends, it is released on every worker that took part:
//    participants learn it from the workers they exchanged messages with,
//    transitively; if one of them is dead, the release is broadcast to every
//    other worker so that nobody behind it keeps the context. If the worker
//    that created a context dies, every participant releases it once the
//    agent confirms the death (Runtime::AddPeerFailureListener; within
//    about 2 s of the evidence: its stream cancelled, its process gone; or
//    at once when a restarted incarnation of its rank calls). Context ids
//    carry the creator's incarnation, so a restarted worker's contexts never
//    reuse its predecessor's ids, and only the dead incarnation's contexts
//    are released.
// D5 A message for a context that was already released on its receiver fails
//    with FAILED_PRECONDITION naming the context and worker, instead of
//    silently creating it again (which would leak it).
// D6 An error anywhere in backward reaches the caller of Backward, naming the
//    context id and the worker where it happened; every wait is bounded by
//    the RPC timeout.
//
// ## Not supported
// - Higher-order gradients (create_graph) across workers.
// - Calls a worker makes to itself through the owner-local RRef shortcuts
//   (remote() on self, methods of an RRef one owns): their arguments do not
//   travel, keep their local autograd history and need no recording.
// - Constructor arguments of remote objects (remote<C>()) are not recorded.
// - Continuations (Future::Then) and threads started by remote code do not
//   inherit the context: only the remote function's own thread does.
// - Using a tensor received in one context in the backward of another
//   context fails with FAILED_PRECONDITION.
// - Sparse gradients are densified by LibTorch's engine as usual; they are
//   not sent in sparse form.
//
// Thread-safety: all functions are safe to call concurrently from any
// thread. A Context is bound to the thread that created it: create and
// destroy it on the same thread. Several contexts may be open on several
// threads at once (each thread has at most one current context; nesting
// restores the outer one).
#ifndef BATON_DIST_AUTOGRAD_DIST_AUTOGRAD_H_
#define BATON_DIST_AUTOGRAD_DIST_AUTOGRAD_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/agent.h"
#include "rpc/function.h"

namespace baton::dist_autograd {

namespace internal {
class Container;
struct AgentLink;
}  // namespace internal

// Installs distributed autograd on a worker's registry: the call hook and the
// handlers for gradient and release messages. Call once per registry, on
// every worker, before RpcAgent::Create. Returns ALREADY_EXISTS if installed.
absl::Status Install(rpc::FunctionRegistry& registry);

// The gradients a context accumulated on this worker, keyed by tensor
// identity (the leaf tensor object, not its value).
class GradientMap {
 public:
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  // The gradient of `t`, or an undefined tensor if it has none here.
  at::Tensor Get(const at::Tensor& t) const;
  bool Contains(const at::Tensor& t) const { return index_.contains(t.unsafeGetTensorImpl()); }
  // (leaf tensor, gradient) pairs, in the order the leaves first got one.
  const std::vector<std::pair<at::Tensor, at::Tensor>>& items() const { return items_; }

  // Adds `grad` to the gradient of `leaf` (out of place).
  void Accumulate(const at::Tensor& leaf, const at::Tensor& grad);
  // Replaces the gradient of `leaf`.
  void Set(const at::Tensor& leaf, at::Tensor grad);

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> items_;
  absl::flat_hash_map<const void*, size_t> index_;
};

// A distributed autograd context: created with a job-unique id and made
// current on this thread; released on every participating worker when
// destroyed. Throws baton::Error (FAILED_PRECONDITION) if dist_autograd is
// not installed on the agent's registry. A Context may outlive its agent:
// once the agent shut down, its destruction releases it locally only (the
// peers' copies go with their agents, or through D4 when this one died).
// REQUIRES: destroyed on the thread that created it.
class Context {
 public:
  explicit Context(rpc::RpcAgent& agent);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int64_t id() const { return id_; }

 private:
  std::shared_ptr<internal::AgentLink> link_;  // the agent, until its teardown
  std::shared_ptr<internal::Container> container_;
  int64_t id_;
  const internal::Container* previous_container_;
  int64_t previous_id_;
};

// The context current on this thread for `agent`, or 0.
int64_t CurrentContextId(rpc::RpcAgent& agent);

// Makes a context this worker holds current on this thread for the scope's
// lifetime, and the previous one current again after it: for work of a
// context that continues on another thread than the one holding its Context
// (TorchScript's forks and continuations in drop-in mode). Messages sent in
// the scope are recorded as in the context's own thread.
// REQUIRES: destroyed on the thread that entered it.
class ContextScope {
 public:
  // NOT_FOUND naming the context and worker if this worker does not hold it
  // (never made here, nor took part in it, or released).
  static absl::StatusOr<std::unique_ptr<ContextScope>> Enter(rpc::RpcAgent& agent,
                                                             int64_t context_id);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  ContextScope(const internal::Container* previous_container, int64_t previous_id)
      : previous_container_(previous_container), previous_id_(previous_id) {}
  const internal::Container* previous_container_;
  int64_t previous_id_;
};

// Runs the backward pass from `roots` (each a tensor of one element that
// requires grad, seeded with gradient 1) across every worker that took part
// in context `context_id`, and returns when all of it finished. Errors:
// NOT_FOUND unknown context on this worker; INVALID_ARGUMENT a bad root;
// FAILED_PRECONDITION a second Backward after one without retain_graph;
// otherwise the first error of any worker's part, annotated with the context
// id and worker. Bounded by `timeout` (0: the agent's timeouts.rpc).
absl::Status Backward(rpc::RpcAgent& agent, int64_t context_id,
                      const std::vector<at::Tensor>& roots, bool retain_graph = false,
                      absl::Duration timeout = absl::ZeroDuration());

// The gradients context `context_id` accumulated on this worker (a copy of
// the map; the tensors are shared). NOT_FOUND for an unknown context.
absl::StatusOr<GradientMap> GetGradients(rpc::RpcAgent& agent, int64_t context_id);

// One gradient of a context on this worker: undefined if `leaf` has none.
// NOT_FOUND for an unknown context.
absl::StatusOr<at::Tensor> GetGradient(rpc::RpcAgent& agent, int64_t context_id,
                                       const at::Tensor& leaf);
// Replaces the gradient of `leaf` in a context on this worker (e.g. DDP's
// averaged gradient in the DDP+RPC hybrid, dist_autograd/ddp_gradients.h).
absl::Status SetGradient(rpc::RpcAgent& agent, int64_t context_id, const at::Tensor& leaf,
                         at::Tensor grad);

// Debugging and leak checks: the contexts this worker currently holds.
std::vector<int64_t> LiveContexts(rpc::RpcAgent& agent);

// Debugging: backward passes running on this worker now (torch's
// "num_current_backward_passes"): each one started here, from Backward()'s
// start to its end, and the local part of each one started elsewhere while
// it runs here.
int BackwardPassesRunning(rpc::RpcAgent& agent);

}  // namespace baton::dist_autograd

#endif  // BATON_DIST_AUTOGRAD_DIST_AUTOGRAD_H_
