// Distributed backward ("FAST" mode, see dist_autograd.h): local engine runs
// that capture leaf and recv gradients, and the gradient messages between
// workers.
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "base/torch_compat.h"
#include "dist_autograd/internal/container.h"
#include "obs/trace.h"
#include "proto/dist_autograd.pb.h"

namespace baton::dist_autograd {
namespace internal {
namespace {

using torch::autograd::AccumulateGrad;
using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;

bool IsOutputNode(Node* n) {
  return dynamic_cast<AccumulateGrad*>(n) != nullptr ||
         dynamic_cast<RecvRpcBackward*>(n) != nullptr;
}

// The engine's outputs for a run from `roots`: every leaf accumulator and
// every recv function input reachable from them.
edge_list FindOutputs(const edge_list& roots) {
  edge_list outputs;
  absl::flat_hash_set<Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& r : roots) {
    if (seen.insert(r.function.get()).second) stack.push_back(r.function.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.is_valid() || !seen.insert(e.function.get()).second) continue;
      Node* f = e.function.get();
      if (dynamic_cast<AccumulateGrad*>(f) != nullptr) {
        outputs.emplace_back(e.function, 0);
      } else if (dynamic_cast<RecvRpcBackward*>(f) != nullptr) {
        for (uint32_t i = 0; i < f->num_inputs(); ++i) outputs.emplace_back(e.function, i);
      } else {
        stack.push_back(f);
      }
    }
  }
  return outputs;
}

// Whether a gradient may be kept as the context's gradient of `leaf`
// without a copy: no other leaf of this run was given the same tensor
// (`shared` is false) and it is laid out as the leaf is (dense: the leaf's
// strides, or contiguous). Otherwise the context keeps a copy: a kept
// gradient must not alias another leaf's or a view's storage, which an
// in-place change to one would change in the other. (torch decides by the
// tensor's reference count, which also catches a gradient a user's function
// kept a reference to; the count the engine leaves differs between torch
// releases, so baton looks at what it can see: this run's gradients.)
bool MayKeep(const at::Tensor& grad, const at::Tensor& leaf, bool shared) {
  if (shared) return false;
  if (grad.layout() != at::kStrided) return true;
  if (leaf.layout() == at::kStrided && leaf.is_non_overlapping_and_dense()) {
    return grad.strides() == leaf.strides();
  }
  return grad.is_contiguous();
}

at::Tensor CopyForLeaf(const at::Tensor& grad, const at::Tensor& leaf) {
  if (grad.layout() != at::kStrided) return grad.clone();
  if (leaf.layout() == at::kStrided && leaf.is_non_overlapping_and_dense()) {
    return at::empty_strided(leaf.sizes(), leaf.strides(), grad.options()).copy_(grad);
  }
  return grad.clone(at::MemoryFormat::Contiguous);
}

// At a leaf, what torch's distributed engine does instead of accumulating
// into `.grad`: the leaf's tensor hooks (`register_hook`; `leaf_hooks` is
// false when autograd's engine already ran them, see
// torch_compat::kEngineRunsLeafHooksOnCapture) and its accumulator's
// pre-hooks transform the gradient, the context accumulates
// the result (MayKeep, or a copy), then the accumulator's post-hooks run
// with it as their inputs (and no outputs, as torch passes them). `shared`:
// another leaf of this run got the same gradient tensor. Hooks may throw (a
// Python hook's exception); the caller reports that as the local backward's
// failure.
void AccumulateAtLeaf(ContextState& ctx, AccumulateGrad& acc, const at::Tensor& grad,
                      bool leaf_hooks, bool shared) {
  torch::autograd::variable_list grads{grad};
  if (leaf_hooks) {
    for (const auto& hook : torch::autograd::impl::hooks(acc.variable)) grads = (*hook)(grads);
  }
  for (const auto& hook : acc.pre_hooks()) grads = (*hook)(grads);
  if (!grads.empty() && grads[0].defined()) {
    const bool still_shared = shared && grads[0].is_same(grad);
    if (!MayKeep(grads[0], acc.variable, still_shared)) {
      grads[0] = CopyForLeaf(grads[0], acc.variable);
    }
    ctx.Accumulate(acc.variable, grads[0]);
  }
  if (acc.post_hooks().empty()) return;
  // The context's gradient in .grad while they run (AccumulateLeaves lent
  // it, and puts .grad back).
  acc.variable.mutable_grad() = ctx.Gradient(acc.variable);
  for (const auto& hook : acc.post_hooks()) (*hook)(torch::autograd::variable_list{}, grads);
}

// A leaf that step 2 accumulates: its accumulator and captured gradient.
struct Leaf {
  AccumulateGrad* acc;
  at::Tensor grad;
  bool by_engine;  // captured as an output of the engine's run
};

bool HasHooks(const Leaf& leaf) {
  return !leaf.acc->pre_hooks().empty() || !leaf.acc->post_hooks().empty() ||
         !torch::autograd::impl::hooks(leaf.acc->variable).empty();
}

// The node that step 2 runs as, inside an engine run of its own, so that
// the leaves' hooks find a graph task to queue callbacks on (see "Hooks at
// the leaves" in dist_autograd.h). Its one input is a placeholder.
class LeafStepNode final : public Node {
 public:
  explicit LeafStepNode(std::function<void()> body) : body_(std::move(body)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& /*unused*/) override {
    body_();
    return {};
  }
  std::string name() const override { return "baton::dist_autograd::LeafStep"; }

