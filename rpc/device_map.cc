// AgentImpl's CUDA device maps (AgentOptions::devices.maps, docs/cuda.md):
// what a worker publishes, how each peer's map is resolved and checked at
// the rendezvous, and the lookup the tensor codec makes per CUDA tensor.
#include <torch/cuda.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/internal/agent_impl.h"

namespace baton::rpc::internal {

int LocalCudaDevices() { return static_cast<int>(torch::cuda::device_count()); }

void PublishDeviceMaps(const AgentOptions& options, proto::WorkerRecord& mine) {
  for (const auto& [worker, devices] : options.devices.maps) {
    auto& map = (*mine.mutable_device_maps())[worker];
    for (const auto& [from, to] : devices) (*map.mutable_devices())[from] = to;
  }
  mine.set_cuda_devices(LocalCudaDevices());
}

absl::Status CheckLocalDeviceMaps(const AgentOptions& options) {
  const int local = LocalCudaDevices();
  for (const auto& [worker, devices] : options.devices.maps) {
    const std::string where = absl::StrCat("AgentOptions::devices.maps[\"", worker, "\"]");
    if (worker == options.name) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a worker maps no devices to itself"));
    }
    std::set<int> targets;
    for (const auto& [from, to] : devices) {
      if (from < 0 || from >= local) {
        return absl::InvalidArgumentError(absl::StrCat(where, " maps cuda:", from, ", but worker '",
                                                       options.name, "' has ", local,
                                                       " CUDA device(s)"));
      }
      if (to < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " maps cuda:", from, " to cuda:", to));
      }
      if (!targets.insert(to).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " maps two devices to cuda:", to, " of worker '", worker,
                         "'; a map must be one-to-one so that replies can come back"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AgentImpl::ResolveDeviceMaps(const std::vector<proto::WorkerRecord>& records) {
  // CUDA IPC reaches other processes of this host that have a channel too.
  const proto::WorkerRecord& mine = records[rank_];
  cuda_channel_peer_.assign(records.size(), false);
  for (size_t peer = 0; peer < records.size(); ++peer) {
    cuda_channel_peer_[peer] =
        static_cast<int>(peer) != rank_ && !mine.boot_id().empty() && mine.cuda_ipc() &&
        records[peer].cuda_ipc() && records[peer].boot_id() == mine.boot_id() &&
        records[peer].pid_namespace() == mine.pid_namespace() && records[peer].pid() != mine.pid();
  }
  device_map_to_.assign(records.size(), {});
  has_device_map_to_.assign(records.size(), false);
  // CheckLocalDeviceMaps passed: what is left needs the registrations.
  for (const auto& [worker, devices] : options_.devices.maps) {
    const std::string where = absl::StrCat("AgentOptions::devices.maps[\"", worker, "\"]");
    int peer = -1;
    {
      absl::ReaderMutexLock lock(&members_mu_);
      if (auto it = by_name_.find(worker); it != by_name_.end()) peer = it->second;
    }
    if (peer < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": worker '", worker, "' is not in this job"));
    }
    const int remote = records[peer].cuda_devices();
    for (const auto& [from, to] : devices) {
      if (to >= remote) {
        return absl::InvalidArgumentError(absl::StrCat(where, " maps cuda:", from, " to cuda:", to,
                                                       " of worker '", worker, "', which has ",
                                                       remote, " CUDA device(s)"));
      }
    }
    device_map_to_[peer] = devices;
    has_device_map_to_[peer] = true;
  }
  // Peers this worker set no map for: the inverse of their map for it.
  for (size_t peer = 0; peer < records.size(); ++peer) {
    if (has_device_map_to_[peer] || static_cast<int>(peer) == rank_) continue;
    auto it = records[peer].device_maps().find(options_.name);
    if (it == records[peer].device_maps().end()) continue;
    for (const auto& [from, to] : it->second.devices()) device_map_to_[peer][to] = from;
    has_device_map_to_[peer] = true;
  }
  return absl::OkStatus();
}

CudaTensorChannel* AgentImpl::CudaChannelFor(int peer) const {
  if (cuda_channel_ == nullptr || peer < 0 || peer >= static_cast<int>(cuda_channel_peer_.size()) ||
      !cuda_channel_peer_[peer]) {
    return nullptr;
  }
  return cuda_channel_.get();
}

absl::StatusOr<int> AgentImpl::DeviceOnPeer(int peer, int device) const {
  if (peer < 0 || peer >= static_cast<int>(device_map_to_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no worker with id ", peer));
  }
  if (peer == rank_) return device;  // a call to itself stays on the device
  const std::string& name = workers_[peer].name;
  if (!has_device_map_to_[peer]) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot send a tensor on device cuda:", device, " to worker '", name,
                     "': no device map applies (set AgentOptions::devices.maps[\"", name,
                     "\"] on this worker, or a map for this worker on '", name, "')"));
  }
  auto it = device_map_to_[peer].find(device);
  if (it == device_map_to_[peer].end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot send a tensor on device cuda:", device, " to worker '", name,
                     "': the device map for it leaves cuda:", device, " out"));
  }
  return it->second;
}

}  // namespace baton::rpc::internal
