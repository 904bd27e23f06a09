// Device maps (rpc/internal/device_maps.h): the job's check of every
// worker's maps, in torch's words and in rank order, and the maps a worker
// resolves from the registrations, the host included.
#include "rpc/internal/device_maps.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"

namespace baton::rpc::internal {
namespace {

struct Worker {
  std::string name;
  int cuda_devices = 0;
  std::map<std::string, std::map<int, int>> maps;
  std::vector<int> devices;  // AgentOptions::devices.devices
};

std::vector<proto::WorkerRecord> Records(const std::vector<Worker>& workers) {
  std::vector<proto::WorkerRecord> records;
  for (const Worker& w : workers) {
    proto::WorkerRecord& r = records.emplace_back();
    r.set_name(w.name);
    r.set_cuda_devices(w.cuda_devices);
    for (const auto& [to, map] : w.maps) {
      auto& devices = *(*r.mutable_device_maps())[to].mutable_devices();
      for (const auto& [from, there] : map) devices[from] = there;
    }
    for (int device : w.devices) r.add_devices(device);
  }
  return records;
}

void ExpectRefused(const std::vector<Worker>& workers, const std::string& want) {
  const absl::Status s = CheckJobDeviceMaps(Records(workers));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), want)) << s << "\nwant: " << want;
}

TEST(JobDeviceMaps, MapsOfExistingDevicesAndTheHostPass) {
  EXPECT_TRUE(
      CheckJobDeviceMaps(Records({
                             {"w0", 2, {{"w1", {{kCpuDevice, 1}, {0, kCpuDevice}, {1, 0}}}}},
                             {"w1", 2, {{"w0", {{0, 1}}}}},
                             {"w2", 0, {{"w0", {{kCpuDevice, kCpuDevice}}}}},
                         }))
          .ok());
  EXPECT_TRUE(CheckJobDeviceMaps(Records({{"w0"}, {"w1"}})).ok());
}

// Every worker reads the same registrations, so every worker reports the
// same fault: the first one, in rank order.
TEST(JobDeviceMaps, TheFirstWorkerAtFaultInRankOrderIsNamed) {
  ExpectRefused({{"w0", 1, {{"w1", {{1, 0}}}}}, {"w1", 1, {{"w0", {{1, 0}}}}}},
                "Node w0 has source devices with invalid indices in its device map for w1: "
                "cuda:1, but w0 has 1 CUDA device(s)");
  ExpectRefused({{"w0", 1}, {"w1", 1, {{"w0", {{3, 0}}}}}, {"w2", 1, {{"w0", {{0, 5}}}}}},
                "Node w1 has source devices with invalid indices");
}

TEST(JobDeviceMaps, AWorkerNotInTheJobIsRefused) {
  ExpectRefused({{"w0", 1, {{"w1", {{0, 0}}}, {"none_exist", {{0, 0}}}}}, {"w1", 1}},
                "Node w0 has invalid target node names in its device maps: 'none_exist' is not a "
                "worker of this job");
}

TEST(JobDeviceMaps, AMapForItselfIsRefused) {
  ExpectRefused({{"w0", 2, {{"w0", {{0, 1}}}}}, {"w1", 2}}, "Node w0 has a device map for itself");
}

TEST(JobDeviceMaps, TwoDevicesMappedToOneAreRefusedBeforeTheirIndices) {
  ExpectRefused({{"w0", 0, {{"w1", {{1, 0}, {0, 0}}}}}, {"w1", 0}},
                "Node w0 has duplicated target devices in its device map for w1: cuda:0 is the "
                "target of both cuda:0 and cuda:1");
}

TEST(JobDeviceMaps, AnIndexNoDeviceHasIsRefused) {
  ExpectRefused({{"w0", 1, {{"w1", {{-3, 0}}}}}, {"w1", 1}},
                "Node w0 has source devices with invalid indices in its device map for w1: "
                "cuda:-3, but w0 has 1 CUDA device(s)");
  ExpectRefused({{"w0", 1, {{"w1", {{0, 0}, {kCpuDevice, 2}}}}}, {"w1", 2}},
                "Node w0 has target devices with invalid indices in its device map for w1: cpu "
                "to cuda:2, but w1 has 2 CUDA device(s)");
  // The host is on every worker; a GPU is not.
  ExpectRefused({{"w0", 0, {{"w1", {{kCpuDevice, 0}}}}}, {"w1", 0}},
                "Node w0 has target devices with invalid indices in its device map for w1: cpu "
                "to cuda:0, but w1 has 0 CUDA device(s)");
}

// torch's TensorPipeRpcBackendOptions.devices: each worker's list is
// checked first, then the maps keep to the lists.
TEST(JobDeviceMaps, AWorkersDevicesAreCheckedBeforeAnyMap) {
  ExpectRefused({{"w0", 0, {{"w1", {{0, 0}}}}}, {"w1", 2, {}, {1, kCpuDevice, 1}}},
                "Node w1 has duplicated devices: cuda:1 is listed twice in (cuda:1, cpu, cuda:1)");
  ExpectRefused({{"w0", 1, {}, {kCpuDevice, 1}}, {"w1", 1}},
                "Node w0 has devices with invalid indices: cuda:1, but w0 has 1 CUDA device(s)");
}

