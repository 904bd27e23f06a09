// PsServer: serves one ServerShard over RPC and keeps it checkpointed.
//
//   auto registry = std::make_shared<rpc::FunctionRegistry>();
//   auto server = ps::PsServer::Create(spec, {.server = role_rank,
//                                             .num_servers = role_size,
//                                             .checkpoint_dir = "/ckpt"}, *registry);
//   auto agent = rpc::RpcAgent::Create(options, registry).value();
//   ...  // trainers call it; the server's own thread may just wait
//   server->Stop();   // final checkpoint (if a directory is set)
//   agent->Shutdown();
//
// Contract:
// - Create() registers the ps functions on `registry` (before the agent
//   starts) and, when checkpoint_dir holds a checkpoint of this server, loads
//   the newest valid one (an unreadable or corrupt file is logged and the
//   next older one tried). Requests then see the restored shard.
// - Checkpoints (PS8 in ps/server_shard.h) are written to
//   checkpoint_dir/server<k>-of-<S>/ckpt-<clock>-<seq> atomically: written
//   to a temporary file, fsync'ed, renamed, and the directory fsync'ed; a
//   checksum over the bytes rejects torn or corrupt files on load. One is
//   written each time the progress clock (kSync: applied clocks; otherwise
//   the slowest live trainer's clock) reaches a new multiple of
//   checkpoint_every_clocks (the push that reaches it wakes the maintenance
//   thread at once), or after checkpoint_every of time, whichever comes
//   first, by a maintenance thread that also runs ServerShard::CheckWaits
//   every check_interval. The two newest are kept.
//   Work lost when a server dies is what it applied since its last
//   checkpoint: checkpoint_every_clocks clocks or checkpoint_every, plus
//   what it applied while the next one was being written (training does
//   not wait for the disk, and a loaded disk's fsync can take seconds).
// - Errors of the remote functions keep their codes (ps/server_shard.h).
//
// Thread-safety: safe for concurrent use. Request handlers run on the
// agent's executor; a pull that must wait is parked, holding no thread.
#ifndef BATON_PS_SERVER_H_
#define BATON_PS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps/server_shard.h"
#include "ps/spec.h"
#include "rpc/function.h"

namespace baton::ps {

struct ServerOptions {
  int server = 0;
  int num_servers = 1;
  // Empty: no checkpoints.
  std::string checkpoint_dir;
  int64_t checkpoint_every_clocks = 0;                     // 0: not by clocks
  absl::Duration checkpoint_every = absl::ZeroDuration();  // zero: not by time
  absl::Duration check_interval = absl::Milliseconds(100);
  ServerShard::Logger log;  // null: stderr
  // Dense tables through shared memory with trainers of this host (the
  // parameter board and the trainers' gradient boxes,
  // ps/internal/shared_tables.h, SD1-SD5); trainers elsewhere, or with
  // PsClient::Options::same_host_shm off, use messages. Off: messages only.
  bool same_host_shm = true;
};

class PsServer {
 public:
  static absl::StatusOr<std::unique_ptr<PsServer>> Create(PsSpec spec, ServerOptions options,
                                                          rpc::FunctionRegistry& registry);
  ~PsServer();  // Stop(false)

  ServerShard& shard() { return *shard_; }
  // The clock of the checkpoint loaded at Create(), or -1 if none was.
  int64_t restored_clock() const { return restored_clock_; }
  // Shared memory this server created for same-host dense tables (its
  // parameter board); also the gauge baton_ps_shared_memory_bytes.
  int64_t shared_memory_bytes() const { return shared_bytes_(); }

  // Writes a checkpoint now; returns its path. FAILED_PRECONDITION without
  // a checkpoint directory.
  absl::StatusOr<std::string> CheckpointNow();
  // Stops the maintenance thread; with final_checkpoint and a directory,
  // writes one last checkpoint. Idempotent.
  absl::Status Stop(bool final_checkpoint = true);

  // Newest valid checkpoint bytes under `dir` for this server, NOT_FOUND if
  // there is none.
  static absl::StatusOr<std::string> LoadLatest(const std::string& dir, int server,
                                                int num_servers);

 private:
  PsServer(std::shared_ptr<ServerShard> shard, ServerOptions options);
  void Maintain();
  // Create's step: the checkpoint sequence and the latest checkpoint.
  absl::Status RestoreLatestCheckpoint();
  int64_t ProgressClock() const;

  // What the registered checkpoint function reaches the server through: it
  // is cleared (under its mutex, so after any call in progress) when the
  // server is destroyed, and the registry may outlive the server.
  struct Handle {
    absl::Mutex mu;
    PsServer* server ABSL_GUARDED_BY(mu) = nullptr;
    // The last multiple of checkpoint_every_clocks the progress clock was
    // seen to reach (by a push), so that crossing the next one wakes the
    // maintenance thread at once.
    std::atomic<int64_t> boundary{0};
  };
  // A push made the progress clock reach a new multiple of
  // checkpoint_every_clocks: check for a checkpoint now.
  void WakeForCheckpoint();

  const std::shared_ptr<ServerShard> shard_;
  const ServerOptions options_;
  const std::shared_ptr<Handle> handle_ = std::make_shared<Handle>();
  int64_t restored_clock_ = -1;
  std::function<int64_t()> shared_bytes_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  int64_t checkpoint_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_checkpoint_clock_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_checkpoint_time_ ABSL_GUARDED_BY(mu_);
  absl::Mutex write_mu_;  // one checkpoint write at a time
  std::thread thread_;
};

}  // namespace baton::ps

#endif  // BATON_PS_SERVER_H_
