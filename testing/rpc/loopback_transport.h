// LoopbackNetwork: an in-process network transport for tests (test-only
// target //testing/rpc:loopback). Several RpcAgents in one process talk
// through it instead of gRPC, and a test decides what happens to each frame:
// deliver, delay, drop, hold (and release later, in any order), or kill a
// worker as SIGKILL would.
//
//   auto net = std::make_shared<LoopbackNetwork>();
//   AgentCollaborators c;
//   c.network_transport = net->Factory();
//   options.store = shared_memory_store;          // one store::MemoryStore
//   options.transport.local_transport = AgentOptions::LocalTransport::kGrpc;  // no shm rings
//   auto agent = RpcAgent::Create(options, registry, std::move(c));
//
// Contract (the one of rpc/transport.h, so the agent cannot tell):
// - Frames go through one delivery thread, in order of their due time and
//   then of sending; with no rule, frames from one sender to one peer arrive
//   in order. A rule's delay moves a frame's due time (so a later frame can
//   overtake it); kHold parks it until ReleaseHeld().
// - Kill(w) makes worker w vanish as a killed process does: frames to or
//   from it, queued or held, are lost; every transport with a stream to w
//   hears OnStreamClosed(w, stream, UNAVAILABLE) once, and every other that
//   knows w hears OnPeerLost(w) (its incoming stream cancelled); w's own
//   streams close too; later sends to w fail with UNAVAILABLE.
// - TimeOutStreams(a, b) ends the streams between a and b with a silence
//   cause, as a partition that outlasts the connection's timeouts does.
// - A request that reaches a worker whose server stopped closes the
//   sender's stream with UNAVAILABLE, as a refused connection does.
// - Every stream checks the job token of the receiving transport; a wrong
//   one closes the sender's stream with UNAUTHENTICATED. Stream identities
//   (AddPeer's `identity`) are not checked: the gRPC transport's tests and
//   the multi-process ones cover them. Adding a known peer again with
//   another address or identity sends new frames on a new stream.
// - Once CloseStreams() returned, no response or stream ending reaches the
//   handler; once StopServer() returned, no request or lost peer does, and
//   the reply channels of earlier requests return false.
// - Workers are named by rank; a transport learns its rank when the agent
//   adds itself as a peer (the end of its rendezvous).
//
// Thread-safety: every method may be called from any thread. Handlers are
// called on the delivery thread only, never with a lock of the network held.
// The network must outlive the transports it made (the agents).
#ifndef BATON_TESTING_RPC_LOOPBACK_TRANSPORT_H_
#define BATON_TESTING_RPC_LOOPBACK_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/transport.h"

namespace baton::rpc::testing {

// What a rule sees of one frame.
struct FrameInfo {
  int from = -1;                 // sender's rank
  int to = -1;                   // receiver's rank
  bool request = true;           // else a response
  std::string function;          // the request's function (a response: its request's)
  uint64_t call_id = 0;          // the caller's id of the call
  const Frame* frame = nullptr;  // valid during the rule only
};

// What happens to one frame.
struct Fate {
  enum Action { kDeliver, kDrop, kHold };
  Action action = kDeliver;
  absl::Duration delay = absl::ZeroDuration();  // kDeliver only
  // kDeliver of a response only, when non-zero: it arrives carrying this
  // call id instead of its own (a confused or hostile peer's reply).
  uint64_t call_id = 0;

  static Fate Deliver() { return {}; }
  static Fate Delay(absl::Duration d) { return {kDeliver, d}; }
  static Fate Drop() { return {kDrop, absl::ZeroDuration()}; }
  static Fate Hold() { return {kHold, absl::ZeroDuration()}; }
  static Fate Readdress(uint64_t call_id) { return {kDeliver, absl::ZeroDuration(), call_id}; }
};

// Decides a frame's fate; called on the sender's thread, without locks held.
using FrameRule = std::function<Fate(const FrameInfo&)>;

struct LoopbackStats {
  int64_t delivered = 0;
  int64_t dropped = 0;  // by a rule, or lost with a killed worker
  int64_t delayed = 0;
  int64_t held = 0;  // parked right now
};

class LoopbackTransport;
class LoopbackReplyChannel;

class LoopbackNetwork {
 public:
  LoopbackNetwork();
  // Stops the delivery thread; frames still queued are lost.
  ~LoopbackNetwork();

  LoopbackNetwork(const LoopbackNetwork&) = delete;
  LoopbackNetwork& operator=(const LoopbackNetwork&) = delete;

  // For AgentCollaborators::network_transport.
  NetworkTransportFactory Factory();

  // The rule for every frame sent from now on (null: deliver all).
  void SetRule(FrameRule rule);
  // Delivers the held frames now: in reverse order of holding if `reverse`,
  // else in order. Returns how many.
  size_t ReleaseHeld(bool reverse);
  // Worker `rank` dies (see the contract). NOT_FOUND if no transport has
  // that rank yet.
  absl::Status Kill(int rank);
  bool killed(int rank) const;
  // The streams between workers `a` and `b`, both ways, end as TCP ends a
  // connection that a network partition left unanswered: each side's
  // stream to the other closes with UNAVAILABLE "... Connection timed out"
  // (silence: IsSilence in rpc/transport.h). The frames themselves are a
  // rule's (a partition is a rule that drops the frames between them).
  // NOT_FOUND if no live transport has one of the ranks.
  absl::Status TimeOutStreams(int a, int b);
  LoopbackStats stats() const;
  // Waits (bounded) until no frame is queued for delivery; held frames do
  // not count. False at the deadline.
  bool WaitIdle(absl::Duration timeout);

 private:
  friend class LoopbackTransport;
  friend class LoopbackReplyChannel;
  struct Endpoint;
  // A frame on its way, or the end of a stream.
  struct Pending {
    absl::Time due;
    uint64_t seq = 0;
    int kind = 0;  // request, response or stream closed (loopback_transport.cc)
    std::shared_ptr<Endpoint> from;
    std::shared_ptr<Endpoint> to;  // null for a closed stream
    int from_rank = -1;            // the sender, as the receiver knows it
    int to_rank = -1;              // the receiver, as the sender knows it
    uint64_t stream_id = 0;
    Frame frame;
    absl::Status cause;  // closed stream
  };

  absl::StatusOr<std::unique_ptr<NetworkTransport>> Start(const NetworkTransportOptions& options,
                                                          TransportHandler* handler);
  std::shared_ptr<Endpoint> EndpointAt(const std::string& address) const;
  // Queues `p` under the rule's fate.
  void Submit(Pending p, FrameInfo info);
  void Enqueue(Pending p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();
  void Deliver(Pending p);
  // The sender's stream to `to` ends with `cause` (once per stream).
  void CloseStream(const std::shared_ptr<Endpoint>& from, int to_rank, uint64_t stream_id,
                   const absl::Status& cause);

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  FrameRule rule_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<absl::Time, uint64_t>, Pending> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> held_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Endpoint>> endpoints_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  int next_address_ ABSL_GUARDED_BY(mu_) = 0;
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  LoopbackStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace baton::rpc::testing

#endif  // BATON_TESTING_RPC_LOOPBACK_TRANSPORT_H_
