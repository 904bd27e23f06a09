// The job-wide state report: what each worker waits for, what waits for it,
// and whether anything still moves (docs/observability.md, "Hang reports").
//
// Each worker's agent builds a proto::WorkerState (proto/state.proto) when
// asked: its outgoing and incoming calls, its executor's threads, its
// progress counters, and what each protocol layer adds through a state
// collector (FunctionRegistry::AddStateCollector): RRefs and forks not yet
// confirmed, autograd contexts, PS clocks and parked pulls, the pipeline
// stage's action. baton-run asks every worker on its node (on SIGUSR1,
// `baton-run --dump RUN_ID`, or --hang_timeout) and merges the answers with
// BuildReport into a wait-for graph.
//
// Wait-for graph (labels H1-H4, tests in tests/obs/state_test.cc and
// tests/obs/hang_report_test.cc):
// H1 Every outgoing call is an edge caller -> callee of kind "rpc"; every
//    wait a collector adds is an edge of its kind. Edges name what is waited
//    for and since when.
// H2 Every cycle of the graph is listed once, as its ranks from the
//    smallest ("0 -> 1 -> 0"), at most kMaxCycles of them.
// H3 For every rank that waits, the report names where its chains end: the
//    ranks it reaches that wait for nobody (or did not answer), or says that
//    every chain from it runs into a cycle.
// H4 A worker that does not answer within the deadline is listed with the
//    reason; edges toward it stay, so it shows as the end of the chains that
//    reach it.
//
// Thread-safety: StateWriter is used by one thread at a time (the agent's
// state request); BuildReport and ReportText are pure functions.
#ifndef BATON_OBS_STATE_H_
#define BATON_OBS_STATE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/state.pb.h"

namespace baton::obs {

// What a state collector writes into a worker's snapshot.
class StateWriter {
 public:
  StateWriter(proto::WorkerState* out, absl::Time now) : out_(out), now_(now) {}
  absl::Time now() const { return now_; }
  int self() const { return out_->rank(); }

  class Section {
   public:
    explicit Section(proto::StateSection* s) : s_(s) {}
    Section& Field(absl::string_view key, absl::string_view value);
    Section& Field(absl::string_view key, int64_t value);
    Section& Line(absl::string_view text);

   private:
    proto::StateSection* s_;
  };
  // A section of the snapshot (one per protocol layer).
  Section AddSection(absl::string_view name);
  // This worker waits for `to` (H1), since `since`.
  void AddWait(int to, absl::string_view kind, absl::string_view what, absl::Time since);
  // A counter that grows while this worker makes progress.
  void AddProgress(absl::string_view name, int64_t value);

  proto::WorkerState& state() { return *out_; }

 private:
  proto::WorkerState* out_;
  absl::Time now_;
};

inline constexpr int kMaxCycles = 64;

// Merges the snapshots of the workers that answered, and those that did not
// (rank -> why), into a report (H1-H4) with its summary in words.
proto::StateReport BuildReport(const std::string& run_id, const std::string& reason,
                               std::vector<proto::WorkerState> workers,
                               const std::map<int, std::string>& unanswered, absl::Time now);

// The report as printed: the summary, then each worker's calls and sections.
std::string ReportText(const proto::StateReport& report);

// JSON of a snapshot or report (protobuf's JSON mapping), and back.
std::string ToJson(const google::protobuf::Message& m, bool compact = false);
absl::Status FromJson(absl::string_view json, google::protobuf::Message* m);

// The sum of a snapshot's progress counters: baton-run's --hang_timeout
// compares it between snapshots.
int64_t TotalProgress(const proto::WorkerState& w);

}  // namespace baton::obs

#endif  // BATON_OBS_STATE_H_
