// The peer's torch_rl_bench.py on baton: one agent and N observers playing
// CartPole-v1 with REINFORCE (rl::ReinforceAgent, rl::RunObserver), with the
// peer's metric names:
//   rl_steps_per_s_obs{N} / rl_batch_steps_per_s_obs{N}: env steps across all
//       observers / wall time over whole rounds (updates included), after one
//       untimed warm-up round;
//   rl_action_latency_p50_us_obs{N} / rl_batch_action_latency_p50_us_obs{N}:
//       an observer's round trip for one action, pooled over all observers
//       (p99 in the line);
//   with --solve, per seed, batched with --solve-observers observers:
//       rl_episodes_to_solve, rl_seconds_to_solve (null when a cap ran out).
// Rounds are the peer's: every observer plays 500 steps (resetting CartPole
// whenever an episode ends), then one REINFORCE update from all N x 500
// steps. Differences, stated: the warm-up round has 500 steps, not 50 (the
// agent's rounds have one length); observers' environments are rl::CartPole
// (gym's dynamics, its own seeded generator), seeded seed * 1000 + k as in
// the peer; one process per configuration group (the peer keeps one group).
//
//   bench/rl_bench [--quick] [--observers 1,4,16] [--seconds 6]
//       [--solve [--seeds 3] [--solve-observers 4] [--solve-seconds 240]
//        [--max-episodes 10000]]
// MASTER_PORT (default: a free port) is the first group's port.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bench/bench_util.h"
#include "bench/worker_procs.h"
#include "rl/cartpole.h"
#include "rl/observer.h"
#include "rl/reinforce_agent.h"
#include "rpc/agent.h"
#include "testing/ports.h"

