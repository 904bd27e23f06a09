#include "rpc/internal/device_maps.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace baton::rpc::internal {
namespace {

bool Exists(int device, int cuda_devices) {
  return device == kCpuDevice || (device >= 0 && device < cuda_devices);
}

// A worker's maps in the order of their workers' names (a protobuf map has
// no order of its own, and every worker must find the same fault first).
std::vector<std::pair<std::string, std::map<int, int>>> SortedMaps(
    const proto::WorkerRecord& record) {
  std::vector<std::pair<std::string, std::map<int, int>>> maps;
  for (const auto& [worker, map] : record.device_maps()) {
    maps.emplace_back(worker, std::map<int, int>(map.devices().begin(), map.devices().end()));
  }
  std::sort(maps.begin(), maps.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return maps;
}

std::string DeviceList(const proto::WorkerRecord& record) {
  std::string out;
  for (int device : record.devices())
    absl::StrAppend(&out, out.empty() ? "" : ", ", DeviceName(device));
  return out;
}

bool Listed(int device, const proto::WorkerRecord& record) {
  return std::find(record.devices().begin(), record.devices().end(), device) !=
         record.devices().end();
}

// A worker's own list of devices (AgentOptions::devices.devices).
absl::Status CheckDevices(const proto::WorkerRecord& record) {
  const std::string& node = record.name();
  std::set<int> seen;
  for (int device : record.devices()) {
    if (!seen.insert(device).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Node ", node, " has duplicated devices: ", DeviceName(device),
                       " is listed twice in (", DeviceList(record), ")"));
    }
    if (!Exists(device, record.cuda_devices())) {
      return absl::InvalidArgumentError(
          absl::StrCat("Node ", node, " has devices with invalid indices: ", DeviceName(device),
                       ", but ", node, " has ", record.cuda_devices(), " CUDA device(s)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMap(const proto::WorkerRecord& source, const std::string& target_name,
                      const std::map<int, int>& map, const proto::WorkerRecord& target) {
  const std::string& node = source.name();
  const std::string in_map = absl::StrCat(" in its device map for ", target_name, ": ");
  std::map<int, int> from_of;  // target device -> the source device mapped to it
  for (const auto& [from, to] : map) {
    auto [it, inserted] = from_of.emplace(to, from);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("Node ", node, " has duplicated target devices", in_map, DeviceName(to),
                       " is the target of both ", DeviceName(it->second), " and ", DeviceName(from),
                       " (a device map must be one-to-one, so that replies can come back)"));
    }
  }
  // The source devices: among the worker's own list where it set one, else
  // among those it has. The same for the targets, on the target.
  for (const auto& [from, to] : map) {
    if (!source.devices().empty() && !Listed(from, source)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Node ", node, " has unexpected source devices", in_map, DeviceName(from),
                       " is not among its devices (", DeviceList(source), ")"));
    }
    if (source.devices().empty() && !Exists(from, source.cuda_devices())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Node ", node, " has source devices with invalid indices", in_map, DeviceName(from),
          ", but ", node, " has ", source.cuda_devices(), " CUDA device(s)"));
    }
  }
  for (const auto& [from, to] : map) {
    if (!target.devices().empty() && !Listed(to, target)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Node ", node, " has unexpected target devices", in_map, DeviceName(from),
                       " to ", DeviceName(to), ", which is not among the devices of ", target_name,
                       " (", DeviceList(target), ")"));
    }
    if (target.devices().empty() && !Exists(to, target.cuda_devices())) {
      return absl::InvalidArgumentError(
          absl::StrCat("Node ", node, " has target devices with invalid indices", in_map,
                       DeviceName(from), " to ", DeviceName(to), ", but ", target_name, " has ",
                       target.cuda_devices(), " CUDA device(s)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string DeviceName(int device) {
  return device == kCpuDevice ? std::string("cpu") : absl::StrCat("cuda:", device);
}

absl::Status CheckJobDeviceMaps(const std::vector<proto::WorkerRecord>& records) {
  absl::flat_hash_map<std::string, int> rank_of;
  for (size_t r = 0; r < records.size(); ++r) rank_of.emplace(records[r].name(), r);
  for (const proto::WorkerRecord& record : records) {
    if (absl::Status s = CheckDevices(record); !s.ok()) return s;
  }
  for (const proto::WorkerRecord& source : records) {
    const auto maps = SortedMaps(source);
    for (const auto& [target, map] : maps) {
      if (!rank_of.contains(target)) {
        return absl::InvalidArgumentError(
            absl::StrCat("Node ", source.name(), " has invalid target node names in its device ",
                         "maps: '", target, "' is not a worker of this job"));
      }
      if (target == source.name()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Node ", source.name(), " has a device map for itself: a call to its own ",
                         "functions keeps its tensors' devices"));
      }
    }
    for (const auto& [target, map] : maps) {
      if (absl::Status s = CheckMap(source, target, map, records[rank_of.at(target)]); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

DeviceMaps DeviceMaps::Resolve(const std::vector<proto::WorkerRecord>& records, int rank) {
  DeviceMaps maps;
  maps.own_.assign(records.size(), std::nullopt);
  maps.inverse_.assign(records.size(), std::nullopt);
  if (rank < 0 || rank >= static_cast<int>(records.size())) return maps;
  const std::string& self = records[rank].name();
  for (size_t peer = 0; peer < records.size(); ++peer) {
    if (static_cast<int>(peer) == rank) continue;
    const auto& mine = records[rank].device_maps();
    if (auto it = mine.find(records[peer].name()); it != mine.end()) {
      maps.own_[peer].emplace(it->second.devices().begin(), it->second.devices().end());
    }
    const auto& theirs = records[peer].device_maps();
    if (auto it = theirs.find(self); it != theirs.end()) {
      auto& inverse = maps.inverse_[peer].emplace();
      for (const auto& [there, here] : it->second.devices()) inverse[here] = there;
    }
  }
  return maps;
}

const std::map<int, int>* DeviceMaps::Applying(int peer, int device, bool answers) const {
  if (peer < 0 || peer >= static_cast<int>(own_.size())) return nullptr;
  const auto& first = answers ? inverse_[peer] : own_[peer];
  if (first.has_value()) return &*first;
  if (device == kCpuDevice) return nullptr;
  const auto& second = answers ? own_[peer] : inverse_[peer];
  return second.has_value() ? &*second : nullptr;
}

int DeviceMaps::DeviceOnPeer(int peer, int device, bool answers) const {
  if (const std::map<int, int>* map = Applying(peer, device, answers); map != nullptr) {
    if (auto it = map->find(device); it != map->end()) return it->second;
  }
  return device == kCpuDevice ? kCpuDevice : kNoDevice;
}

bool DeviceMaps::HasMap(int peer) const {
  return peer >= 0 && peer < static_cast<int>(own_.size()) &&
         (own_[peer].has_value() || inverse_[peer].has_value());
}

}  // namespace baton::rpc::internal
