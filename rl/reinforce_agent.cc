#include "rl/reinforce_agent.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "rl/internal/functions.h"
#include "rl/policy.h"
#include "rl/returns.h"
#include "rl/rounds.h"
#include "rpc/batcher.h"

namespace baton::rl {
namespace {

// One member's steps of the round it plays, row t for step t, each row
// written once by the batch that answers the step (before Rounds::Answered),
// read by the update after the round ended.
struct Steps {
  explicit Steps(int64_t t)
      : states(at::zeros({t, Policy::kInputs}, at::kFloat)),
        masks(at::zeros({t, Policy::kHidden}, at::kFloat)),
        actions(at::zeros({t}, at::kLong)) {}
  at::Tensor states;   // [T, 4] float32
  at::Tensor masks;    // [T, 128] float32
  at::Tensor actions;  // [T] int64
};

// The RPC side of one session: where its replies go, where its steps are.
struct Session {
  rpc::Promise<JoinReply> join;
  rpc::Promise<RoundReply> finish;
  std::shared_ptr<Steps> steps;
};

struct PendingAct {
  std::shared_ptr<Steps> steps;
  int64_t session = 0;
  int64_t round = 0;
  int64_t step = 0;
  std::vector<float> obs;
};

// What a call carries out once the agent's lock is released, in this order:
// the log lines (so a line is out before the reply that reveals its event),
// then the replies and the submission of a round's end.
struct Later {
  std::vector<std::string> log;
  std::function<void(const std::string&)> log_fn;  // the agent's, when there are lines
  std::vector<std::function<void()>> replies;

  void Run() {
    if (log_fn) {
      for (const std::string& line : log) log_fn(line);
    }
    for (auto& reply : replies) reply();
  }
};

}  // namespace

class ReinforceAgent::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(ReinforceOptions options, rpc::Executor* executor, rpc::DeadlineTimer* timer,
       std::unique_ptr<Rounds> rounds)
      : options_(options),
        executor_(executor),
        timer_(timer),
        policy_(options.seed),
        rounds_(std::move(rounds)) {
    adam_ = std::make_unique<torch::optim::Adam>(policy_.parameters(),
                                                 torch::optim::AdamOptions(options.lr));
    log_ = [logger = Logger("rl agent")](const std::string& line) { logger.Info(line); };
  }

  void Start() {
    if (!options_.batched) return;
    std::weak_ptr<Impl> weak = weak_from_this();
    batcher_ = rpc::Batcher<PendingAct, int64_t>::Create(
        {/*max_batch=*/1, options_.max_batch_delay},
        [weak](std::vector<PendingAct> batch) -> absl::StatusOr<std::vector<int64_t>> {
          auto self = weak.lock();
          if (self == nullptr) return absl::CancelledError("rl agent: closed");
          return self->RunBatch(batch);
        },
        executor_, timer_);
  }

  // ---- the protocol (the bookkeeping is rounds_'s) -------------------------

