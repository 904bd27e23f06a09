// The agent's metrics (AgentOptions::observability.metrics_address): its own families,
// read from AgentStats at scrape time, the protocol layers' collectors, and
// the HTTP endpoint (obs/http_server.h). The per-call counting is in
// Call/Complete (caller) and Dispatch (callee), agent.cc.
#include <algorithm>

#include "base/status.h"
#include "obs/http_server.h"
#include "obs/metrics.h"
#include "rpc/internal/agent_impl.h"

namespace baton::rpc::internal {

absl::Status AgentImpl::StartMetrics() {
  if (metrics_ == nullptr) return absl::OkStatus();
  metrics_->AddCollector([this](obs::MetricsWriter& w) {
    const AgentStats st = stats();
    w.Gauge("baton_rpc_pending_outgoing", "Calls this worker made that await their reply.",
            static_cast<double>(st.pending_outgoing));
    w.Gauge("baton_rpc_running_incoming", "Requests from peers being served.",
            static_cast<double>(st.running_incoming));
    w.Gauge("baton_rpc_requests_queued", "Requests admitted but not started (flow control F3).",
            static_cast<double>(st.requests_queued));
    w.Gauge("baton_executor_threads", "Threads of the executor that runs user functions.",
            st.executor_threads);
    w.Gauge("baton_rpc_live_streams", "Open outgoing network streams.", st.live_streams);
    w.Gauge("baton_rpc_calls_waiting_for_restart",
            "Calls waiting for a dead peer's next incarnation (P7).",
            static_cast<double>(st.calls_waiting_for_restart));
    w.Counter("baton_shm_bulk_bytes_out_total",
              "Tensor bytes copied into shared memory for same-host peers.",
              static_cast<double>(st.shm_bulk_bytes_copied_out));
    w.Counter("baton_shm_bulk_bytes_in_total",
              "Tensor bytes copied out of shared memory from same-host peers.",
              static_cast<double>(st.shm_bulk_bytes_copied_in));
    w.Counter("baton_shm_frames_sent_total", "Frames sent through the shared-memory transport.",
              static_cast<double>(st.shm_frames_sent));
    w.Counter("baton_shm_frames_received_total",
              "Frames received through the shared-memory transport.",
              static_cast<double>(st.shm_frames_received));
    w.Counter("baton_peer_failures_total", "Peers confirmed dead.",
              static_cast<double>(st.peer_failures));
    w.Counter("baton_rpc_calls_waited_for_window_total",
              "Calls that found a peer's window full and waited (flow control).",
              static_cast<double>(st.calls_waited_for_window));
    w.Counter("baton_rpc_calls_refused_by_window_total",
              "Calls that got RESOURCE_EXHAUSTED waiting for a peer's window.",
              static_cast<double>(st.calls_refused_by_window));
    w.Counter("baton_rpc_requests_refused_total", "Requests this worker refused (flow control).",
              static_cast<double>(st.requests_refused));
  });
  // Traffic per peer and transport (payload bytes: message bodies and
  // tensors; the same-host bulk segments are counted again above).
  metrics_->AddCollector([this](obs::MetricsWriter& w) {
    if (!ready_.HasBeenNotified()) return;
    struct Family {
      const char* name;
      const char* help;
      std::atomic<int64_t> PeerTraffic::*out;
      std::atomic<int64_t> PeerTraffic::*in;
    };
    const Family families[] = {
        {"baton_rpc_payload_bytes_total",
         "Payload bytes (message bodies and tensors) sent and received, per peer and transport.",
         &PeerTraffic::bytes_out, &PeerTraffic::bytes_in},
        {"baton_rpc_messages_total",
         "Requests and replies sent and received, per peer and transport.",
         &PeerTraffic::messages_out, &PeerTraffic::messages_in}};
    for (const Family& f : families) {
      w.Family(f.name, f.help, "counter");
      const int peers = std::min(slots_, static_cast<int>(workers_.size()));
      for (int p = 0; p < peers; ++p) {
        if (!IsMember(p)) continue;  // a dynamic group's empty slots
        const PeerTraffic& t = traffic_[p];
        const std::string transport = uses_shm_transport(p) ? "shm" : "grpc";
        for (const auto& [direction, field] : {std::pair{"out", f.out}, std::pair{"in", f.in}}) {
          w.Sample({{"peer", workers_[p].name}, {"transport", transport}, {"direction", direction}},
                   static_cast<double>((t.*field).load(std::memory_order_relaxed)));
        }
      }
    }
  });
  // Queues and windows per peer: where requests wait, and for whom.
  metrics_->AddCollector([this](obs::MetricsWriter& w) {
    if (!ready_.HasBeenNotified()) return;
    const int peers = std::min(slots_, static_cast<int>(workers_.size()));
    if (gate_ != nullptr) {
      const std::vector<RequestGate::PeerLoad> load = gate_->PerPeer();
      w.Family("baton_rpc_peer_requests_queued",
               "A peer's requests admitted but not started: the queue depth per caller (F3).",
               "gauge");
      for (int p = 0; p < peers && p < static_cast<int>(load.size()); ++p) {
        if (!IsMember(p)) continue;  // a dynamic group's empty slots
        w.Sample({{"peer", workers_[p].name}}, static_cast<double>(load[p].queued));
      }
      w.Family("baton_rpc_peer_requests_held",
               "A peer's requests admitted and not yet answered, queued or running (F2).", "gauge");
      for (int p = 0; p < peers && p < static_cast<int>(load.size()); ++p) {
        if (!IsMember(p)) continue;  // a dynamic group's empty slots
        w.Sample({{"peer", workers_[p].name}}, static_cast<double>(load[p].held));
      }
    }
    if (window_ != nullptr) {
      const std::vector<CallWindow::PeerUsage> usage = window_->PerPeer();
      w.Family("baton_rpc_peer_calls_in_flight",
               "Calls to a peer sent and not yet answered, in its window (F1).", "gauge");
      for (int p = 0; p < peers && p < static_cast<int>(usage.size()); ++p) {
        if (!IsMember(p)) continue;  // a dynamic group's empty slots
        w.Sample({{"peer", workers_[p].name}}, static_cast<double>(usage[p].calls));
      }
      w.Family("baton_rpc_peer_bytes_in_flight",
               "Request bytes to a peer sent and not yet answered, in its window (F1).", "gauge");
      for (int p = 0; p < peers && p < static_cast<int>(usage.size()); ++p) {
        if (!IsMember(p)) continue;  // a dynamic group's empty slots
        w.Sample({{"peer", workers_[p].name}}, static_cast<double>(usage[p].bytes));
      }
    }
  });
  for (auto& c : registry_->metrics_collectors()) metrics_->AddCollector(std::move(c));
  if (options_.observability.metrics_address.empty())
    return absl::OkStatus();  // the state socket serves them
  auto server =
      obs::HttpServer::Start(options_.observability.metrics_address, ObservabilityRoutes());
  if (!server.ok()) return Annotate(server.status(), "AgentOptions::observability.metrics_address");
  metrics_server_ = *std::move(server);
  return absl::OkStatus();
}

}  // namespace baton::rpc::internal
