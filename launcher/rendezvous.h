// Node-agent rendezvous: how the baton-run processes of one job agree, round
// after round, on who takes part and with which ranks.
//
// Every node agent talks to one Store: node rank 0 (the host) serves it on
// --master_addr:--rdzv_port and uses it in-process; the other nodes are
// clients. The protocol, per round R (keys under "rdzv/"):
//
//   1. Arrival: a node takes a slot with Add("r/R/count", 1) and writes
//      "r/R/member/<slot>" = its node rank (-1 when it has none) and host.
//   2. Closing (host only): once MIN nodes arrived, and after waiting up to
//      --rdzv_last_call for MAX, the host writes "r/R/closed": the first k
//      slots (k <= MAX) in group-rank order (node rank, then arrival), the
//      workers' MASTER_PORT for this round and the restart count. A node
//      whose slot is not among them moves on to round R+1 (the host sees the
//      arrival there and ends the running round: a node joined).
//   3. Outcome: the first writer of "r/R/end" (CompareSet from empty) decides
//      how the round ended: success (host only, when every node reported
//      "r/R/done"), failure (a worker failed), node_lost (the host saw a
//      heartbeat "r/R/hb/<group rank>" stand still), node_joined, node_left
//      or shutdown. A failure's writer then takes the next restart number
//      with Add("restarts", 1) and publishes it at "r/R/end_restart".
//
// Guarantees (N for the node agents' rendezvous):
//   N1 Every wait is bounded by --rdzv_timeout; a round that never fills
//      fails with an error naming the missing node ranks, which every
//      waiting node receives through "r/R/closed"; a node started with other
//      settings than the master writes the reason to "aborted" and the host
//      fails the round with it at once;
//   N2 All members of a round see the same membership, ranks, MASTER_PORT,
//      restart count and outcome;
//   N3 Membership changes do not consume restarts; failures do;
//   N4 (etcd, elastic) A host that dies leaves its key to expire with its
//      session; the first node to claim it then hosts, also while a round
//      is forming, so no node is needed for the job to go on.
//
// Thread-safety: a Rendezvous is used by one thread (the agent's main loop).
#ifndef BATON_LAUNCHER_RENDEZVOUS_H_
#define BATON_LAUNCHER_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/store.h"

namespace baton::launcher {

// A flat string map with a text encoding ("key=escaped value" lines) for
// store values.
using Record = std::map<std::string, std::string>;
std::string EncodeRecord(const Record& record);
absl::StatusOr<Record> DecodeRecord(absl::string_view text);

struct RendezvousConfig {
  // -1: none (an elastic node that takes whatever group rank it is given).
  int node_rank = -1;
  std::string host_name;
  int min_nodes = 1;
  int max_nodes = 1;
  absl::Duration timeout = absl::Seconds(300);
  absl::Duration last_call = absl::Seconds(5);
  // Host only: picks the workers' MASTER_PORT for a round.
  std::function<absl::StatusOr<int>()> pick_master_port;
  // Host failover (etcd): whichever node holds the job's host key hosts.
  // While waiting for a round to close, a node calls claim_host between
  // slices of `watch_period`; true means the host key was free (the host
  // died) and this node now holds it, so it closes the round itself, first
  // in group-rank order, node ranks aside.
  bool dynamic_host = false;
  std::function<absl::StatusOr<bool>()> claim_host;
  absl::Duration watch_period = absl::Seconds(1);
};

// The result of one round.
struct RoundInfo {
  int64_t round = 0;
  int group_rank = 0;
  int group_world_size = 1;
  // Node rank (or -1) of each group rank, for messages.
  std::vector<int> node_ranks;
  std::vector<std::string> hosts;
  int master_port = 0;
  // Failure restarts consumed before this round.
  int restart_count = 0;
};

class Rendezvous {
 public:
  // REQUIRES: `store` outlives this object.
  Rendezvous(store::Store* store, RendezvousConfig config);

  // Node rank 0 hosts, or (etcd, elastic) the node that holds the job's host
  // key (SetHost): see node_agent.cc, "Host failover".
  bool is_host() const { return host_; }
  void SetHost(bool host) { host_ = host; }

  // Host: publishes the job's settings (run id, roles, job token) and opens
  // round 0. Others: fetch and check them, bounded by the timeout; a
  // mismatch fails with INVALID_ARGUMENT naming both values.
  absl::Status Publish(const Record& job);
  absl::StatusOr<Record> FetchJob(const Record& expected);

  // The round a newcomer should try first (the host's current round).
  absl::StatusOr<int64_t> CurrentRound();

  // Joins round `round` (moving on to later rounds while excluded), bounded
  // by the timeout. DEADLINE_EXCEEDED names the missing node ranks.
  absl::StatusOr<RoundInfo> Join(int64_t round);

  store::Store& store() { return *store_; }
  const RendezvousConfig& config() const { return config_; }
  // The node rank this node joins the next rounds with.
  void SetNodeRank(int node_rank) { config_.node_rank = node_rank; }

  // Key helpers for round R.
  static std::string Key(int64_t round, absl::string_view name);

 private:
  absl::StatusOr<RoundInfo> CloseAsHost(int64_t round, int my_slot);
  absl::StatusOr<RoundInfo> ReadClosed(int64_t round, int slot, absl::Time deadline,
                                       bool* excluded);

  store::Store* const store_;  // set at construction
  RendezvousConfig config_;    // node_rank follows SetHost
  bool host_ = false;
};

}  // namespace baton::launcher

#endif  // BATON_LAUNCHER_RENDEZVOUS_H_
