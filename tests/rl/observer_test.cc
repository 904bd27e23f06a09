// RunObserver (rl/observer.h) against a scripted AgentLink: what it sends,
// and how it ends when the agent says stop, also when the agent is gone by
// the time it leaves.
#include "rl/observer.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "rl/cartpole.h"
#include "rl/protocol.h"

namespace baton::rl {
namespace {

// One round of 3 steps, then stop; Leave answers `leave`.
class ScriptedLink : public AgentLink {
 public:
  explicit ScriptedLink(absl::Status leave) : leave_(std::move(leave)) {}

  absl::StatusOr<JoinReply> Join(const std::string& observer) override {
    calls.push_back("join " + observer);
    return JoinReply{7, 0, 3, false};
  }
  absl::StatusOr<int64_t> Act(int64_t session, int64_t round, int64_t step,
                              const std::vector<float>& observation) override {
    calls.push_back("act " + std::to_string(session) + " " + std::to_string(round) + " " +
                    std::to_string(step) + " " + std::to_string(observation.size()));
    return 0;
  }
  absl::StatusOr<RoundReply> Finish(int64_t session, int64_t round,
                                    const std::vector<float>& rewards,
                                    const std::vector<int32_t>&) override {
    calls.push_back("finish " + std::to_string(session) + " " + std::to_string(round) + " " +
                    std::to_string(rewards.size()));
    return RoundReply{1, true};
  }
  absl::Status Leave(int64_t session) override {
    calls.push_back("leave " + std::to_string(session));
    return leave_;
  }

  std::vector<std::string> calls;

 private:
  const absl::Status leave_;
};

const std::vector<std::string> kExpected = {"join o",      "act 7 0 0 4",  "act 7 0 1 4",
                                            "act 7 0 2 4", "finish 7 0 3", "leave 7"};

TEST(RunObserver, PlaysTheRoundItIsGivenThenLeavesWhenToldToStop) {
  ScriptedLink link(absl::OkStatus());
  CartPole env(1);
  auto r = RunObserver(link, env, {"o"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(link.calls, kExpected);
  EXPECT_EQ(r->rounds, 1);
  EXPECT_EQ(r->steps, 3);
}

TEST(RunObserver, AnAgentGoneWhenItLeavesAfterStopCountsAsLeft) {
  // The agent stopped, saw every session's leave arrive and exited before
  // this leave's reply went out.
  ScriptedLink link(absl::UnavailableError("worker 'agent0' is dead or unreachable"));
  CartPole env(1);
  auto r = RunObserver(link, env, {"o"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(link.calls, kExpected);
  EXPECT_EQ(r->rounds, 1);
}

TEST(RunObserver, AnyOtherLeaveErrorIsReturned) {
  ScriptedLink link(absl::NotFoundError("no session 7"));
  CartPole env(1);
  auto r = RunObserver(link, env, {"o"});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "leaving")) << r.status();
}

}  // namespace
}  // namespace baton::rl