 private:
  std::function<void()> body_;
};

absl::Status LeafError(int self, const char* where, const char* what) {
  return absl::InternalError(
      absl::StrCat("local backward failed: Error on Node ", self, ": ", where, ": ", what));
}

bool HasPostHooks(const at::Tensor& leaf) {
  auto acc = torch::autograd::impl::try_get_grad_accumulator(leaf);
  return acc != nullptr && !acc->post_hooks().empty();
}

// Step 2: accumulates `leaves` into `ctx` with their hooks, inside an engine
// run when any has hooks. Meanwhile every leaf with post-hooks, of this run
// or with a gradient in the context from an earlier one (a callback may
// rewrite those too: DDP's last bucket can be ready in a later run than its
// first), holds the context's gradient in .grad; after the run the context
// takes what .grad holds, and .grad is given back. The first hook's error,
// or that of a callback a hook queued, is the local backward's.
absl::Status AccumulateLeaves(ContextState& ctx, int self, const std::vector<Leaf>& leaves) {
  // How many leaves were given each gradient tensor (MayKeep).
  absl::flat_hash_map<const void*, int> given;
  for (const Leaf& l : leaves) ++given[l.grad.unsafeGetTensorImpl()];
  absl::Status status;
  auto body = [&] {
    for (const Leaf& l : leaves) {
      try {
        AccumulateAtLeaf(ctx, *l.acc, l.grad,
                         !l.by_engine || !torch_compat::kEngineRunsLeafHooksOnCapture,
                         given[l.grad.unsafeGetTensorImpl()] > 1);
      } catch (const c10::Error& e) {
        status = LeafError(self, "a leaf's hook", e.what_without_backtrace());
        return;
      } catch (const std::exception& e) {
        status = LeafError(self, "a leaf's hook", e.what());
        return;
      }
    }
  };
  if (std::none_of(leaves.begin(), leaves.end(), HasHooks)) {
    body();
    return status;
  }
  // The leaves that hold the context's gradient in .grad, with their own.
  std::vector<std::pair<at::Tensor, at::Tensor>> own_grads;
  absl::flat_hash_set<const void*> lent;
  auto lend = [&](const at::Tensor& leaf) {
    if (!lent.insert(leaf.unsafeGetTensorImpl()).second) return;
    own_grads.emplace_back(leaf, leaf.grad());
    leaf.mutable_grad() = ctx.Gradient(leaf);
  };
  for (const Leaf& l : leaves) {
    if (!l.acc->post_hooks().empty()) lend(l.acc->variable);
  }
  const GradientMap held = ctx.Gradients();
  for (const auto& item : held.items()) {
    if (HasPostHooks(item.first)) lend(item.first);
  }
  auto node = torch_compat::MakeNode<LeafStepNode>(body);
  at::Tensor placeholder = at::zeros({});
  node->add_input_metadata(placeholder);
  try {
    // The default engine's own run, as in RunLocal (the graph is the one
    // node: it has no accumulator for accumulate_grad to act on).
    torch::autograd::Engine& engine = torch::autograd::Engine::get_default_engine();
    engine.torch::autograd::Engine::execute({Edge(node, 0)}, {placeholder}, /*keep_graph=*/false,
                                            /*create_graph=*/false, /*accumulate_grad=*/true, {});
  } catch (const c10::Error& e) {
    if (status.ok()) status = LeafError(self, "a leaf hook's callback", e.what_without_backtrace());
  } catch (const std::exception& e) {
    if (status.ok()) status = LeafError(self, "a leaf hook's callback", e.what());
  }
  for (auto& [leaf, own] : own_grads) {
    at::Tensor now = leaf.grad();
    if (now.defined()) ctx.SetGradient(leaf, now);
    leaf.mutable_grad() = std::move(own);
  }
  return status;
}

// Gradients captured at one recv function, by input.
struct RecvGrads {
  torch_compat::NodePtr<> node;
  std::vector<at::Tensor> grads;
};

// The job's timeline (obs/trace.h): a slice of category "autograd" for a
// backward pass, or one worker's local part of it.
void TraceAutograd(rpc::Runtime& agent, const std::string& name, int64_t context_id,
                   absl::Time start, const absl::Status& status) {
  obs::TraceRecorder* trace = agent.trace();
  if (trace == nullptr) return;
  trace->Slice(name, "autograd", start, absl::Now(),
               {{"context", absl::StrCat(context_id)},
                {"status", std::string(absl::StatusCodeToString(status.code()))}});
}

}  // namespace