  rpc::Future<JoinReply> Join(const std::string& observer) {
    Session session;
    session.join = rpc::Promise<JoinReply>(executor_);
    session.steps = std::make_shared<Steps>(options_.steps_per_round);
    rpc::Future<JoinReply> out = session.join.future();
    Later later;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return rpc::MakeErrorFuture<JoinReply>(absl::CancelledError("rl agent: closed"));
      Rounds::Effects effects;
      const int64_t id = rounds_->Join(observer, &effects);
      sessions_.emplace(id, std::move(session));
      ApplyLocked(std::move(effects), &later);
    }
    later.Run();
    return out;
  }

  rpc::Future<int64_t> Act(int64_t session, int64_t round, int64_t step, std::vector<float> obs,
                           absl::Time deadline) {
    std::shared_ptr<Steps> steps;
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status s = rounds_->Act(session, round, step, obs); !s.ok()) {
        return rpc::MakeErrorFuture<int64_t>(s);
      }
      steps = sessions_.at(session).steps;
    }
    PendingAct act{std::move(steps), session, round, step, std::move(obs)};
    // `deadline` is real time; the batcher's are times of the timer's clock.
    if (batcher_ != nullptr)
      return batcher_->Submit(std::move(act), timer_->FromRealTime(deadline));
    std::vector<PendingAct> one;
    one.push_back(std::move(act));
    auto actions = RunBatch(one);
    if (!actions.ok()) return rpc::MakeErrorFuture<int64_t>(actions.status());
    return rpc::MakeReadyFuture<int64_t>((*actions)[0]);
  }

  rpc::Future<RoundReply> Finish(int64_t session, int64_t round, std::vector<float> rewards,
                                 std::vector<int32_t> ends) {
    rpc::Future<RoundReply> out;
    Later later;
    {
      absl::MutexLock lock(&mu_);
      Rounds::Effects effects;
      absl::Status s =
          rounds_->Finish(session, round, std::move(rewards), std::move(ends), &effects);
      if (!s.ok()) return rpc::MakeErrorFuture<RoundReply>(s);
      Session& io = sessions_.at(session);
      io.finish = rpc::Promise<RoundReply>(executor_);
      out = io.finish.future();
      ApplyLocked(std::move(effects), &later);
    }
    later.Run();
    return out;
  }

  absl::Status Leave(int64_t session) {
    Later later;
    absl::Status s;
    {
      absl::MutexLock lock(&mu_);
      Rounds::Effects effects;
      s = rounds_->Leave(session, &effects);
      ApplyLocked(std::move(effects), &later);
    }
    later.Run();
    return s;
  }

  void Stop(const std::string& reason) {
    Later later;
    {
      absl::MutexLock lock(&mu_);
      Rounds::Effects effects;
      rounds_->Stop(reason, &effects);
      ApplyLocked(std::move(effects), &later);
    }
    later.Run();
  }

  bool WaitStopped(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto stopped = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || rounds_->stopped(); };
    return mu_.AwaitWithTimeout(absl::Condition(&stopped), timeout);
  }

  bool WaitAllLeft(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return rounds_->alive() == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&empty), timeout);
  }

  void set_on_round(std::function<void(const RoundSummary&)> fn) {
    absl::MutexLock lock(&mu_);
    on_round_ = std::move(fn);
  }
  void set_log(std::function<void(const std::string&)> fn) {
    absl::MutexLock lock(&mu_);
    log_ = std::move(fn);
  }

  ReinforceStats stats() const {
    absl::MutexLock lock(&mu_);
    const Rounds::Stats r = rounds_->stats();
    ReinforceStats s;
    s.rounds = r.rounds;
    s.episodes = r.episodes;
    s.running_reward = r.running_reward;
    s.solved_at = r.solved_at;
    s.solved_reward = r.solved_reward;
    s.steps = r.steps;
    s.forwards = forwards_.load();
    s.joined = r.joined;
    s.dropped = r.dropped;
    s.left = r.left;
    s.alive = r.alive;
    s.seconds = r.seconds;
    s.episodes_by_session = r.episodes_by_session;
    return s;
  }

  std::vector<at::Tensor> parameters() {
    absl::ReaderMutexLock lock(&policy_mu_);
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : policy_.parameters()) out.push_back(p.detach().clone());
    return out;
  }

  void Close() {
    std::vector<rpc::Promise<JoinReply>> joins;
    std::vector<rpc::Promise<RoundReply>> finishes;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
      for (auto& [id, session] : sessions_) {
        joins.push_back(session.join);
        finishes.push_back(session.finish);
      }
      if (tick_timer_ != 0) timer_->Cancel(tick_timer_);
      tick_timer_ = 0;
      tick_at_ = absl::InfiniteFuture();
    }
    if (batcher_ != nullptr) batcher_->Close();
    const absl::Status closed = absl::CancelledError("rl agent: closed");
    for (auto& p : joins) p.SetError(closed);
    for (auto& p : finishes) p.SetError(closed);
  }

 private:
  // Turns what rounds_ decided into work: replies to the sessions' promises
  // and log lines for `later`, the batch size, the update on the executor,
  // the timer for the next deadline.
  void ApplyLocked(Rounds::Effects effects, Later* later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [id, reply] : effects.join_replies) {
      auto it = sessions_.find(id);
      if (it == sessions_.end()) continue;
      later->replies.push_back([p = it->second.join, r = std::move(reply)] { p.Set(r); });
    }
    for (auto& [id, reply] : effects.finish_replies) {
      auto it = sessions_.find(id);
      if (it == sessions_.end()) continue;
      later->replies.push_back([p = it->second.finish, r = std::move(reply)] { p.Set(r); });
    }
    for (int64_t id : effects.gone) sessions_.erase(id);
    if (effects.round_started) {
      forwards_at_round_start_ = forwards_.load();
      requests_at_round_start_ = batched_requests_.load();
    }
    // Under the lock, so that batch sizes are set in the order rounds_
    // decided them.
    if (const int64_t playing = rounds_->playing(); batcher_ != nullptr && playing > 0) {
      batcher_->set_max_batch(static_cast<int>(playing));
    }
    later->log.insert(later->log.end(), std::make_move_iterator(effects.log.begin()),
                      std::make_move_iterator(effects.log.end()));
    if (!later->log.empty()) later->log_fn = log_;
    if (effects.round_ended) {
      // After the log lines: what ended the round (a drop, a leave) is
      // logged before the update can answer anyone and the job go on.
      later->replies.push_back([weak = weak_from_this(), executor = executor_, log = log_] {
        if (!executor->Submit([weak] {
              if (auto self = weak.lock()) self->EndRound();
            })) {
          log("the executor is closed; the round cannot end");
        }
      });
    }
    ArmTimerLocked();
  }

  // Makes the timer fire at rounds_'s next deadline (drops, the first
  // round). Deadlines only move later between two calls of this (an act
  // pushes its member's further out), so a timer that fires early finds
  // nothing to do and arms the next one.
  void ArmTimerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time at = rounds_->NextDeadline();
    if (closed_ || at >= tick_at_) return;
    if (tick_timer_ != 0) timer_->Cancel(tick_timer_);
    tick_at_ = at;
    const uint64_t generation = ++tick_generation_;
    std::weak_ptr<Impl> weak = weak_from_this();
    tick_timer_ = timer_->Schedule(at, [weak, generation] {
      if (auto self = weak.lock()) self->OnTimer(generation);
    });
  }

  // Timer thread: what is due (drops, the first round).
  void OnTimer(uint64_t generation) {
    Later later;
    {
      absl::MutexLock lock(&mu_);
      if (generation == tick_generation_) {
        tick_timer_ = 0;
        tick_at_ = absl::InfiniteFuture();
      }
      if (closed_) return;
      Rounds::Effects effects;
      rounds_->Tick(&effects);
      ApplyLocked(std::move(effects), &later);
    }
    later.Run();
  }

  // Actions for `batch`, recorded into each member's steps.
  absl::StatusOr<std::vector<int64_t>> RunBatch(const std::vector<PendingAct>& batch) {
    const int64_t b = static_cast<int64_t>(batch.size());
    at::Tensor states = at::empty({b, Policy::kInputs}, at::kFloat);
    float* sp = states.data_ptr<float>();
    for (int64_t i = 0; i < b; ++i) {
      std::memcpy(sp + i * Policy::kInputs, batch[i].obs.data(), sizeof(float) * Policy::kInputs);
    }
    absl::StatusOr<Policy::Acted> acted;
    {
      absl::ReaderMutexLock lock(&policy_mu_);
      acted = policy_.Act(states);
    }
    if (!acted.ok()) return acted.status();
    forwards_.fetch_add(1, std::memory_order_relaxed);
    batched_requests_.fetch_add(b, std::memory_order_relaxed);
    const int64_t* ap = acted->actions.data_ptr<int64_t>();
    const float* mp = acted->masks.data_ptr<float>();
    std::vector<int64_t> out(ap, ap + b);
    for (int64_t i = 0; i < b; ++i) {
      Steps& s = *batch[i].steps;
      const int64_t t = batch[i].step;
      std::memcpy(s.states.data_ptr<float>() + t * Policy::kInputs, sp + i * Policy::kInputs,
                  sizeof(float) * Policy::kInputs);
      std::memcpy(s.masks.data_ptr<float>() + t * Policy::kHidden, mp + i * Policy::kHidden,
                  sizeof(float) * Policy::kHidden);
      s.actions.data_ptr<int64_t>()[t] = ap[i];
    }
    // The rows are written: the members may finish (the lock orders these
    // writes before the update's reads).
    absl::MutexLock lock(&mu_);
    for (const PendingAct& act : batch) rounds_->Answered(act.session, act.round);
    return out;
  }

  // Executor: the update of the round that ended, then the next round.
  void EndRound() {
    std::vector<Rounds::Played> played;
    std::vector<std::shared_ptr<Steps>> steps;
    bool update;
    {
      absl::MutexLock lock(&mu_);
      played = rounds_->BeginUpdate();
      for (const Rounds::Played& p : played) steps.push_back(sessions_.at(p.session).steps);
      update = !played.empty() && !closed_;
    }
    const absl::Time t0 = absl::Now();
    absl::Status status = update ? Update(played, steps) : absl::OkStatus();
    const double update_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);

    Later later;
    RoundSummary summary;
    std::function<void(const RoundSummary&)> on_round;
    {
      absl::MutexLock lock(&mu_);
      Rounds::Effects effects;
      const Rounds::RoundEnd end = rounds_->EndUpdate(status, &effects);
      summary.round = end.round;
      summary.members = end.members;
      summary.episodes = end.episodes;
      summary.running_reward = end.running_reward;
      summary.seconds = end.seconds;
      summary.steps_per_s = end.seconds > 0 ? end.steps / end.seconds : 0;
      // This round's batches (before the next round's start resets the count).
      const int64_t forwards = forwards_.load() - forwards_at_round_start_;
      const int64_t requests = batched_requests_.load() - requests_at_round_start_;
      summary.mean_batch = forwards > 0 ? static_cast<double>(requests) / forwards : 0;
      summary.update_ms = update_ms;
      summary.observers_alive = end.alive;
      summary.dropped = end.dropped;
      summary.solved_at = end.solved_at;
      ApplyLocked(std::move(effects), &later);
      on_round = on_round_;
    }
    later.Run();
    if (on_round) on_round(summary);
  }

  absl::Status Update(const std::vector<Rounds::Played>& played,
                      const std::vector<std::shared_ptr<Steps>>& steps) {
    std::vector<at::Tensor> states, masks, actions;
    std::vector<float> returns;
    for (size_t i = 0; i < played.size(); ++i) {
      ASSIGN_OR_RETURN(auto g,
                       EpisodeReturns(played[i].rewards, played[i].episode_ends, options_.gamma));
      returns.insert(returns.end(), g.begin(), g.end());
      states.push_back(steps[i]->states);
      masks.push_back(steps[i]->masks);
      actions.push_back(steps[i]->actions);
    }
    at::Tensor g =
        at::from_blob(returns.data(), {static_cast<int64_t>(returns.size())}, at::kFloat);
    absl::WriterMutexLock lock(&policy_mu_);
    ASSIGN_OR_RETURN(auto logp,
                     policy_.LogProbs(at::cat(states), at::cat(masks), at::cat(actions)));
    at::Tensor loss = -(logp * g).sum() / static_cast<double>(played.size());
    adam_->zero_grad();
    loss.backward();
    adam_->step();
    return absl::OkStatus();
  }

  const ReinforceOptions options_;
  rpc::Executor* const executor_;
  rpc::DeadlineTimer* const timer_;
  std::shared_ptr<rpc::Batcher<PendingAct, int64_t>> batcher_;  // set once in Start()

  absl::Mutex policy_mu_;  // readers act; the update writes
  Policy policy_;          // parameters guarded by policy_mu_
  std::unique_ptr<torch::optim::Adam> adam_ ABSL_GUARDED_BY(policy_mu_);
  std::atomic<int64_t> forwards_{0};
  std::atomic<int64_t> batched_requests_{0};

  mutable absl::Mutex mu_;
  // Rounds, membership, deadlines and counts (R1, R4-R7).
  const std::unique_ptr<Rounds> rounds_ ABSL_PT_GUARDED_BY(mu_);
  std::map<int64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);  // rounds_'s alive ones
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t forwards_at_round_start_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t requests_at_round_start_ ABSL_GUARDED_BY(mu_) = 0;
  rpc::DeadlineTimer::Id tick_timer_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time tick_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t tick_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const RoundSummary&)> on_round_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> log_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::shared_ptr<ReinforceAgent>> ReinforceAgent::Create(ReinforceOptions options,
                                                                       rpc::Executor* executor,
                                                                       rpc::DeadlineTimer* timer) {
  if (options.steps_per_round < 1 || !(options.gamma > 0 && options.gamma <= 1) ||
      !(options.lr > 0) || options.min_observers < 1 ||
      options.observer_timeout <= absl::ZeroDuration() ||
      options.max_batch_delay < absl::ZeroDuration() || options.max_episodes < 0) {
    return absl::InvalidArgumentError(
        "rl agent: needs steps_per_round >= 1, 0 < gamma <= 1, lr > 0, min_observers >= 1, "
        "observer_timeout > 0, max_batch_delay >= 0 and max_episodes >= 0");
  }
  if (executor == nullptr || timer == nullptr) {
    return absl::InvalidArgumentError("rl agent: needs an executor and a timer");
  }
  Rounds::Options ro;
  ro.steps_per_round = options.steps_per_round;
  ro.observation_size = Policy::kInputs;
  ro.min_observers = options.min_observers;
  ro.first_round_wait = options.first_round_wait;
  ro.observer_timeout = options.observer_timeout;
  ro.solve_threshold = options.solve_threshold;
  ro.max_episodes = options.max_episodes;
  // The rounds' deadlines go on `timer`: they are times of its clock.
  ro.clock = &timer->clock();
  ASSIGN_OR_RETURN(auto rounds, Rounds::Create(std::move(ro)));
  auto impl = std::make_shared<Impl>(options, executor, timer, std::move(rounds));
  impl->Start();
  return std::shared_ptr<ReinforceAgent>(new ReinforceAgent(std::move(impl)));
}

