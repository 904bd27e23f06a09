#include "pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace baton::pipeline {
namespace {

absl::Status CheckSpec(const ScheduleSpec& s, const char* name) {
  if (s.workers < 1 || s.microbatches < 1 || s.chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": workers, microbatches and chunks must be at least 1; got workers ",
                     s.workers, ", microbatches ", s.microbatches, ", chunks ", s.chunks));
  }
  return absl::OkStatus();
}

// Appends the forward of (mb, stage) with its receive and send.
void AddForward(const ScheduleSpec& spec, int mb, int stage, std::vector<Action>& out) {
  if (stage > 0) out.push_back({ActionKind::kRecvActivation, mb, stage});
  out.push_back({ActionKind::kForward, mb, stage});
  if (stage < spec.stages() - 1) out.push_back({ActionKind::kSendActivation, mb, stage});
}

void AddBackward(const ScheduleSpec& spec, int mb, int stage, std::vector<Action>& out) {
  if (stage < spec.stages() - 1) out.push_back({ActionKind::kRecvGradient, mb, stage});
  out.push_back({ActionKind::kBackward, mb, stage});
  if (stage > 0) out.push_back({ActionKind::kSendGradient, mb, stage});
}

const char* KindName(ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return "forward";
    case ActionKind::kBackward: return "backward";
    case ActionKind::kSendActivation: return "send activation";
    case ActionKind::kRecvActivation: return "receive activation";
    case ActionKind::kSendGradient: return "send gradient";
    case ActionKind::kRecvGradient: return "receive gradient";
  }
  return "?";
}

}  // namespace

std::string ToString(const Action& a) {
  return absl::StrCat(KindName(a.kind), " of micro-batch ", a.microbatch, " at stage ", a.stage);
}

absl::StatusOr<Schedule> GPipe(ScheduleSpec spec) {
  RETURN_IF_ERROR(CheckSpec(spec, "GPipe"));
  Schedule out{"gpipe", spec, std::vector<std::vector<Action>>(spec.workers)};
  for (int w = 0; w < spec.workers; ++w) {
    for (int c = 0; c < spec.chunks; ++c) {
      for (int i = 0; i < spec.microbatches; ++i) {
        AddForward(spec, i, c * spec.workers + w, out.per_worker[w]);
      }
    }
    for (int c = spec.chunks - 1; c >= 0; --c) {
      for (int i = 0; i < spec.microbatches; ++i) {
        AddBackward(spec, i, c * spec.workers + w, out.per_worker[w]);
      }
    }
  }
  return out;
}

absl::StatusOr<Schedule> OneFOneB(ScheduleSpec spec) {
  RETURN_IF_ERROR(CheckSpec(spec, "1F1B"));
  if (spec.chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat("1F1B runs one chunk per worker; got chunks ",
                                                   spec.chunks, " (use Interleaved1F1B)"));
  }
  const int p = spec.workers, m = spec.microbatches;
  Schedule out{"1f1b", spec, std::vector<std::vector<Action>>(p)};
  for (int w = 0; w < p; ++w) {
    auto& a = out.per_worker[w];
    const int warmup = std::min(p - w - 1, m);
    for (int i = 0; i < warmup; ++i) AddForward(spec, i, w, a);
    int next_b = 0;
    for (int i = warmup; i < m; ++i) {
      AddForward(spec, i, w, a);
      AddBackward(spec, next_b++, w, a);
    }
    while (next_b < m) AddBackward(spec, next_b++, w, a);
  }
  return out;
}

absl::StatusOr<Schedule> Interleaved1F1B(ScheduleSpec spec) {
  RETURN_IF_ERROR(CheckSpec(spec, "interleaved 1F1B"));
  const int p = spec.workers, m = spec.microbatches, v = spec.chunks;
  if (m % p != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "interleaved 1F1B takes micro-batches in groups of the worker count: microbatches (", m,
        ") must be a multiple of workers (", p, ")"));
  }
  Schedule out{"interleaved_1f1b", spec, std::vector<std::vector<Action>>(p)};
  const int total = m * v;  // (micro-batch, chunk) pairs per worker
  // The k-th forward (backward) of a worker: groups of p micro-batches per
  // chunk, chunks in order (backwards: in reverse order).
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int w = 0; w < p; ++w) {
    auto& a = out.per_worker[w];
    auto forward = [&](int k) { AddForward(spec, mb_of(k), ((k / p) % v) * p + w, a); };
    auto backward = [&](int k) { AddBackward(spec, mb_of(k), (v - 1 - (k / p) % v) * p + w, a); };
    // Megatron's warm-up; with one chunk it is plain 1F1B's.
    const int warmup = std::min(v == 1 ? p - w - 1 : (p - w - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warmup; ++k) forward(k);
    int next_b = 0;
    for (int k = warmup; k < total; ++k) {
      forward(k);
      backward(next_b++);
    }
    while (next_b < total) backward(next_b++);
  }
  return out;
}

