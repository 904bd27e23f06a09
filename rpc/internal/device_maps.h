// Device maps (AgentOptions::devices.maps, docs/cuda.md): where a tensor
// sent to a peer arrives, and the check every worker makes of the whole
// job's maps once it has read every registration.
//
// A map takes this worker's devices to the peer's: a CUDA index, or
// kCpuDevice (rpc/codec.h) for the host. So {{kCpuDevice, 0}} puts the CPU tensors sent
// to the peer on its cuda:0, and {{0, kCpuDevice}} puts this worker's
// cuda:0 tensors in the peer's host memory, as torch's
// TensorPipeRpcBackendOptions.set_device_map({"cpu": 0}) and ({0: "cpu"}).
// A CPU tensor that no map names stays on the CPU; a CUDA tensor that no
// map names cannot be sent.
//
// The job check (CheckJobDeviceMaps) reads only the registrations, which
// are the same on every worker, and reports the first fault in rank order.
// So every worker of a job fails its init with the same error, naming the
// worker whose map is at fault, as torch's init_rpc does; the words are
// torch's (its suites match them), followed by what exactly is wrong.
//
// Thread-safety: DeviceMaps is immutable once made; any thread may read it.
// The functions are pure.
#ifndef BATON_RPC_INTERNAL_DEVICE_MAPS_H_
#define BATON_RPC_INTERNAL_DEVICE_MAPS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/rpc.pb.h"
#include "rpc/codec.h"  // kCpuDevice

namespace baton::rpc::internal {

// No device: what DeviceMaps::DeviceOnPeer answers for a CUDA device that
// no map toward the peer names.
inline constexpr int kNoDevice = -2;

// "cpu" or "cuda:<index>".
std::string DeviceName(int device);

// Every worker's device maps against the registrations. First each
// worker's own list of devices (AgentOptions::devices.devices), where set:
// no device twice, and only devices that exist (CUDA indices below the
// worker's count of CUDA devices, or the host). Then the maps: a map may
// name only workers of the job and never its own worker, take no two
// devices to one (replies come back through its inverse), and name only
// devices in its worker's list and its target's (or, where a worker set no
// list, devices that exist). INVALID_ARGUMENT for the first fault, ranks in
// order and each worker's maps in the order of their workers' names.
absl::Status CheckJobDeviceMaps(const std::vector<proto::WorkerRecord>& records);

// One worker's maps toward each rank of its job, and which of them a tensor
// follows, as torch's: a request's tensors follow this worker's own map
// for the peer, and a reply's (or what else answers tensors the peer sent,
// CodecContext::answers) the inverse of the peer's map for this worker. A
// CUDA tensor whose map is missing follows the other one, where set (so one
// side's map is enough for CUDA tensors both ways, where torch would refuse
// them); a CPU tensor then stays on the CPU, as torch keeps it.
class DeviceMaps {
 public:
  // No maps: CPU tensors stay on the CPU, CUDA tensors go nowhere.
  DeviceMaps() = default;

  // The maps of the worker of rank `rank`, from the registrations: its own
  // map for each peer, and the inverse of each peer's map for it. Entries
  // CheckJobDeviceMaps would refuse are taken as they are: call it first.
  static DeviceMaps Resolve(const std::vector<proto::WorkerRecord>& records, int rank);

  // Where a tensor on `device` (kCpuDevice or a CUDA index) of this worker
  // arrives on `peer`, in a request (`answers` false) or an answer:
  // kCpuDevice for a CPU tensor no map takes elsewhere, kNoDevice for a
  // CUDA tensor no map names.
  int DeviceOnPeer(int peer, int device, bool answers) const;
  // Whether any map concerns `peer`: this worker's own, or the peer's.
  bool HasMap(int peer) const;

 private:
  // The map a tensor on `device` sent to `peer` follows, or null.
  const std::map<int, int>* Applying(int peer, int device, bool answers) const;

  // Per rank: this worker's own map for it, and the inverse of its map for
  // this worker (device here -> device there), where set.
  std::vector<std::optional<std::map<int, int>>> own_;
  std::vector<std::optional<std::map<int, int>>> inverse_;
};

}  // namespace baton::rpc::internal

#endif  // BATON_RPC_INTERNAL_DEVICE_MAPS_H_