ReinforceAgent::~ReinforceAgent() { impl_->Close(); }

namespace {

// `f`'s reply as a wire message, converted inline on the thread that
// completes `f`: a copy of plain values, so the act path takes no extra hop
// through the executor.
template <typename Out, typename In, typename Convert>
rpc::Future<Out> ToWire(const rpc::Future<In>& f, Convert convert) {
  rpc::Promise<Out> out;
  f.OnReady([out, convert](const absl::StatusOr<In>& r) {
    if (r.ok()) {
      out.SetValue(convert(*r));
    } else {
      out.SetError(r.status());
    }
  });
  return out.future();
}

}  // namespace

absl::Status ReinforceAgent::Register(rpc::FunctionRegistry& registry) {
  using internal::ActRequest;
  using internal::ActResponse;
  using internal::FinishRequest;
  using internal::FinishResponse;
  using internal::JoinRequest;
  using internal::JoinResponse;
  using internal::LeaveRequest;
  std::weak_ptr<Impl> weak = impl_;
  const absl::Status closed = absl::UnavailableError("rl agent: closed");
  absl::Status s = registry.Register(
      internal::kJoinFn, [weak, closed](JoinRequest req) -> rpc::Future<JoinResponse> {
        auto self = weak.lock();
        if (self == nullptr) return rpc::MakeErrorFuture<JoinResponse>(closed);
        return ToWire<JoinResponse>(self->Join(req.observer), [](const JoinReply& r) {
          return JoinResponse{r.session, r.round, r.steps_per_round, r.stop};
        });
      });
  if (!s.ok()) return s;
  s = registry.Register(
      internal::kActFn,
      [weak, closed](const rpc::CallContext& ctx, ActRequest req) -> rpc::Future<ActResponse> {
        auto self = weak.lock();
        if (self == nullptr) return rpc::MakeErrorFuture<ActResponse>(closed);
        return ToWire<ActResponse>(
            self->Act(req.session, req.round, req.step, std::move(req.observation), ctx.deadline),
            [](int64_t action) { return ActResponse{action}; });
      });
  if (!s.ok()) return s;
  s = registry.Register(
      internal::kFinishFn, [weak, closed](FinishRequest req) -> rpc::Future<FinishResponse> {
        auto self = weak.lock();
        if (self == nullptr) return rpc::MakeErrorFuture<FinishResponse>(closed);
        return ToWire<FinishResponse>(self->Finish(req.session, req.round, std::move(req.rewards),
                                                   std::move(req.episode_ends)),
                                      [](const RoundReply& r) {
                                        return FinishResponse{r.next_round, r.stop};
                                      });
      });
  if (!s.ok()) return s;
  return registry.Register(internal::kLeaveFn, [weak, closed](LeaveRequest req) -> absl::Status {
    auto self = weak.lock();
    if (self == nullptr) return closed;
    return self->Leave(req.session);
  });
}