absl::StatusOr<std::vector<Outgoing>> RunLocal(ContextState& ctx, int self, const edge_list& roots,
                                               const std::vector<at::Tensor>& grads) {
  if (roots.size() != grads.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", roots.size(), " gradients, got ", grads.size()));
  }
  absl::MutexLock exec(&ctx.exec_mu());
  // Root edges that point straight at an output are captured here; the
  // engine would run a single such root instead of capturing it.
  struct Captured {
    Edge edge;
    at::Tensor grad;
    bool by_engine;  // an output of the engine's run, not a root
  };
  std::vector<Captured> captured;
  edge_list engine_roots;
  std::vector<at::Tensor> engine_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!grads[i].defined() || !roots[i].is_valid()) continue;
    if (IsOutputNode(roots[i].function.get())) {
      captured.push_back({roots[i], grads[i], false});
    } else {
      engine_roots.push_back(roots[i]);
      engine_grads.push_back(grads[i]);
    }
  }
  if (!engine_roots.empty()) {
    edge_list outputs = FindOutputs(engine_roots);
    if (!outputs.empty()) {
      torch::autograd::variable_list results;
      try {
        // The default engine's own run (its threads, anomaly metadata and
        // saved-tensor hooks are the Python engine's when Python is loaded),
        // without the Python engine's override of execute(): on a failed
        // run that override puts a Python function's exception back into
        // the interpreter of the calling thread, for a Python caller to
        // raise. Here the error becomes a status and no Python frame sees
        // the interpreter's error, which would stay pending on this thread
        // (a runtime thread keeps its Python thread state) and break the
        // next Python code it runs: the next pass's backward function
        // would fail its own attribute lookup.
        torch::autograd::Engine& engine = torch::autograd::Engine::get_default_engine();
        results = engine.torch::autograd::Engine::execute(
            engine_roots, engine_grads, /*keep_graph=*/true, /*create_graph=*/false,
            /*accumulate_grad=*/false, outputs);
      } catch (const Error& e) {
        return Annotate(e.status(), absl::StrCat("local backward failed: Error on Node ", self));
      } catch (const c10::Error& e) {
        return absl::InternalError(absl::StrCat("local backward failed: Error on Node ", self, ": ",
                                                e.what_without_backtrace()));
      } catch (const std::exception& e) {
        return absl::InternalError(
            absl::StrCat("local backward failed: Error on Node ", self, ": ", e.what()));
      }
      for (size_t i = 0; i < outputs.size() && i < results.size(); ++i) {
        if (results[i].defined()) captured.push_back({outputs[i], std::move(results[i]), true});
      }
    }
  }
  std::vector<Leaf> leaves;
  for (const Captured& c : captured) {
    if (auto* acc = dynamic_cast<AccumulateGrad*>(c.edge.function.get())) {
      leaves.push_back({acc, c.grad, c.by_engine});
    }
  }
  RETURN_IF_ERROR(AccumulateLeaves(ctx, self, leaves));
  std::vector<RecvGrads> recvs;
  absl::flat_hash_map<Node*, size_t> recv_index;
  for (auto& [edge, grad, by_engine] : captured) {
    Node* n = edge.function.get();
    if (dynamic_cast<AccumulateGrad*>(n) != nullptr) continue;
    auto* recv = static_cast<RecvRpcBackward*>(n);
    if (recv->context_id() != ctx.id()) {
      return absl::FailedPreconditionError(
          absl::StrCat("backward of distributed autograd context ", ctx.id(),
                       " reached a tensor received in context ", recv->context_id()));
    }
    auto [it, inserted] = recv_index.emplace(n, recvs.size());
    if (inserted) recvs.push_back({edge.function, std::vector<at::Tensor>(n->num_inputs())});
    at::Tensor& slot = recvs[it->second].grads[edge.input_nr];
    slot = slot.defined() ? slot + grad : grad;
  }
  std::vector<Outgoing> out;
  out.reserve(recvs.size());
  for (auto& r : recvs) {
    // A profile sees each recv function's part of the pass (torch's event).
    RECORD_FUNCTION("RecvRpcBackward", std::vector<c10::IValue>());
    auto* recv = static_cast<RecvRpcBackward*>(r.node.get());
    for (uint32_t i = 0; i < r.grads.size(); ++i) {
      if (r.grads[i].defined()) continue;
      const auto& meta = recv->input_metadata(i);
      r.grads[i] = meta.zeros_like();
    }
    out.push_back({recv->sender(), ctx.id(), recv->sender_message_id(), std::move(r.grads)});
  }
  return out;
}

