// pipeline/schedule.h: every schedule for many (workers, micro-batches,
// chunks) validates (each micro-batch forwarded and backwarded once per
// stage, messages matched, no deadlock), the stash bounds of GPipe (m) and
// 1F1B (<= p), the bubbles against their formulas, and broken lists caught.
#include "pipeline/schedule.h"

#include <functional>
#include <map>

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace baton::pipeline {
namespace {

using Builder = std::function<absl::StatusOr<Schedule>(ScheduleSpec)>;

// Counts of forward and backward actions per (micro-batch, stage).
void ExpectEachOnce(const Schedule& s) {
  std::map<std::pair<int, int>, int> f, b;
  for (int w = 0; w < s.spec.workers; ++w) {
    for (const Action& a : s.per_worker[w]) {
      if (a.kind == ActionKind::kForward) ++f[{a.microbatch, a.stage}];
      if (a.kind == ActionKind::kBackward) ++b[{a.microbatch, a.stage}];
    }
  }
  for (int i = 0; i < s.spec.microbatches; ++i) {
    for (int st = 0; st < s.spec.stages(); ++st) {
      EXPECT_EQ((f[{i, st}]), 1) << s.name << " mb " << i << " stage " << st;
      EXPECT_EQ((b[{i, st}]), 1) << s.name << " mb " << i << " stage " << st;
    }
  }
}

TEST(Schedules, GPipeAndOneFOneBAreValidForEveryShapeTried) {
  for (const auto& [name, build] :
       std::vector<std::pair<std::string, Builder>>{{"gpipe", GPipe}, {"1f1b", OneFOneB}}) {
    for (int p = 1; p <= 5; ++p) {
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE(name + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        auto s = build({p, m, 1});
        ASSERT_TRUE(s.ok()) << s.status();
        ExpectEachOnce(*s);
        auto sim = Simulate(*s);
        ASSERT_TRUE(sim.ok()) << sim.status();
        // Uniform stages: the bubble is exactly (p - 1) / (m + p - 1).
        EXPECT_NEAR(sim->bubble_fraction, TheoreticalBubble(*s), 1e-9);
        for (int w = 0; w < p; ++w) {
          if (name == "gpipe") {
            EXPECT_EQ(sim->peak_stashed[w], m) << "GPipe stashes every micro-batch";
          } else {
            EXPECT_LE(sim->peak_stashed[w], p - w) << "1F1B stashes at most p - w";
            EXPECT_EQ(sim->peak_stashed[w], std::min(p - w, m));
          }
        }
      }
    }
  }
}

TEST(Schedules, InterleavedIsValidAndItsBubbleShrinksWithChunks) {
  for (int p = 1; p <= 4; ++p) {
    for (int v = 1; v <= 3; ++v) {
      for (int m = p; m <= 3 * p; m += p) {
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) +
                     " m=" + std::to_string(m));
        auto s = Interleaved1F1B({p, m, v});
        ASSERT_TRUE(s.ok()) << s.status();
        ExpectEachOnce(*s);
        auto sim = Simulate(*s);
        ASSERT_TRUE(sim.ok()) << sim.status();
        // (p - 1) / (v * m + p - 1), exactly, with uniform stages.
        EXPECT_NEAR(sim->bubble_fraction, TheoreticalBubble(*s), 1e-9);
        if (v == 1) {
          EXPECT_EQ(sim->peak_stashed[0], std::min(p, m));
        }
        if (v > 1 && p > 1) {
          auto plain = Simulate(*OneFOneB({p, m, 1}));
          EXPECT_LT(sim->bubble_fraction, plain->bubble_fraction);
        }
      }
    }
  }
}

TEST(Schedules, BadSpecsAreRefused) {
  EXPECT_EQ(GPipe({0, 4, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OneFOneB({2, 4, 2}).status().code(), absl::StatusCode::kInvalidArgument);
  auto odd = Interleaved1F1B({4, 6, 2});
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(odd.status().message(), "multiple of workers")) << odd.status();
}

TEST(Schedules, ValidateCatchesBrokenLists) {
  auto good = *OneFOneB({3, 4, 1});
  ASSERT_TRUE(Validate(good).ok());
  {  // Worker 0 waits for a gradient before it sent any activation.
    Schedule s = good;
    s.per_worker[0].insert(s.per_worker[0].begin(), {ActionKind::kRecvGradient, 3, 0});
    auto st = Validate(s);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(st.message(), "deadlock")) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "worker 0 waits at receive gradient")) << st;
  }
  {  // A forward twice.
    Schedule s = good;
    s.per_worker[0].push_back({ActionKind::kForward, 0, 0});
    EXPECT_TRUE(absl::StrContains(Validate(s).message(), "forwarded twice"));
  }
  {  // A backward missing.
    Schedule s = good;
    for (auto it = s.per_worker[2].begin(); it != s.per_worker[2].end(); ++it) {
      if (it->kind == ActionKind::kBackward && it->microbatch == 3) {
        s.per_worker[2].erase(it);
        break;
      }
    }
    auto st = Validate(s);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(st.message(), "micro-batch 3")) << st;
  }
  {  // An action on the wrong worker.
    Schedule s = good;
    s.per_worker[1].push_back({ActionKind::kForward, 0, 2});
    EXPECT_TRUE(absl::StrContains(Validate(s).message(), "lives on worker 2"));
  }
}

}  // namespace
}  // namespace baton::pipeline
