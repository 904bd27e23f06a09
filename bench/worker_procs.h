// Worker processes of a multi-process benchmark, started from the benchmark
// binary itself (/proc/self/exe), and the line protocol between them and the
// driver that started them.
//
//   // driver
//   auto group = WorkerGroup::Spawn({{"ps0", 0}, {"trainer0", 1}}, argv_tail, port).value();
//   absl::Status s = group->Wait(timeout, grace, [&](int w, const std::string& line) {
//     if (line == "done" && ++done == trainers) group->ReleaseAll();
//   });
//   // worker (argv ends with --worker=<index>)
//   WorkerChannel ch = WorkerChannel::Open();
//   ch.Send("loss 0.25"); ch.Send("done");
//   if (!ch.WaitRelease()) return 1;   // the driver gave up or died
//
// Contract:
// - A worker is /proc/self/exe run with the driver's arguments followed by
//   "--worker=<index>", and RANK, WORLD_SIZE (the group's size),
//   MASTER_ADDR=127.0.0.1, MASTER_PORT and BATON_WORKER_NAME in its
//   environment (what rpc::AgentOptions::FromEnv reads). Its stdin is
//   /dev/null, stdout and stderr are the driver's; fd 3 is its report pipe
//   (worker -> driver, text lines) and fd 4 its release pipe (driver ->
//   worker). Workers get SIGKILL if the driver dies (PR_SET_PDEATHSIG).
// - Wait() returns only once every worker has exited and been reaped, bounded
//   by its timeout: when a worker fails (exits non-zero, dies of a signal or
//   exits without a result), the release pipes of all are closed (so workers
//   blocked in WaitRelease() return false) and the rest get `grace` to exit
//   before SIGKILL; at the timeout every worker still running gets SIGKILL.
//   The error names the workers that failed and how.
// - The destructor kills and reaps any worker still running.
//
// Thread-safety: not thread-safe; one driver thread uses a WorkerGroup, and
// a worker uses its WorkerChannel from one thread.
#ifndef BATON_BENCH_WORKER_PROCS_H_
#define BATON_BENCH_WORKER_PROCS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace baton::bench {

struct WorkerSpec {
  std::string name;  // BATON_WORKER_NAME
  int rank = 0;      // RANK; the worker's index in the group is its position
};

class WorkerGroup {
 public:
  // Starts one process per spec. `args` are appended before "--worker=<i>".
  static absl::StatusOr<std::unique_ptr<WorkerGroup>> Spawn(const std::vector<WorkerSpec>& specs,
                                                            const std::vector<std::string>& args,
                                                            int master_port);
  ~WorkerGroup();

  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }
  const std::string& name(int w) const { return workers_[w].name; }

  // Lets worker `w` (or all) past WaitRelease() once. Writing to a worker
  // that has exited is harmless.
  void Release(int w);
  void ReleaseAll();

  // Reads the workers' lines (calling on_line(worker, line) for each, on this
  // thread) until all have exited. See the contract for failures and bounds.
  absl::Status Wait(absl::Duration timeout, absl::Duration grace,
                    const std::function<void(int worker, const std::string& line)>& on_line);

 private:
  struct Worker {
    std::string name;
    pid_t pid = -1;
    int report_fd = -1;   // read end of the worker's fd 3
    int release_fd = -1;  // write end of the worker's fd 4
    std::string partial;  // bytes after the last newline
    bool exited = false;
    int status = 0;  // waitpid status, once exited
  };
  WorkerGroup() = default;
  void CloseReleases();
  void KillAll();

  std::vector<Worker> workers_;
};

// The worker's end. Open() also arms PR_SET_PDEATHSIG.
class WorkerChannel {
 public:
  static WorkerChannel Open();
  // Sends one line ('\n' appended). REQUIRES: no '\n' inside.
  void Send(const std::string& line);
  // Blocks until the driver releases this worker; false if the driver closed
  // the pipe (it gave up) or died.
  bool WaitRelease();

 private:
  WorkerChannel() = default;
};

// The value of "--worker=<i>" among argv, or -1 (the driver).
int WorkerIndex(int argc, char** argv);
// argv[1..] without any --worker= argument (what a driver forwards).
std::vector<std::string> ForwardedArgs(int argc, char** argv);

}  // namespace baton::bench

#endif  // BATON_BENCH_WORKER_PROCS_H_
