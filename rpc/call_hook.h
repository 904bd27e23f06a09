// CallHook: per-call hooks on send and on receive, the extension point for
// protocols that follow tensors across workers (distributed autograd records
// a send function for every tensor that leaves and a receive function for
// every tensor that arrives, and tags the message with its context).
//
// Contract:
// - OnSend runs on the sender after a message's values were encoded and
//   before it leaves: for a request in rpc_sync/rpc_async, for a reply in the
//   callee's typed handler. It sees every tensor the message carries, as the
//   user passed them (with their autograd history), and may add entries to
//   `extensions`, which travel in the frame (FrameHeader.extensions).
// - OnReceive runs on the receiver after the values were decoded and before
//   they reach user code (the remote function, or the caller's future). It
//   sees the decoded tensors and may replace them (e.g. to attach autograd
//   history), and reads the sender's extensions.
// - A hook's error fails the call: on send the caller gets it; on receive in
//   the callee the caller gets it as the reply; on receive of a reply the
//   caller's future fails with it. Errors keep their code.
// - Add hooks to the registry before RpcAgent::Create, on every worker: a
//   message that arrives before a hook is added does not see it.
// - Hooks run in registration order on the calling thread (caller's thread,
//   executor thread, or the transport thread that completes a reply); they
//   must not block.
// - Scope: typed rpc_sync/rpc_async calls and their replies, and the RRef
//   paths (remote() arguments, to_here() replies, method arguments and
//   results). A hook must ignore messages without its own extensions (e.g.
//   sent by a worker without the hook, or an owner-local to_here()).
// - EnterCall runs on the callee's thread right before user code runs for a
//   request (a function, a remote() constructor or function, an RRef method),
//   after OnReceive; the returned scope is destroyed when that code returns
//   (not when a future it returned completes). It lets a hook make per-call
//   state ambient for nested calls made by that code (distributed autograd
//   makes the request's context current). It runs for every request while
//   hooks exist, also one without the hook's extensions, so a scope can clear
//   state a reused thread still holds.
// - On the send of a reply, MessageInfo::request_extensions holds the
//   extensions of the request it answers, so a hook can tag the reply.
//
// Thread-safety: hooks are called concurrently and must be thread-safe.
#ifndef BATON_RPC_CALL_HOOK_H_
#define BATON_RPC_CALL_HOOK_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace baton::rpc {

class Runtime;

struct MessageInfo {
  Runtime* runtime = nullptr;
  bool is_request = true;
  int peer = -1;  // the other end: destination on send, sender on receive
  absl::string_view function;
  // Send of a reply: the extensions of the request it answers. Else null.
  const std::map<std::string, std::string>* request_extensions = nullptr;
  // Send of a request whose tensors answer tensors the peer sent
  // (CallOptions::answers): they follow the peer's device map inverted, as
  // a reply's always do (CodecContext::answers).
  bool answers = false;
};

// State a hook keeps ambient while user code runs; ended by destruction.
class CallScope {
 public:
  virtual ~CallScope() = default;
};

class CallHook {
 public:
  virtual ~CallHook() = default;
  virtual absl::Status OnSend(const MessageInfo& message, const std::vector<at::Tensor>& tensors,
                              std::map<std::string, std::string>& extensions) = 0;
  virtual absl::Status OnReceive(const MessageInfo& message,
                                 const std::vector<at::Tensor*>& tensors,
                                 const std::map<std::string, std::string>& extensions) = 0;
  virtual std::unique_ptr<CallScope> EnterCall(
      const MessageInfo& /*request*/, const std::map<std::string, std::string>& /*extensions*/) {
    return nullptr;
  }
};

}  // namespace baton::rpc

#endif  // BATON_RPC_CALL_HOOK_H_