rpc::Future<bool> SendGradients(rpc::Runtime& agent, std::vector<Outgoing> outgoing,
                                absl::Time deadline) {
  if (outgoing.empty()) return rpc::MakeReadyFuture<bool>(true);
  struct Join {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu);
    absl::Status first ABSL_GUARDED_BY(mu);
  };
  auto join = std::make_shared<Join>();
  {
    absl::MutexLock lock(&join->mu);
    join->left = outgoing.size();
  }
  rpc::Promise<bool> done(agent.executor());
  for (Outgoing& o : outgoing) {
    rpc::CallOptions opts;
    // The gradients of tensors o.to sent: back through its map, inverted.
    opts.answers = true;
    opts.timeout = deadline == absl::InfiniteFuture()
                       ? agent.options().timeouts.rpc
                       : std::max(absl::Milliseconds(1), deadline - absl::Now());
    rpc::Future<bool> f = agent.rpc_async(opts, o.to, PropagateFunction(), o.context_id,
                                          o.message_id, std::move(o.grads));
    f.OnReady([join, done](const absl::StatusOr<bool>& r) {
      absl::Status result;
      {
        absl::MutexLock lock(&join->mu);
        if (!r.ok() && join->first.ok()) join->first = r.status();
        if (--join->left > 0) return;
        result = join->first;
      }
      if (result.ok()) {
        done.SetValue(true);
      } else {
        done.SetError(result);
      }
    });
  }
  return done.future();
}

const rpc::Function<bool(int64_t, int64_t, std::vector<at::Tensor>)>& PropagateFunction() {
  static const auto* f =
      new rpc::Function<bool(int64_t, int64_t, std::vector<at::Tensor>)>(kPropagateFn);
  return *f;
}

