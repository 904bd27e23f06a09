#include "rl/observer.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "rl/internal/functions.h"

namespace baton::rl {
namespace {

class RpcLink : public AgentLink {
 public:
  RpcLink(rpc::RpcAgent& agent, RpcLinkOptions options)
      : agent_(agent), options_(std::move(options)) {}

  absl::StatusOr<JoinReply> Join(const std::string& observer) override {
    auto r =
        agent_.rpc_async(Wait(), options_.agent, internal::kJoinFn, internal::JoinRequest{observer})
            .result();
    if (!r.ok()) return r.status();
    return JoinReply{r->session, r->round, r->steps_per_round, r->stop};
  }
  absl::StatusOr<int64_t> Act(int64_t session, int64_t round, int64_t step,
                              const std::vector<float>& observation) override {
    rpc::CallOptions o;
    o.timeout = options_.act_timeout;
    auto r = agent_
                 .rpc_async(o, options_.agent, internal::kActFn,
                            internal::ActRequest{session, round, step, observation})
                 .result();
    if (!r.ok()) return r.status();
    return r->action;
  }
  absl::StatusOr<RoundReply> Finish(int64_t session, int64_t round,
                                    const std::vector<float>& rewards,
                                    const std::vector<int32_t>& episode_ends) override {
    auto r = agent_
                 .rpc_async(Wait(), options_.agent, internal::kFinishFn,
                            internal::FinishRequest{session, round, rewards, episode_ends})
                 .result();
    if (!r.ok()) return r.status();
    return RoundReply{r->next_round, r->stop};
  }
  absl::Status Leave(int64_t session) override {
    rpc::CallOptions o;
    o.timeout = options_.act_timeout;
    return agent_.rpc_async(o, options_.agent, internal::kLeaveFn, internal::LeaveRequest{session})
        .status();
  }

 private:
  rpc::CallOptions Wait() const {
    rpc::CallOptions o;
    o.timeout = options_.wait_timeout;
    return o;
  }
  rpc::RpcAgent& agent_;
  const RpcLinkOptions options_;
};

std::vector<float> ToVector(const CartPoleObservation& obs) {
  return std::vector<float>(obs.begin(), obs.end());
}

}  // namespace

std::unique_ptr<AgentLink> RpcAgentLink(rpc::RpcAgent& agent, RpcLinkOptions options) {
  return std::make_unique<RpcLink>(agent, std::move(options));
}

absl::StatusOr<ObserverResult> RunObserver(AgentLink& link, CartPole& env,
                                           const ObserverOptions& options) {
  ObserverResult result;
  auto joined = link.Join(options.name);
  if (!joined.ok()) return Annotate(joined.status(), "joining the agent");
  JoinReply j = *joined;
  int64_t round = j.round;
  bool stop = j.stop;
  std::vector<float> rewards;
  std::vector<int32_t> ends;
  while (!stop) {
    rewards.assign(j.steps_per_round, 0.0f);
    ends.clear();
    std::vector<float> obs = ToVector(env.Reset());
    absl::Status dropped;
    for (int64_t t = 0; t < j.steps_per_round && dropped.ok(); ++t) {
      if (options.quit && options.quit()) {
        (void)link.Leave(j.session);
        return absl::CancelledError(absl::StrCat("observer quit in round ", round, " step ", t));
      }
      const auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<int64_t> action = link.Act(j.session, round, t, obs);
      if (options.record_latency) {
        result.act_latency_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      if (!action.ok()) {
        if (absl::IsAborted(action.status())) {
          dropped = action.status();
          break;
        }
        return Annotate(action.status(), absl::StrCat("round ", round, " step ", t, ": act"));
      }
      ++result.steps;
      auto step = env.Step(static_cast<int>(*action));
      if (!step.ok()) {
        return Annotate(step.status(),
                        absl::StrCat("round ", round, " step ", t, ": action ", *action));
      }
      rewards[t] = static_cast<float>(step->reward);
      if (step->terminated || step->truncated) {
        ends.push_back(static_cast<int32_t>(t));
        obs = ToVector(env.Reset());
      } else {
        obs = ToVector(step->observation);
      }
    }
    if (dropped.ok()) {
      auto r = link.Finish(j.session, round, rewards, ends);
      if (r.ok()) {
        ++result.rounds;
        result.episodes += static_cast<int64_t>(ends.size());
        round = r->next_round;
        stop = r->stop;
        continue;
      }
      if (!absl::IsAborted(r.status())) {
        return Annotate(r.status(), absl::StrCat("round ", round, ": finish"));
      }
    }
    // Dropped: join again as a new session.
    ++result.rejoins;
    joined = link.Join(options.name);
    if (!joined.ok()) return Annotate(joined.status(), "joining the agent again");
    j = *joined;
    round = j.round;
    stop = j.stop;
  }
  // The agent said stop: leaving ends our session there. An agent that
  // stopped may already have exited (its last leave can race its own
  // shutdown), and then there is no session left to end: UNAVAILABLE here is
  // not an error.
  if (absl::Status s = link.Leave(j.session); !s.ok() && !absl::IsUnavailable(s)) {
    return Annotate(s, "leaving");
  }
  return result;
}

}  // namespace baton::rl