absl::StatusOr<Simulation> Simulate(const Schedule& schedule, Costs costs) {
  const ScheduleSpec& spec = schedule.spec;
  RETURN_IF_ERROR(CheckSpec(spec, schedule.name.c_str()));
  const int p = spec.workers, m = spec.microbatches, n = spec.stages();
  if (static_cast<int>(schedule.per_worker.size()) != p) {
    return absl::InvalidArgumentError(absl::StrCat(schedule.name, ": ", schedule.per_worker.size(),
                                                   " action lists for ", p, " workers"));
  }
  // A chunk is 1/v of a worker's share of the model.
  const double tf = costs.forward / spec.chunks, tb = costs.backward / spec.chunks;
  using Key = std::pair<int, int>;  // (micro-batch, stage)
  std::map<Key, double> fwd, bwd, act_sent, grad_sent, act_recv, grad_recv;
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0);
  Simulation sim;
  sim.peak_stashed.assign(p, 0);
  sim.busy.assign(p, 0.0);
  std::vector<int> stashed(p, 0);
  auto fail = [&](int w, const Action& a, const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(schedule.name, ": worker ", w, ", action ",
                                                      pc[w], " (", ToString(a), "): ", why));
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int w = 0; w < p; ++w) {
      while (pc[w] < schedule.per_worker[w].size()) {
        const Action& a = schedule.per_worker[w][pc[w]];
        const Key k{a.microbatch, a.stage};
        if (a.microbatch < 0 || a.microbatch >= m || a.stage < 0 || a.stage >= n) {
          return fail(w, a, "micro-batch or stage out of range");
        }
        if (spec.worker_of(a.stage) != w) {
          return fail(
              w, a, absl::StrCat("stage ", a.stage, " lives on worker ", spec.worker_of(a.stage)));
        }
        double ready = clock[w];
        switch (a.kind) {
          case ActionKind::kForward:
            if (fwd.count(k)) return fail(w, a, "forwarded twice");
            if (a.stage > 0) {
              auto it = act_recv.find(k);
              if (it == act_recv.end()) return fail(w, a, "its activation was not received first");
            }
            fwd[k] = clock[w] = ready + tf;
            sim.events.push_back({w, a, ready, clock[w]});
            sim.busy[w] += tf;
            sim.peak_stashed[w] = std::max(sim.peak_stashed[w], ++stashed[w]);
            break;
          case ActionKind::kBackward:
            if (bwd.count(k)) return fail(w, a, "backwarded twice");
            if (!fwd.count(k)) return fail(w, a, "runs before its forward");
            if (a.stage < n - 1 && !grad_recv.count(k)) {
              return fail(w, a, "its gradient was not received first");
            }
            bwd[k] = clock[w] = ready + tb;
            sim.events.push_back({w, a, ready, clock[w]});
            sim.busy[w] += tb;
            --stashed[w];
            break;
          case ActionKind::kSendActivation:
            if (a.stage == n - 1) return fail(w, a, "the last stage sends no activation");
            if (!fwd.count(k)) return fail(w, a, "sends before its forward");
            if (act_sent.count(k)) return fail(w, a, "sent twice");
            act_sent[k] = clock[w];
            break;
          case ActionKind::kSendGradient:
            if (a.stage == 0) return fail(w, a, "the first stage sends no gradient");
            if (!bwd.count(k)) return fail(w, a, "sends before its backward");
            if (grad_sent.count(k)) return fail(w, a, "sent twice");
            grad_sent[k] = clock[w];
            break;
          case ActionKind::kRecvActivation: {
            if (a.stage == 0) return fail(w, a, "the first stage receives no activation");
            if (act_recv.count(k)) return fail(w, a, "received twice");
            auto it = act_sent.find({a.microbatch, a.stage - 1});
            if (it == act_sent.end()) goto blocked;  // waits for the sender
            act_recv[k] = clock[w] = std::max(clock[w], it->second);
            if (clock[w] > ready) sim.events.push_back({w, a, ready, clock[w]});
            break;
          }
          case ActionKind::kRecvGradient: {
            if (a.stage == n - 1) return fail(w, a, "the last stage receives no gradient");
            if (grad_recv.count(k)) return fail(w, a, "received twice");
            auto it = grad_sent.find({a.microbatch, a.stage + 1});
            if (it == grad_sent.end()) goto blocked;
            grad_recv[k] = clock[w] = std::max(clock[w], it->second);
            if (clock[w] > ready) sim.events.push_back({w, a, ready, clock[w]});
            break;
          }
        }
        ++pc[w];
        progress = true;
      }
    blocked:;
    }
  }
  std::vector<std::string> stuck;
  for (int w = 0; w < p; ++w) {
    if (pc[w] < schedule.per_worker[w].size()) {
      stuck.push_back(
          absl::StrCat("worker ", w, " waits at ", ToString(schedule.per_worker[w][pc[w]])));
    }
  }
  if (!stuck.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(schedule.name, ": deadlock: ", absl::StrJoin(stuck, "; ")));
  }
  for (int i = 0; i < m; ++i) {
    for (int s = 0; s < n; ++s) {
      if (!fwd.count({i, s}) || !bwd.count({i, s})) {
        return absl::FailedPreconditionError(
            absl::StrCat(schedule.name, ": micro-batch ", i, " is never ",
                         fwd.count({i, s}) ? "backwarded" : "forwarded", " at stage ", s));
      }
      if ((s < n - 1 && !act_recv.count({i, s + 1})) || (s > 0 && !grad_recv.count({i, s - 1}))) {
        return absl::FailedPreconditionError(
            absl::StrCat(schedule.name, ": a message of micro-batch ", i, " from stage ", s,
                         " is sent but never received"));
      }
    }
  }
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  double busy = 0;
  for (double b : sim.busy) busy += b;
  sim.bubble_fraction = sim.makespan > 0 ? 1.0 - busy / (p * sim.makespan) : 0.0;
  return sim;
}

absl::Status Validate(const Schedule& schedule) { return Simulate(schedule).status(); }

double TheoreticalBubble(const Schedule& schedule) {
  const ScheduleSpec& s = schedule.spec;
  const double p = s.workers, m = s.microbatches, v = s.chunks;
  if (schedule.name == "interleaved_1f1b") return (p - 1) / (v * m + p - 1);
  return (p - 1) / (m + p - 1);
}

}  // namespace baton::pipeline