absl::Status RegisterHandlers(rpc::FunctionRegistry& registry, std::weak_ptr<Container> weak) {
  absl::Status s = registry.Register(
      PropagateFunction(),
      [weak](const rpc::CallContext& call, int64_t context_id, int64_t message_id,
             std::vector<at::Tensor> grads) -> rpc::Future<bool> {
        auto c = weak.lock();
        const std::string where = absl::StrCat("worker '", call.runtime->self().name, "'");
        if (c == nullptr) {
          return rpc::MakeErrorFuture<bool>(
              absl::UnavailableError(absl::StrCat("dist_autograd is gone on ", where)));
        }
        auto state = c->Find(context_id);
        if (state == nullptr) {
          return rpc::MakeErrorFuture<bool>(absl::FailedPreconditionError(
              absl::StrCat("distributed autograd context ", context_id, " is not known on ", where,
                           " (released, or never reached it)")));
        }
        auto edges = state->SendEdges(message_id);
        if (!edges.ok()) return rpc::MakeErrorFuture<bool>(Annotate(edges.status(), where));
        if (edges->size() != grads.size()) {
          return rpc::MakeErrorFuture<bool>(absl::InvalidArgumentError(
              absl::StrCat(where, ": send function ", message_id, " has ", edges->size(),
                           " tensors but got ", grads.size(), " gradients")));
        }
        const absl::Time local_start = absl::Now();
        absl::StatusOr<std::vector<Outgoing>> outgoing;
        {
          Container::PassScope pass(*c);
          // A pass profiled here records its send functions' runs too.
          std::shared_ptr<const at::ThreadLocalState> profiled = state->profiled_pass();
          std::optional<at::ThreadLocalStateGuard> in_profile;
          if (profiled != nullptr) in_profile.emplace(*profiled);
          RECORD_FUNCTION("SendRpcBackward", std::vector<c10::IValue>());
          outgoing = RunLocal(*state, call.runtime->self().id, *edges, grads);
        }
        TraceAutograd(*call.runtime, absl::StrCat("local backward, context ", context_id),
                      context_id, local_start, outgoing.status());
        if (!outgoing.ok()) {
          return rpc::MakeErrorFuture<bool>(
              Annotate(outgoing.status(),
                       absl::StrCat("distributed autograd context ", context_id, " on ", where)));
        }
        return SendGradients(*call.runtime, *std::move(outgoing), call.deadline);
      });
  if (!s.ok()) return s;
  return registry.RegisterInternalInline(
      kReleaseFn, [weak](const rpc::CallContext& call, rpc::Payload args, rpc::Responder done) {
        proto::ReleaseContext msg;
        if (!msg.ParseFromString(args.bytes)) {
          return done(absl::DataLossError("undecodable distributed autograd release"));
        }
        if (auto c = weak.lock()) c->Release(call.runtime, msg.context_id(), call.caller->id);
        done(rpc::Payload());
      });
}

}  // namespace internal

absl::Status Backward(rpc::RpcAgent& handle, int64_t context_id,
                      const std::vector<at::Tensor>& roots, bool retain_graph,
                      absl::Duration timeout) {
  rpc::Runtime& agent = handle.runtime();
  auto c = agent.registry().GetExtension<internal::Container>();
  if (c == nullptr) return absl::FailedPreconditionError("dist_autograd is not installed");
  const std::string what = absl::StrCat("distributed backward of context ", context_id,
                                        " from worker '", agent.self().name, "'");
  auto state = c->Find(context_id);
  if (state == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(what, ": Could not find autograd context with id: ", context_id));
  }
  if (roots.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no roots"));
  torch::autograd::edge_list edges;
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const at::Tensor& r = roots[i];
    if (!r.defined() || !r.requires_grad() || r.numel() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": root ", i, " must be a one-element tensor that requires grad (got ",
                       !r.defined() ? std::string("an undefined tensor")
                                    : absl::StrCat(r.numel(), " elements, requires_grad=",
                                                   r.requires_grad() ? "true" : "false"),
                       ")"));
    }
    edges.push_back(torch::autograd::impl::gradient_edge(r));
    grads.push_back(at::ones_like(r, at::MemoryFormat::Preserve));
  }
  RETURN_IF_ERROR(state->BeginBackward(retain_graph));
  internal::Container::PassScope pass(*c);
  // Under a profiler (torch's event name); the gradients that come back to
  // this worker's send functions run in this thread's profile.
  RECORD_FUNCTION("torch::distributed::autograd::backward", std::vector<c10::IValue>());
  const bool profiled =
      c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr;
  if (profiled) state->set_profiled_pass(std::make_shared<const at::ThreadLocalState>());
  struct EndProfiledPass {
    internal::ContextState* state;
    ~EndProfiledPass() {
      if (state != nullptr) state->set_profiled_pass(nullptr);
    }
  } end_profiled_pass{profiled ? state.get() : nullptr};
  if (timeout <= absl::ZeroDuration()) timeout = agent.options().timeouts.rpc;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  auto outgoing = internal::RunLocal(*state, agent.self().id, edges, grads);
  internal::TraceAutograd(agent, absl::StrCat("local backward, context ", context_id), context_id,
                          start, outgoing.status());
  absl::Status s = outgoing.status();
  if (s.ok()) {
    rpc::Future<bool> all = internal::SendGradients(agent, *std::move(outgoing), deadline);
    s = all.Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
  }
  // The whole pass, on the worker that started it: from here until every
  // gradient message it caused was answered.
  internal::TraceAutograd(agent, absl::StrCat("backward pass, context ", context_id), context_id,
                          start, s);
  if (!s.ok()) return Annotate(s, what);
  return absl::OkStatus();
}

}  // namespace baton::dist_autograd
