// Reinforcement learning with one agent and many observers: REINFORCE on
// CartPole-v1, the workload of PyTorch's RPC tutorials.
//
//   bazel-bin/launcher/baton-run --standalone --role agent:1 --role observer:4
//       --restart_policy observer=worker --max_restarts 10
//       bazel-bin/examples/rl/rl_cartpole [flags]
//
// One binary; BATON_ROLE (baton-run's --role) picks the behaviour:
// - agent: owns the policy (Linear(4,128), dropout 0.6, ReLU, Linear(128,2),
//   softmax) and trains it with REINFORCE (Adam, lr 1e-2, gamma 0.99, returns
//   normalized per episode) in rounds: every observer plays --steps_per_round
//   steps per round, asking for one action per step, then one update
//   (rl::ReinforceAgent, rl/reinforce_agent.h). With --batched 1 (the
//   default) one forward pass answers every observer waiting for an action
//   (rpc::Batcher). It prints a progress line every --log_every rounds
//   (episode, running reward, steps/s, batch size, observers alive) and
//   `RESULT OK` once the running reward exceeds --solve_reward (475, gym's
//   CartPole-v1 threshold) within --max_episodes episodes (exit 0); otherwise
//   `RESULT FAILED` and exit 1. Tests of observers coming and going set a
//   lower --solve_reward: what they check is membership, and the last stretch
//   to 475 is most of a run's steps.
// - any role whose name contains "observer": runs a CartPole (seeded with
//   seed * 1000 + rank, plus 100000 per restart) and plays rounds for the
//   agent until it says stop (rl::RunObserver, rl/observer.h).
//
// Observers come and go:
// - An observer that dies (even by SIGKILL) goes silent; after
//   --observer_timeout seconds the agent drops it, discards its unfinished
//   round and goes on with the rest.
// - baton-run's `--restart_policy observer=worker` restarts the dead
//   observer alone: the new process rejoins the running RPC job
//   (BATON_REJOIN=1) and joins the agent, which admits it at the next round.
//   An observer may also join late: --join_after_episodes E makes it wait
//   until the agent counted E episodes (the agent publishes its count in the
//   job's store). The RPC world is fixed at launch, so observers beyond the
//   launched ranks cannot be added; give spare ranks a --join_after_episodes.
//
// Flags (the same for every role, or per role through --role NAME:N:PROGRAM ARGS):
//   --batched 0|1 (1)         --seed N (0)            --steps_per_round N (500)
//   --max_episodes N (10000)  --log_every N (10)      --observer_timeout S (5)
//   --max_batch_delay_ms X (5)  --min_observers N (agent: all other ranks)
//   --first_round_wait S (60) --job_timeout S (1800)  --join_after_episodes E (0)
//   --solve_reward R (475)
#include <ATen/Parallel.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "env/env.h"
#include "examples/flags.h"
#include "rl/cartpole.h"
#include "rl/observer.h"
#include "rl/reinforce_agent.h"
#include "rpc/agent.h"
#include "rpc/executor.h"
#include "rpc/timer.h"

