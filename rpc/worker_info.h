// WorkerInfo: the identity of one worker in a job.
//
// Ids are ranks (0..world_size-1); names are unique within a job.
// Thread-safety: plain value.
#ifndef BATON_RPC_WORKER_INFO_H_
#define BATON_RPC_WORKER_INFO_H_

#include <ostream>
#include <string>
#include <vector>

namespace baton::rpc {

struct WorkerInfo {
  std::string name;
  int id = -1;
  // host:port of the worker's RPC server.
  std::string address;
  // What runs on it above the C++ API (AgentOptions::front_ends).
  std::vector<std::string> front_ends;

  bool operator==(const WorkerInfo& o) const { return id == o.id && name == o.name; }
};

inline std::ostream& operator<<(std::ostream& os, const WorkerInfo& w) {
  return os << "WorkerInfo(name=" << w.name << ", id=" << w.id << ")";
}

}  // namespace baton::rpc

#endif  // BATON_RPC_WORKER_INFO_H_
