// Pipeline schedules as data: for each worker, the ordered list of actions
// it runs in one training step (forward or backward of a micro-batch on one
// of its model chunks, and the sends and receives between stages). The
// runtime (to come) executes these lists; a new schedule is a new function
// that builds them, with no change to the runtime.
//
//   auto s = pipeline::OneFOneB({/*workers=*/4, /*microbatches=*/8});
//   absl::Status ok = pipeline::Validate(*s);       // deadlock-free, complete
//   auto sim = pipeline::Simulate(*s, {1.0, 2.0});  // bubble, peak stash
//
// Model layout: the model is cut into V = workers * chunks virtual stages.
// Virtual stage s lives on worker s % workers as its chunk s / workers
// (Megatron's interleaved placement; with one chunk, stage s is worker s).
// Activations flow from stage s to s + 1, gradients from s + 1 to s.
//
// Schedules:
// - GPipe: every forward, then every backward (in micro-batch order).
// - 1F1B (PipeDream-flush): worker w runs min(workers - w - 1, m) warm-up
//   forwards, then alternates one forward and one backward, then drains the
//   backwards; at most workers - w micro-batches are stashed on worker w.
// - Interleaved 1F1B (Megatron's virtual stages): the same with `chunks`
//   model chunks per worker, micro-batches taken in groups of `workers` per
//   chunk. REQUIRES microbatches % workers == 0.
//
// Validate() checks, by executing the lists with blocking receives and
// buffered sends: every (micro-batch, stage) is forwarded once and
// backwarded once, on the stage's worker, after its dependencies; every send
// has exactly one matching receive; and no set of workers waits forever.
// Errors are INVALID_ARGUMENT (bad spec) or FAILED_PRECONDITION naming the
// worker, the action and what it waits for.
//
// Thread-safety: plain values and pure functions.
#ifndef BATON_PIPELINE_SCHEDULE_H_
#define BATON_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton::pipeline {

enum class ActionKind {
  kForward,
  kBackward,
  kSendActivation,  // to the worker of stage + 1
  kRecvActivation,  // from the worker of stage - 1
  kSendGradient,    // to the worker of stage - 1
  kRecvGradient,    // from the worker of stage + 1
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = 0;
  int stage = 0;  // virtual stage (see the header comment)
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && stage == o.stage;
  }
};

std::string ToString(const Action& a);

struct ScheduleSpec {
  int workers = 1;       // p
  int microbatches = 1;  // m
  int chunks = 1;        // v, model chunks per worker
  int stages() const { return workers * chunks; }
  int worker_of(int stage) const { return stage % workers; }
};

struct Schedule {
  std::string name;
  ScheduleSpec spec;
  std::vector<std::vector<Action>> per_worker;  // [worker] -> actions in order
};

absl::StatusOr<Schedule> GPipe(ScheduleSpec spec);
absl::StatusOr<Schedule> OneFOneB(ScheduleSpec spec);
absl::StatusOr<Schedule> Interleaved1F1B(ScheduleSpec spec);

absl::Status Validate(const Schedule& schedule);

struct Costs {
  double forward = 1.0;  // per micro-batch, for one stage
  double backward = 2.0;
};

// One span of a worker's timeline: a compute action, or a receive that
// waited (from when the worker reached it until the message was there).
struct TimelineEvent {
  int worker = 0;
  Action action;
  double start = 0;
  double end = 0;
};

struct Simulation {
  std::vector<TimelineEvent> events;  // in execution order per worker
  double makespan = 0;
  double bubble_fraction = 0;     // idle share of workers * makespan
  std::vector<int> peak_stashed;  // per worker: most micro-batch activations held at once
  std::vector<double> busy;       // per worker
};

// Runs the lists with the given costs (sends and receives take no time) and
// returns when everything ends; FAILED_PRECONDITION as Validate().
absl::StatusOr<Simulation> Simulate(const Schedule& schedule, Costs costs = {});

// The schedule's theoretical bubble: (p - 1) / (m + p - 1), or for
// interleaved 1F1B (p - 1) / (v * m + p - 1).
double TheoreticalBubble(const Schedule& schedule);

}  // namespace baton::pipeline

#endif  // BATON_PIPELINE_SCHEDULE_H_
