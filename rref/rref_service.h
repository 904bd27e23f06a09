// RRefService: the RRef protocol on a real agent. It registers the protocol's
// handlers (thin: they parse a message from proto/rref.proto and call
// RRefContext), sends the protocol's messages through the agent, and keeps
// the methods of remote-object classes.
//
// Usage (every worker, before RpcAgent::Create):
//   auto rrefs = rref::RRefService::Install(*registry);
//   auto agent = rpc::RpcAgent::Create(options, registry).value();
//   rrefs->Attach(agent.get());
// Then see rref/rref.h for remote(), RRef<T> and remote objects.
//
// Shutdown: Attach() adds a hook to the agent's graceful shutdown: after
// every worker stopped issuing calls, user references still held are
// released and the service waits (bounded) until every fork is confirmed and
// every message answered (G6); once no call can arrive any more, the owner
// table is cleared.
//
// Thread-safety: safe for concurrent use.
#ifndef BATON_RREF_RREF_SERVICE_H_
#define BATON_RREF_RREF_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/rref.pb.h"
#include "rpc/agent.h"
#include "rref/rref_context.h"

namespace baton::rref {

inline constexpr char kControlFn[] = "__rref.control";
inline constexpr char kRemoteFn[] = "__rref.remote";
inline constexpr char kFetchFn[] = "__rref.fetch";
inline constexpr char kMethodFn[] = "__rref.method";
inline constexpr char kRemoteMethodFn[] = "__rref.remote_method";
// The reply note that carries a ChildAccept (G11).
inline constexpr char kAcceptNote[] = "__rref.accept";

class RRefService : public ControlSender, public std::enable_shared_from_this<RRefService> {
 public:
  // Wraps the service's outgoing protocol messages; tests use it to delay or
  // reorder chosen message kinds (tests/rref/fault_injection.h). Production code
  // passes none.
  using SenderWrapper = std::function<std::unique_ptr<ControlSender>(ControlSender* real)>;

  // Registers the protocol handlers on `registry` and the service as its
  // extension. Call once per registry, before RpcAgent::Create.
  static std::shared_ptr<RRefService> Install(rpc::FunctionRegistry& registry,
                                              SenderWrapper wrapper = nullptr);
  // The service installed on the agent's registry; FAILED_PRECONDITION if
  // RRefService::Install was not called.
  static absl::StatusOr<std::shared_ptr<RRefService>> Of(rpc::Runtime& runtime);
  static absl::StatusOr<std::shared_ptr<RRefService>> Of(rpc::RpcAgent& agent) {
    return Of(agent.runtime());
  }

  // Binds the service to its agent (idempotent).
  void Attach(rpc::Runtime* runtime);
  void Attach(rpc::RpcAgent* agent) { Attach(&agent->runtime()); }

  // The agent's runtime: null before Attach and after the agent shut down.
  rpc::Runtime* runtime() const;
  std::shared_ptr<RRefContext> context() const;
  rpc::FunctionRegistry& registry() const { return *registry_; }

  // ---- Remote-object classes (see rref/rref.h, RegisterClass) ----
  using MethodInvoker =
      std::function<void(std::shared_ptr<void> object, const rpc::CallContext& ctx,
                         rpc::Payload args, rpc::ValueDone done)>;
  struct Method {
    std::string qualified_name;  // "Class.method"
    std::string signature;
    MethodInvoker invoke;
  };
  absl::Status RegisterMethod(const std::string& pointer_key, Method method);
  void SetClassName(const std::string& type, const std::string& name);
  // Empty if the class was not registered here.
  std::string ClassNameOf(const std::string& type) const;
  std::shared_ptr<const Method> FindMethod(const std::string& qualified_name) const;
  std::shared_ptr<const Method> FindMethodByPointer(const std::string& pointer_key) const;

  // The live RRefs this worker owns and holds, with their forks.
  RRefDebugState DebugState() const;
  // Waits until this worker owns and holds nothing and every protocol message
  // was answered; DEADLINE_EXCEEDED with the state otherwise (tests).
  absl::Status WaitUntilEmpty(absl::Duration timeout) const;

  // ControlSender.
  rpc::Future<void> ForkRequest(int owner, RRefId rref, ForkId fork, int parent) override;
  rpc::Future<void> ChildAccept(int parent, RRefId rref, ForkId fork) override;
  bool ChildAcceptOnReply(int parent, RRefId rref, ForkId fork) override;
  rpc::Future<void> UserDelete(int owner, RRefId rref, ForkId fork) override;

  // Runs `function`'s value handler here, storing the result as `rref`'s
  // value (remote() to self, and the owner side of remote()).
  void RunForValue(const rpc::CallContext& ctx, const std::string& function,
                   const std::string& signature, RRefId rref, rpc::Payload args,
                   absl::AnyInvocable<void(absl::Status)> done);
  // Runs method `qualified` on the object `target` and stores the result as
  // `result` (remote method calls), or replies with it (result == nullopt).
  void RunMethod(const rpc::CallContext& ctx, RRefId target, const std::string& qualified,
                 const std::string& signature, rpc::Payload args, rpc::ValueDone done);

 private:
  explicit RRefService(rpc::FunctionRegistry* registry) : registry_(registry) {}
  std::shared_ptr<RRefContext> EnsureAttached(rpc::Runtime* agent);
  rpc::Future<void> SendControl(int to, const proto::RRefControl& msg);
  void RegisterHandlers();

  rpc::FunctionRegistry* const registry_;
  SenderWrapper wrapper_;
  std::unique_ptr<ControlSender> wrapped_sender_;  // set once, at attach
  mutable absl::Mutex mu_;
  rpc::Runtime* agent_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::shared_ptr<RRefContext> context_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const Method>> methods_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<const Method>> by_pointer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> class_names_ ABSL_GUARDED_BY(mu_);
};

// Helpers for the message layout of RRef calls: a length-prefixed
// proto::RRefCall followed by the encoded arguments.
rpc::Payload WithHeader(const proto::RRefCall& header, rpc::Payload args);
absl::Status TakeHeader(rpc::Payload& payload, proto::RRefCall* header);
void ToProto(const GlobalId& id, proto::GlobalIdProto* out);
GlobalId FromProto(const proto::GlobalIdProto& p);

}  // namespace baton::rref

#endif  // BATON_RREF_RREF_SERVICE_H_
