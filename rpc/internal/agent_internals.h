// What the agent's user handle (rpc/agent.h) does not offer, for baton's own
// tools and tests that speak the wire protocol themselves (the bad-input and
// flood tests' attackers). Not a public header: its target is visible to
// rpc/, its tests, the fuzzers and the benchmarks only (//rpc:internal).
//
// Thread-safety: as RpcAgent's own methods.
#ifndef BATON_RPC_INTERNAL_AGENT_INTERNALS_H_
#define BATON_RPC_INTERNAL_AGENT_INTERNALS_H_

#include <string>

#include "rpc/agent.h"

namespace baton::rpc::internal {

class AgentInternals {
 public:
  // What `agent`'s network streams to `peer` present as its identity
  // (docs/flow_control.md, W1): the value of the x-baton-identity metadata,
  // empty before the rendezvous. It proves the worker: treat it like the
  // job token.
  static std::string StreamIdentity(const RpcAgent& agent, int peer);
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_AGENT_INTERNALS_H_
