// JobStore: the connection to the job's rendezvous store, the first thing a
// worker makes (AgentImpl::Rendezvous, and JoinGroup for a dynamic group),
// with the job token that protects it. Three ways, as AgentOptions says:
// - an injected store (AgentOptions::store): used as it is, with the token
//   given (possibly none: AgentImpl then agrees on one through the store);
// - etcd (AgentOptions::etcd): every rank is a client, so any rank may
//   restart alone; a token is required, and it never goes through etcd;
// - otherwise rank 0 serves the store at master_addr:master_port and the
//   other ranks are its clients, all with AgentOptions::security.job_token.
//   Without one on a loopback master, rank 0 makes one and hands it to the
//   host's other ranks in /tmp/baton-<uid>/job-<MASTER_PORT>.token (mode
//   0600, in a directory of mode 0700 that only this user owns), never
//   through the store; a rank that finds a file left by an earlier job on
//   that port (its token is refused) reads it again until rank 0 wrote its
//   own. Any other master without a token fails with FAILED_PRECONDITION
//   saying how to provide one: anyone who reaches the store could
//   otherwise read it and call every worker.
// Every wait is bounded by AgentOptions::timeouts.init. The files of
// AgentOptions::security.tls are read here; a missing one fails naming it.
//
// Thread-safety: Connect() may be called from any thread; a JobStore is a
// value owned by one agent.
#ifndef BATON_RPC_INTERNAL_JOB_STORE_H_
#define BATON_RPC_INTERNAL_JOB_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/tls.h"
#include "rpc/agent_options.h"
#include "store/store.h"
#include "store/store_server.h"

namespace baton::rpc::internal {

struct JobStore {
  static absl::StatusOr<JobStore> Connect(const AgentOptions& options);

  std::shared_ptr<store::Store> store;
  // Rank 0's server of the store (null elsewhere): `store` is its in-process
  // view, valid while the server runs.
  std::unique_ptr<store::StoreServer> server;
  // The store's job token; empty for an injected store given none.
  std::string token;
  // Where rank 0 left the token for this host's other ranks (empty if
  // nowhere); its owner removes it when the server stops.
  std::string token_file;
  // AgentOptions::security.tls, loaded.
  TlsConfig tls;
};

// Whether `host` names this machine's loopback interface.
bool IsLoopbackHost(const std::string& host);

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_JOB_STORE_H_