TEST(JobDeviceMaps, MapsKeepToTheDevicesTheirWorkersListed) {
  EXPECT_TRUE(CheckJobDeviceMaps(
                  Records({
                      {"w0", 2, {{"w1", {{1, 0}, {kCpuDevice, kCpuDevice}}}}, {1, kCpuDevice}},
                      {"w1", 2, {}, {0, kCpuDevice}},
                  }))
                  .ok());
  ExpectRefused({{"w0", 2, {{"w1", {{0, 0}}}}, {1}}, {"w1", 2}},
                "Node w0 has unexpected source devices in its device map for w1: cuda:0 is not "
                "among its devices (cuda:1)");
  ExpectRefused({{"w0", 2, {{"w1", {{0, 1}}}}}, {"w1", 2, {}, {0}}},
                "Node w0 has unexpected target devices in its device map for w1: cuda:0 to "
                "cuda:1, which is not among the devices of w1 (cuda:0)");
}

constexpr bool kRequest = false;
constexpr bool kAnswer = true;

// As torch's: a request follows the sender's own map, an answer the inverse
// of the caller's; a CUDA tensor whose map is missing follows the other
// side's, a CPU tensor then stays on the CPU.
TEST(DeviceMaps, ARequestFollowsItsSendersMapAndAnAnswerTheCallersInverted) {
  const auto records = Records({
      {"w0", 2, {{"w1", {{kCpuDevice, 0}, {0, kCpuDevice}}}, {"w2", {{1, 1}}}}},
      {"w1", 1},
      {"w2", 2, {{"w0", {{0, 0}}}}},
  });
  const DeviceMaps w0 = DeviceMaps::Resolve(records, 0);
  EXPECT_EQ(w0.DeviceOnPeer(1, kCpuDevice, kRequest), 0);
  EXPECT_EQ(w0.DeviceOnPeer(1, 0, kRequest), kCpuDevice);
  EXPECT_EQ(w0.DeviceOnPeer(1, 1, kRequest), kNoDevice);
  // Answers to w1, which set no map: CUDA tensors through w0's own map.
  EXPECT_EQ(w0.DeviceOnPeer(1, kCpuDevice, kAnswer), kCpuDevice);
  EXPECT_EQ(w0.DeviceOnPeer(1, 0, kAnswer), kCpuDevice);
  // Requests to w2 follow w0's own map, answers the inverse of w2's.
  EXPECT_EQ(w0.DeviceOnPeer(2, 1, kRequest), 1);
  EXPECT_EQ(w0.DeviceOnPeer(2, 0, kRequest), kNoDevice);
  EXPECT_EQ(w0.DeviceOnPeer(2, 0, kAnswer), 0);
  EXPECT_EQ(w0.DeviceOnPeer(2, 1, kAnswer), kNoDevice);
  EXPECT_EQ(w0.DeviceOnPeer(2, kCpuDevice, kRequest), kCpuDevice);

  const DeviceMaps w1 = DeviceMaps::Resolve(records, 1);
  EXPECT_TRUE(w1.HasMap(0));
  EXPECT_EQ(w1.DeviceOnPeer(0, 0, kAnswer), kCpuDevice);  // w0's map, inverted
  EXPECT_EQ(w1.DeviceOnPeer(0, kCpuDevice, kAnswer), 0);
  // w1's own requests: a CPU tensor stays on the CPU (w1 set no map); a
  // CUDA tensor follows w0's map, inverted.
  EXPECT_EQ(w1.DeviceOnPeer(0, kCpuDevice, kRequest), kCpuDevice);
  EXPECT_EQ(w1.DeviceOnPeer(0, 0, kRequest), kCpuDevice);
  EXPECT_FALSE(w1.HasMap(2));
  EXPECT_EQ(w1.DeviceOnPeer(2, kCpuDevice, kRequest), kCpuDevice);
  EXPECT_EQ(w1.DeviceOnPeer(2, 0, kAnswer), kNoDevice);
}

// Both sides map the host to their peer's GPU: a reply's GPU tensor comes
// back to the caller's host, and its CPU tensor stays on the CPU (torch).
TEST(DeviceMaps, WithMapsOnBothSidesAReplyFollowsTheCallersMap) {
  const auto records = Records({
      {"w0", 1, {{"w1", {{kCpuDevice, 0}}}}},
      {"w1", 1, {{"w0", {{kCpuDevice, 0}}}}},
  });
  const DeviceMaps w1 = DeviceMaps::Resolve(records, 1);
  EXPECT_EQ(w1.DeviceOnPeer(0, 0, kAnswer), kCpuDevice);
  EXPECT_EQ(w1.DeviceOnPeer(0, kCpuDevice, kAnswer), kCpuDevice);
  EXPECT_EQ(w1.DeviceOnPeer(0, kCpuDevice, kRequest), 0);
  EXPECT_EQ(w1.DeviceOnPeer(0, 0, kRequest), kNoDevice);
}

TEST(DeviceMaps, WithoutMapsTheHostsTensorsStayAndCudaTensorsHaveNowhereToGo) {
  const DeviceMaps none;
  for (bool answers : {kRequest, kAnswer}) {
    EXPECT_FALSE(none.HasMap(0));
    EXPECT_EQ(none.DeviceOnPeer(0, kCpuDevice, answers), kCpuDevice);
    EXPECT_EQ(none.DeviceOnPeer(7, kCpuDevice, answers), kCpuDevice);
    EXPECT_EQ(none.DeviceOnPeer(0, 0, answers), kNoDevice);
  }
}

}  // namespace
}  // namespace baton::rpc::internal