rpc::Future<JoinReply> ReinforceAgent::Join(const std::string& observer) {
  return impl_->Join(observer);
}
rpc::Future<int64_t> ReinforceAgent::Act(int64_t session, int64_t round, int64_t step,
                                         std::vector<float> obs, absl::Time deadline) {
  return impl_->Act(session, round, step, std::move(obs), deadline);
}
rpc::Future<RoundReply> ReinforceAgent::Finish(int64_t session, int64_t round,
                                               std::vector<float> rewards,
                                               std::vector<int32_t> episode_ends) {
  return impl_->Finish(session, round, std::move(rewards), std::move(episode_ends));
}
absl::Status ReinforceAgent::Leave(int64_t session) { return impl_->Leave(session); }
void ReinforceAgent::Stop(const std::string& reason) { impl_->Stop(reason); }
bool ReinforceAgent::WaitStopped(absl::Duration timeout) { return impl_->WaitStopped(timeout); }
bool ReinforceAgent::WaitAllLeft(absl::Duration timeout) { return impl_->WaitAllLeft(timeout); }
void ReinforceAgent::set_on_round(std::function<void(const RoundSummary&)> fn) {
  impl_->set_on_round(std::move(fn));
}
void ReinforceAgent::set_log(std::function<void(const std::string&)> fn) {
  impl_->set_log(std::move(fn));
}
ReinforceStats ReinforceAgent::stats() const { return impl_->stats(); }
std::vector<at::Tensor> ReinforceAgent::parameters() const { return impl_->parameters(); }
void ReinforceAgent::Close() { impl_->Close(); }