namespace baton {
namespace {

constexpr int64_t kSteps = 500;

struct Run {
  std::string mode = "tput";  // tput | solve
  int observers = 1;
  bool batched = false;
  int64_t seed = 0;
  double seconds = 6;
  double solve_seconds = 240;
  int64_t max_episodes = 10000;
};

std::vector<std::string> RunArgs(const Run& r) {
  return {absl::StrCat("--run-mode=", r.mode), absl::StrCat("--run-observers=", r.observers),
          absl::StrCat("--run-batched=", r.batched ? 1 : 0), absl::StrCat("--run-seed=", r.seed)};
}

// ---- workers -------------------------------------------------------------

absl::Status RunAgent(const Run& run, bench::WorkerChannel& ch) {
  rpc::Executor executor(rpc::Executor::Options{2, 8});
  rpc::DeadlineTimer timer;
  rl::ReinforceOptions ro;
  ro.steps_per_round = kSteps;
  ro.seed = static_cast<uint64_t>(run.seed);
  ro.batched = run.batched;
  ro.min_observers = run.observers;
  ro.max_episodes = run.mode == "solve" ? run.max_episodes : 0;
  ro.observer_timeout = absl::Seconds(60);
  auto learner = rl::ReinforceAgent::Create(ro, &executor, &timer);
  if (!learner.ok()) return learner.status();
  // The learner's log stays quiet, but its last lines are printed if the
  // run ends without its timed rounds (they say why it stopped).
  absl::Mutex log_mu;
  std::deque<std::string> last_log;
  (*learner)->set_log([&](const std::string& line) {
    absl::MutexLock lock(&log_mu);
    last_log.push_back(line);
    if (last_log.size() > 20) last_log.pop_front();
  });
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  if (absl::Status s = (*learner)->Register(*registry); !s.ok()) return s;
  auto options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return options.status();
  auto agent = rpc::RpcAgent::Create(*options, registry);
  if (!agent.ok()) return agent.status();

  absl::Mutex mu;
  double t0 = 0, t_end = 0, update_ms = 0, solve_seconds = -1;
  int64_t timed_rounds = 0;
  rl::ReinforceAgent* l = learner->get();
  l->set_on_round([&](const rl::RoundSummary& r) {
    absl::MutexLock lock(&mu);
    const double now = bench::Now();
    if (run.mode == "solve") {
      if (r.solved_at >= 0 && solve_seconds < 0) solve_seconds = r.seconds;
      return;
    }
    if (r.round == 0) {
      t0 = now;  // the warm-up round ended
      return;
    }
    if (t_end > 0) return;  // the round that started before the stop
    ++timed_rounds;
    update_ms += r.update_ms;
    if (now - t0 >= run.seconds) {
      t_end = now;
      l->Stop("timed rounds done");
    }
  });
  const double cap = run.mode == "solve" ? run.solve_seconds : run.seconds + 600;
  if (!l->WaitStopped(absl::Seconds(cap))) l->Stop("time cap");
  if (!l->WaitStopped(absl::Seconds(120))) return absl::DeadlineExceededError("no stop");
  const rl::ReinforceStats st = l->stats();
  l->WaitAllLeft(absl::Seconds(60));
  {
    absl::MutexLock lock(&mu);
    if (run.mode == "tput") {
      if (t_end <= 0) {
        absl::MutexLock log_lock(&log_mu);
        std::fprintf(stderr,
                     "rl_bench agent: stopped before its timed rounds ended (%lld rounds, "
                     "%lld episodes, %lld dropped, %lld left); its log ends with:\n",
                     static_cast<long long>(st.rounds), static_cast<long long>(st.episodes),
                     static_cast<long long>(st.dropped), static_cast<long long>(st.left));
        for (const std::string& line : last_log) std::fprintf(stderr, "  %s\n", line.c_str());
      }
      ch.Send(absl::StrCat("tput ", timed_rounds, " ", t_end - t0, " ",
                           timed_rounds > 0 ? update_ms / timed_rounds : 0.0));
    } else {
      ch.Send(absl::StrCat("solve ", st.solved_at, " ", st.episodes, " ", st.rounds, " ",
                           solve_seconds >= 0 ? solve_seconds : st.seconds, " ",
                           st.running_reward));
    }
  }
  l->Close();
  (void)(*agent)->Shutdown(/*graceful=*/false);
  return absl::OkStatus();
}

absl::Status RunObserverWorker(const Run& run, int k, bench::WorkerChannel& ch) {
  auto options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return options.status();
  auto agent = rpc::RpcAgent::Create(*options, std::make_shared<rpc::FunctionRegistry>());
  if (!agent.ok()) return agent.status();
  rl::RpcLinkOptions lo;
  lo.agent = "agent0";
  lo.wait_timeout = absl::Seconds(run.solve_seconds + 600);
  auto link = rl::RpcAgentLink(**agent, lo);
  rl::CartPole env(static_cast<uint64_t>(run.seed) * 1000 + k);
  rl::ObserverOptions oo;
  oo.name = absl::StrCat("observer", k);
  oo.record_latency = run.mode == "tput";
  auto r = rl::RunObserver(*link, env, oo);
  if (!r.ok()) return r.status();
  if (run.mode == "tput") {
    // Leave out the warm-up round.
    std::vector<double> lat(
        r->act_latency_us.begin() + std::min<size_t>(kSteps, r->act_latency_us.size()),
        r->act_latency_us.end());
    ch.Send(absl::StrCat("lat ", absl::StrJoin(lat, " ", [](std::string* out, double v) {
                           absl::StrAppend(out, static_cast<int64_t>(v * 100));
                         })));
  }
  ch.Send("done");
  (void)(*agent)->Shutdown(/*graceful=*/false);
  return absl::OkStatus();
}

// ---- driver --------------------------------------------------------------

double Pct(std::vector<double> xs, double p) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  return xs[std::min(xs.size() - 1, static_cast<size_t>(p * xs.size()))];
}

bench::JsonLine Line(const std::string& metric, double value, const std::string& unit) {
  bench::JsonLine j;
  j.Add("system", "baton").Add("version", "0.1.0").Add("agent", "gRPC + same-host shm");
  j.Add("threads_per_process", 1).Add("cores", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  j.Add("env", "CartPole-v1 (gym dynamics, rl::CartPole)").Add("steps_per_round", kSteps);
  j.Add("metric", metric).Add("value", value).Add("unit", unit);
  return j;
}

// Runs one configuration; lines from the agent and the observers.
absl::Status Drive(const Run& run, const std::vector<std::string>& args, int port,
                   std::vector<std::string>* agent_lines, std::vector<double>* latencies) {
  std::vector<bench::WorkerSpec> specs = {{"agent0", 0}};
  for (int k = 1; k <= run.observers; ++k) specs.push_back({absl::StrCat("observer", k), k});
  std::vector<std::string> all = args;
  for (auto& a : RunArgs(run)) all.push_back(a);
  auto group = bench::WorkerGroup::Spawn(specs, all, port);
  if (!group.ok()) return group.status();
  const double limit = run.mode == "solve" ? run.solve_seconds + 900 : run.seconds + 600;
  return (*group)->Wait(absl::Seconds(limit), absl::Seconds(20),
                        [&](int w, const std::string& line) {
                          if (w == 0) {
                            agent_lines->push_back(line);
                          } else if (line.rfind("lat ", 0) == 0) {
                            for (double v : bench::ParseNumbers(line.substr(4))) {
                              latencies->push_back(v / 100);
                            }
                          }
                        });
}

int Main(int argc, char** argv) {
  const std::vector<std::string> args = bench::ForwardedArgs(argc, argv);
  bench::Flags flags({"observers", "seconds", "seeds", "solve-observers", "solve-seconds",
                      "max-episodes", "run-mode", "run-observers", "run-batched", "run-seed"},
                     {"quick", "solve"});
  if (!flags.Parse(args)) return 2;
  const bool quick = flags.Bool("quick");
  Run base;
  base.seconds = flags.Double("seconds", quick ? 2.0 : 6.0);
  base.solve_seconds = flags.Double("solve-seconds", quick ? 30.0 : 240.0);
  base.max_episodes = flags.Int("max-episodes", 10000);
  const int worker = bench::WorkerIndex(argc, argv);
  if (worker >= 0) {
    Run run = base;
    run.mode = flags.Str("run-mode", "tput");
    run.observers = static_cast<int>(flags.Int("run-observers", 1));
    run.batched = flags.Int("run-batched", 0) == 1;
    run.seed = flags.Int("run-seed", 0);
    torch::set_num_threads(1);
    bench::WorkerChannel ch = bench::WorkerChannel::Open();
    absl::Status s;
    try {
      s = worker == 0 ? RunAgent(run, ch) : RunObserverWorker(run, worker, ch);
    } catch (const std::exception& e) {
      s = absl::InternalError(e.what());
    }
    if (!s.ok()) {
      std::fprintf(stderr, "rl_bench worker %d: %s\n", worker, s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  std::vector<int> observers;
  for (absl::string_view v : absl::StrSplit(flags.Str("observers", quick ? "1,4" : "1,4,16"), ',',
                                            absl::SkipWhitespace())) {
    int n;
    if (!absl::SimpleAtoi(v, &n) || n < 1 || n > 256) {
      std::fprintf(stderr, "--observers: '%s' is not a count in 1..256\n", std::string(v).c_str());
      return 2;
    }
    observers.push_back(n);
  }
  const bool solve = flags.Bool("solve");
  if (observers.empty() && !solve) {
    std::fprintf(stderr, "nothing to run: give --observers or --solve\n");
    return 2;
  }
  int port = 0;
  if (const char* p = std::getenv("MASTER_PORT"); p != nullptr && *p != '\0') port = std::atoi(p);
  auto next_port = [&] { return port > 0 ? port++ : baton::testing::FreePort(); };
  int failures = 0;
  for (int n : observers) {
    for (bool batched : {false, true}) {
      Run run = base;
      run.observers = n;
      run.batched = batched;
      std::vector<std::string> lines;
      std::vector<double> lat;
      absl::Status s = Drive(run, args, next_port(), &lines, &lat);
      const std::string prefix = batched ? "rl_batch" : "rl";
      const std::string variant = batched ? "batched (rpc::Batcher)" : "unbatched";
      std::vector<double> t;
      for (const auto& l : lines) {
        if (l.rfind("tput ", 0) == 0) t = bench::ParseNumbers(l.substr(5));
      }
      if (!s.ok() || t.size() != 3 || t[1] <= 0) {
        Line("rl_bench_failed", 1, "error")
            .Add("observers", n)
            .Add("variant", variant)
            .Add("error", s.ok() ? "no result from the agent" : s.ToString())
            .Print();
        ++failures;
        continue;
      }
      const double steps_per_s = t[0] * n * kSteps / t[1];
      Line(absl::StrCat(prefix, "_steps_per_s_obs", n), steps_per_s, "steps/s")
          .Add("variant", variant)
          .Add("observers", n)
          .Add("rounds", static_cast<int64_t>(t[0]))
          .Add("seconds", t[1])
          .Add("update_ms_per_round", t[2])
          .Print();
      Line(absl::StrCat(prefix, "_action_latency_p50_us_obs", n), Pct(lat, 0.5), "us")
          .Add("variant", variant)
          .Add("observers", n)
          .Add("p99_us", Pct(lat, 0.99))
          .Print();
    }
  }
  if (solve) {
    const int seeds = static_cast<int>(flags.Int("seeds", quick ? 1 : 3));
    const int n = static_cast<int>(flags.Int("solve-observers", 4));
    for (int seed = 0; seed < seeds; ++seed) {
      Run run = base;
      run.mode = "solve";
      run.observers = n;
      run.batched = true;
      run.seed = seed;
      std::vector<std::string> lines;
      std::vector<double> lat;
      absl::Status s = Drive(run, args, next_port(), &lines, &lat);
      std::vector<double> r;
      for (const auto& l : lines) {
        if (l.rfind("solve ", 0) == 0) r = bench::ParseNumbers(l.substr(6));
      }
      if (!s.ok() || r.size() != 5) {
        Line("rl_bench_failed", 1, "error")
            .Add("seed", seed)
            .Add("error", s.ok() ? "no result from the agent" : s.ToString())
            .Print();
        ++failures;
        continue;
      }
      const bool solved = r[0] >= 0;
      for (const char* metric : {"rl_episodes_to_solve", "rl_seconds_to_solve"}) {
        const bool episodes = std::string(metric) == "rl_episodes_to_solve";
        bench::JsonLine j = Line(metric, episodes ? r[0] : r[3], episodes ? "episodes" : "s");
        j.Add("variant", "batched (rpc::Batcher)").Add("observers", n).Add("seed", seed);
        j.Add("solved", solved ? "true" : "false").Add("episodes_played", r[1]);
        j.Add("rounds", r[2]).Add("final_running_reward", r[4]);
        j.Add("cap_episodes", run.max_episodes).Add("cap_seconds", run.solve_seconds);
        if (!solved) j.Add("note", "not solved within the caps; value is not a solve");
        j.Print();
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Main(argc, argv); }
