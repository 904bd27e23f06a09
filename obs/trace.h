// The job's timeline: spans every worker records with BATON_TRACE=DIR
// (AgentOptions::observability.trace_dir), merged into one Chrome trace by `baton-trace`
// (docs/observability.md, "One timeline").
//
// What is recorded (labels TL1-TL4, tests in tests/obs/trace_test.cc):
// TL1 Every RPC on both sides: on the caller a slice from the call to its
//    completion; on the callee a "queued" slice from the request's arrival
//    to its function's start, when it waited, and a slice from the start to
//    the reply. The protocols' work shows as the calls they make and serve
//    (distributed autograd's backward messages, PS pulls and pushes,
//    pipeline deliveries, RRef control).
// TL2 Flow arrows link each request's send to its arrival and each reply's
//    send to its arrival (Chrome's "s"/"f" events, ids unique in the job).
// TL3 Clocks: each worker except rank 0 measures its offset to rank 0's
//    clock when tracing starts, with 8 round trips of a tiny call, keeping
//    the one of least round-trip time (NTP's method); the offset is
//    rank 0's time at the reply minus the midpoint of the round trip, and
//    its error bound half that round trip. Both go in the file's header;
//    Merge shifts every worker onto rank 0's clock.
// TL4 Merge writes one process per worker (named after it, ordered by
//    rank), one thread per recording thread, timestamps relative to the
//    earliest event, and keeps every flow whose two ends it has.
//
// Cost: nothing unless tracing is on; then one buffered event per slice,
// written out every 4096 events and at the recorder's end.
//
// Thread-safety: TraceRecorder is safe for concurrent use; Merge is a pure
// function of the files.
#ifndef BATON_OBS_TRACE_H_
#define BATON_OBS_TRACE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/trace.pb.h"

namespace baton::obs {

class TraceRecorder {
 public:
  // Writes "<dir>/trace_pid<P>_<n>.jsonl" (the directory is created; n
  // counts the recorders of the process).
  static absl::StatusOr<std::unique_ptr<TraceRecorder>> Open(const std::string& dir);
  ~TraceRecorder();  // flushes
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // Who records, and TL3's clock: written with the header at the first flush
  // (the header goes first in the file; later calls change nothing).
  void SetIdentity(int rank, const std::string& worker);
  void SetClock(double offset_us, double error_us, const std::string& method);

  // A slice [start, end) on the calling thread. `flow_out`: the id of an
  // arrow that leaves at `flow_out_at` (inside the slice); `flow_in`: the id
  // of an arrow that arrives at `flow_in_at`. Empty ids: none.
  struct Flow {
    std::string id;
    absl::Time at;
  };
  void Slice(const std::string& name, const std::string& cat, absl::Time start, absl::Time end,
             std::map<std::string, std::string> args, const Flow& flow_out = {},
             const Flow& flow_in = {});

  void Flush();
  const std::string& path() const { return path_; }

 private:
  TraceRecorder(std::string path, proto::TraceHeader header)
      : path_(std::move(path)), header_(std::move(header)) {}
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  proto::TraceHeader header_ ABSL_GUARDED_BY(mu_);
  bool header_written_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<proto::TraceEvent> pending_ ABSL_GUARDED_BY(mu_);
};

// TL4: merges every "trace_*.jsonl" in `dir` into one Chrome trace (JSON).
// INVALID_ARGUMENT when the directory has no trace file; DATA_LOSS naming
// the file and line of an unreadable one.
absl::StatusOr<proto::TraceFile> MergeTraces(const std::string& dir);
std::string TraceJson(const proto::TraceFile& trace);

// The part of a merged trace that overlaps [from_us, to_us) (times as in
// the merged trace), shifted to start at 0; arrows only with both ends in.
proto::TraceFile CropTrace(const proto::TraceFile& trace, double from_us, double to_us);

// A view of a merged trace: the slices `keep` accepts, with the names of
// their processes, shifted to start at 0. Arrows are left out (an end's
// slice may be gone). baton-trace's --cat and --arg filters, and the
// pipeline's step view (pipeline/trace.h), are such views.
proto::TraceFile SelectTrace(const proto::TraceFile& trace,
                             const std::function<bool(const proto::TraceEvent&)>& keep);

// A picture of a merged trace (SVG, `width` pixels wide): a lane per worker
// thread (named after the worker's process_name, with the thread when the
// worker has several), grouped by worker in pid order; each slice a box,
// labelled where it fits, coloured by category (rpc, serve, queue, autograd,
// forward, backward, send and recv; "idle" slices stay blank); each flow
// arrow a line from its start to its end; a time axis in milliseconds; a
// legend of the categories drawn.
std::string TraceSvg(const proto::TraceFile& trace, int width = 1200);

}  // namespace baton::obs

#endif  // BATON_OBS_TRACE_H_
