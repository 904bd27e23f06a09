// AgentImpl's CUDA device maps (AgentOptions::devices.maps, docs/cuda.md):
// what a worker publishes, the maps it resolves from the registrations, and
// the lookup the tensor codec makes per tensor. The maps themselves and the
// job's check of them are internal::DeviceMaps (rpc/internal/device_maps.h).
#include <torch/cuda.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/internal/agent_impl.h"
#include "rpc/internal/device_maps.h"

namespace baton::rpc::internal {

int LocalCudaDevices() { return static_cast<int>(torch::cuda::device_count()); }

void PublishDeviceMaps(const AgentOptions& options, proto::WorkerRecord& mine) {
  for (const auto& [worker, devices] : options.devices.maps) {
    auto& map = (*mine.mutable_device_maps())[worker];
    for (const auto& [from, to] : devices) (*map.mutable_devices())[from] = to;
  }
  mine.set_cuda_devices(LocalCudaDevices());
  for (int device : options.devices.devices) mine.add_devices(device);
}

void AgentImpl::ResolveDeviceMaps(const std::vector<proto::WorkerRecord>& records) {
  // CUDA IPC reaches other processes of this host that have a channel too.
  const proto::WorkerRecord& mine = records[rank_];
  cuda_channel_peer_.assign(records.size(), false);
  for (size_t peer = 0; peer < records.size(); ++peer) {
    cuda_channel_peer_[peer] =
        static_cast<int>(peer) != rank_ && !mine.boot_id().empty() && mine.cuda_ipc() &&
        records[peer].cuda_ipc() && records[peer].boot_id() == mine.boot_id() &&
        records[peer].pid_namespace() == mine.pid_namespace() && records[peer].pid() != mine.pid();
  }
  device_maps_ = DeviceMaps::Resolve(records, rank_);
}

CudaTensorChannel* AgentImpl::CudaChannelFor(int peer) const {
  if (cuda_channel_ == nullptr || peer < 0 || peer >= static_cast<int>(cuda_channel_peer_.size()) ||
      !cuda_channel_peer_[peer]) {
    return nullptr;
  }
  return cuda_channel_.get();
}

absl::StatusOr<int> AgentImpl::DeviceOnPeer(int peer, int device, bool answers) const {
  if (peer < 0 || peer >= static_cast<int>(workers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no worker with id ", peer));
  }
  if (peer == rank_) return device;  // a call to itself keeps its devices
  const int there = device_maps_.DeviceOnPeer(peer, device, answers);
  if (there != kNoDevice) return there;
  const std::string& name = workers_[peer].name;
  const std::string what =
      absl::StrCat("cannot send a tensor on device cuda:", device, " to worker '", name, "': ");
  if (!device_maps_.HasMap(peer)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "no device map applies (set AgentOptions::devices.maps[\"", name,
                     "\"] on this worker, or a map for this worker on '", name, "')"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, "the device map for it leaves cuda:", device, " out"));
}

}  // namespace baton::rpc::internal