namespace {

template <typename T>
absl::StatusOr<T> Await(const rpc::Future<T>& f, absl::Duration timeout, const char* what) {
  if (!f.WaitFor(timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("rl: no reply to ", what, " within ", absl::FormatDuration(timeout)));
  }
  return f.result();
}

class LocalAgentLink : public AgentLink {
 public:
  LocalAgentLink(std::shared_ptr<ReinforceAgent> agent, absl::Duration timeout)
      : agent_(std::move(agent)), timeout_(timeout) {}
  absl::StatusOr<JoinReply> Join(const std::string& observer) override {
    return Await(agent_->Join(observer), timeout_, "join");
  }
  absl::StatusOr<int64_t> Act(int64_t session, int64_t round, int64_t step,
                              const std::vector<float>& observation) override {
    return Await(agent_->Act(session, round, step, observation, absl::Now() + timeout_), timeout_,
                 "act");
  }
  absl::StatusOr<RoundReply> Finish(int64_t session, int64_t round,
                                    const std::vector<float>& rewards,
                                    const std::vector<int32_t>& episode_ends) override {
    return Await(agent_->Finish(session, round, rewards, episode_ends), timeout_, "finish");
  }
  absl::Status Leave(int64_t session) override { return agent_->Leave(session); }

 private:
  std::shared_ptr<ReinforceAgent> agent_;
  absl::Duration timeout_;
};

}  // namespace

std::unique_ptr<AgentLink> ReinforceAgent::LocalLink(std::shared_ptr<ReinforceAgent> agent,
                                                     absl::Duration timeout) {
  return std::make_unique<LocalAgentLink>(std::move(agent), timeout);
}

}  // namespace baton::rl