namespace {

using namespace baton;  // NOLINT: an example, kept short

struct Flags {
  int64_t batched = 1;
  int64_t seed = 0;
  int64_t steps_per_round = 500;
  int64_t max_episodes = 10000;
  int64_t log_every = 10;
  double observer_timeout = 5;
  double max_batch_delay_ms = 5;
  int64_t min_observers = 0;  // 0: every rank but the agent
  double first_round_wait = 60;
  double job_timeout = 1800;
  int64_t join_after_episodes = 0;
  double solve_reward = 475;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  examples::FlagSet flags("rl_cartpole");
  flags.Int("batched", &f.batched, "");
  flags.Int("seed", &f.seed, "");
  flags.Int("steps_per_round", &f.steps_per_round, "");
  flags.Int("max_episodes", &f.max_episodes, "");
  flags.Int("log_every", &f.log_every, "");
  flags.Int("min_observers", &f.min_observers, "");
  flags.Int("join_after_episodes", &f.join_after_episodes, "");
  flags.Double("observer_timeout", &f.observer_timeout, "");
  flags.Double("max_batch_delay_ms", &f.max_batch_delay_ms, "");
  flags.Double("first_round_wait", &f.first_round_wait, "");
  flags.Double("job_timeout", &f.job_timeout, "");
  flags.Double("solve_reward", &f.solve_reward, "");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return s;
  if ((f.batched != 0 && f.batched != 1) || f.steps_per_round < 1 || f.max_episodes < 1 ||
      f.log_every < 1 || f.observer_timeout <= 0 || f.max_batch_delay_ms < 0 ||
      f.min_observers < 0 || f.first_round_wait <= 0 || f.job_timeout <= 0 ||
      f.join_after_episodes < 0 || f.solve_reward <= 0) {
    return absl::InvalidArgumentError(
        "--batched is 0 or 1; --steps_per_round, --max_episodes, --log_every, "
        "--observer_timeout, --first_round_wait, --job_timeout and --solve_reward are positive; "
        "the others are non-negative");
  }
  return f;
}

int Fail(const std::string& who, const std::string& context, const absl::Status& status) {
  const std::string msg = absl::StrCat(context, ": ", status.ToString());
  std::fprintf(stderr, "[%s] %s\n", who.c_str(), msg.c_str());
  (void)WriteErrorFile(ErrorReport{msg, "absl::Status", ""});  // only under baton-run
  return 1;
}

std::string EpisodesKey(const rpc::RpcAgent& agent) {
  return agent.runtime().store_namespace() + "rl_cartpole/episodes";
}

int RunAgent(const Flags& flags, const LaunchEnv& env, const rpc::AgentOptions& options) {
  const std::string who = options.name;
  rl::ReinforceOptions ro;
  ro.steps_per_round = flags.steps_per_round;
  ro.seed = static_cast<uint64_t>(flags.seed);
  ro.batched = flags.batched == 1;
  ro.max_batch_delay = absl::Microseconds(flags.max_batch_delay_ms * 1000);
  ro.min_observers =
      flags.min_observers > 0 ? static_cast<int>(flags.min_observers) : env.world_size - 1;
  ro.first_round_wait = absl::Seconds(flags.first_round_wait);
  ro.observer_timeout = absl::Seconds(flags.observer_timeout);
  ro.max_episodes = flags.max_episodes;
  ro.solve_threshold = flags.solve_reward;
  if (ro.min_observers < 1) {
    return Fail(who, "starting", absl::InvalidArgumentError("the job has no observer"));
  }
  // The RL agent's own executor and timer: its batches and updates run
  // there, while the RPC agent's threads only receive and reply.
  rpc::Executor executor(rpc::Executor::Options{2, 8});
  rpc::DeadlineTimer timer;
  auto rl_agent = rl::ReinforceAgent::Create(ro, &executor, &timer);
  if (!rl_agent.ok()) return Fail(who, "creating the agent", rl_agent.status());
  rl::ReinforceAgent& learner = **rl_agent;
  learner.set_log(
      [who](const std::string& line) { std::printf("[%s] %s\n", who.c_str(), line.c_str()); });
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  if (absl::Status s = learner.Register(*registry); !s.ok()) {
    return Fail(who, "registering the protocol", s);
  }
  auto agent = rpc::RpcAgent::Create(options, registry);
  if (!agent.ok()) return Fail(who, "starting the RPC agent", agent.status());
  rpc::RpcAgent& rpc_agent = **agent;
  std::printf(
      "[%s] REINFORCE on CartPole-v1, %s, %lld steps per round, waiting for %d "
      "observers\n",
      who.c_str(), ro.batched ? "batched" : "unbatched", static_cast<long long>(ro.steps_per_round),
      ro.min_observers);
  learner.set_on_round([&, who](const rl::RoundSummary& r) {
    (void)rpc_agent.runtime().store().Set(EpisodesKey(rpc_agent), absl::StrCat(r.episodes));
    if ((r.round + 1) % flags.log_every == 0 || r.solved_at >= 0) {
      std::printf(
          "[%s] round %lld episode %lld running reward %.1f steps/s %.0f batch %.1f "
          "observers %lld dropped %lld update %.1f ms\n",
          who.c_str(), static_cast<long long>(r.round + 1), static_cast<long long>(r.episodes),
          r.running_reward, r.steps_per_s, r.mean_batch, static_cast<long long>(r.observers_alive),
          static_cast<long long>(r.dropped), r.update_ms);
    }
  });
  const bool stopped = learner.WaitStopped(absl::Seconds(flags.job_timeout));
  if (!stopped) learner.Stop(absl::StrCat("--job_timeout of ", flags.job_timeout, " s"));
  const rl::ReinforceStats st = learner.stats();
  std::string by_session;
  for (const auto& [session, n] : st.episodes_by_session) {
    absl::StrAppend(&by_session, " ", session, ":", n);
  }
  std::printf(
      "[%s] %lld rounds, %lld episodes, %lld steps in %.1f s (%.0f steps/s), %lld "
      "forward passes, %lld joins, %lld dropped; episodes by session:%s\n",
      who.c_str(), static_cast<long long>(st.rounds), static_cast<long long>(st.episodes),
      static_cast<long long>(st.steps), st.seconds, st.seconds > 0 ? st.steps / st.seconds : 0.0,
      static_cast<long long>(st.forwards), static_cast<long long>(st.joined),
      static_cast<long long>(st.dropped), by_session.c_str());
  int code = 0;
  if (st.solved_at >= 0) {
    std::printf("RESULT OK: solved at episode %lld (running reward %.1f > %g) in %.1f s\n",
                static_cast<long long>(st.solved_at), st.solved_reward, flags.solve_reward,
                st.seconds);
  } else {
    std::printf(
        "RESULT FAILED: not solved after %lld episodes (running reward %.1f; "
        "--max_episodes %lld)\n",
        static_cast<long long>(st.episodes), st.running_reward,
        static_cast<long long>(flags.max_episodes));
    code = 1;
  }
  // The observers leave once told to stop; a dead one is dropped.
  if (!learner.WaitAllLeft(ro.observer_timeout + absl::Seconds(30))) {
    std::printf("[%s] %lld observer(s) did not leave\n", who.c_str(),
                static_cast<long long>(learner.stats().alive));
  }
  learner.Close();
  (void)rpc_agent.Shutdown(/*graceful=*/false);  // observers may be gone
  return code;
}

int RunObserver(const Flags& flags, const LaunchEnv& env, const rpc::AgentOptions& options) {
  const std::string who = options.name;
  const uint64_t env_seed = static_cast<uint64_t>(flags.seed) * 1000 + env.rank +
                            100000ULL * static_cast<uint64_t>(env.restart_count);
  std::printf("[%s] pid %d, env seed %llu%s\n", who.c_str(), static_cast<int>(getpid()),
              static_cast<unsigned long long>(env_seed), env.rejoin ? ", rejoining" : "");
  auto agent = rpc::RpcAgent::Create(options, std::make_shared<rpc::FunctionRegistry>());
  if (!agent.ok()) return Fail(who, "starting the RPC agent", agent.status());
  rpc::RpcAgent& rpc_agent = **agent;
  if (flags.join_after_episodes > 0) {
    const absl::Time deadline = absl::Now() + absl::Seconds(flags.job_timeout);
    int64_t episodes = 0;
    while (episodes < flags.join_after_episodes) {
      if (absl::Now() > deadline) {
        return Fail(who, "waiting to join", absl::DeadlineExceededError("--job_timeout"));
      }
      absl::SleepFor(absl::Milliseconds(100));
      auto v = rpc_agent.runtime().store().Get(EpisodesKey(rpc_agent), absl::Milliseconds(100));
      if (v.ok()) (void)absl::SimpleAtoi(*v, &episodes);
    }
    std::printf("[%s] joining at episode %lld\n", who.c_str(), static_cast<long long>(episodes));
  }
  rl::RpcLinkOptions lo;
  lo.agent = "agent0";
  lo.wait_timeout = absl::Seconds(flags.job_timeout);
  auto link = rl::RpcAgentLink(rpc_agent, lo);
  rl::CartPole cartpole(env_seed);
  rl::ObserverOptions oo;
  oo.name = who;
  auto result = rl::RunObserver(*link, cartpole, oo);
  if (!result.ok()) return Fail(who, "observing", result.status());
  std::printf("[%s] left: %lld rounds, %lld steps, %lld episodes, %lld rejoins\n", who.c_str(),
              static_cast<long long>(result->rounds), static_cast<long long>(result->steps),
              static_cast<long long>(result->episodes), static_cast<long long>(result->rejoins));
  (void)rpc_agent.Shutdown(/*graceful=*/false);  // the protocol already ended
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = absl::StrCat(
      "usage: baton-run --standalone --role agent:1 --role observer:4 "
      "[--restart_policy observer=worker --max_restarts N] ",
      argv[0], " [flags]\n(the flags are described at the top of examples/rl/rl_cartpole.cc)");
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n%s\n", std::string(flags.status().message()).c_str(), usage.c_str());
    return 2;
  }
  auto env = ReadLaunchEnv();
  auto options = rpc::AgentOptions::FromEnv();
  absl::Status bad = !env.ok() ? env.status() : options.status();
  const bool is_agent = bad.ok() && env->role == "agent";
  const bool is_observer = bad.ok() && absl::StrContains(env->role, "observer");
  if (bad.ok() && !is_agent && !is_observer) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("BATON_ROLE is '", env->role, "'; the job's roles are agent and observer"));
  }
  if (bad.ok() && is_agent && env->rank != 0) {
    bad = absl::InvalidArgumentError("the agent must be rank 0 (give --role agent:1 first)");
  }
  if (!bad.ok()) {
    std::fprintf(stderr, "%s\n%s\n", bad.ToString().c_str(), usage.c_str());
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines reach baton-run at once
  at::set_num_threads(1);
  try {
    return is_agent ? RunAgent(*flags, *env, *options) : RunObserver(*flags, *env, *options);
  } catch (const std::exception& e) {  // LibTorch errors, baton::Error
    return Fail(options->name, "unexpected exception", absl::InternalError(e.what()));
  }
}
