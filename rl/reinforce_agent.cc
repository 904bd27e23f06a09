#include "rl/reinforce_agent.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rl/internal/functions.h"
#include "rl/policy.h"
#include "rl/returns.h"
#include "rpc/batcher.h"

namespace baton::rl {
namespace {

enum class State {
  kJoining,   // waits for the next round
  kPlaying,   // in the current round, steps left to play
  kFinished,  // played its steps; waits for the update
  kStopped,   // told that training is over; may still leave
};

struct Member {
  int64_t session = 0;
  std::string name;
  State state = State::kJoining;
  int64_t round = -1;
  int64_t next_step = 0;               // steps accepted this round
  std::atomic<int64_t> answered{0};    // steps whose action was recorded
  absl::Time last_seen;
  // This round's steps, row t for step t (written once per row).
  at::Tensor states;   // [T, 4] float32
  at::Tensor masks;    // [T, 128] float32
  at::Tensor actions;  // [T] int64
  std::vector<float> rewards;
  std::vector<int32_t> ends;
  rpc::Promise<JoinReply> join_promise;
  rpc::Promise<RoundReply> finish_promise;
  int64_t episodes = 0;

  std::string Who() const { return absl::StrCat("observer '", name, "' (session ", session, ")"); }
};

struct PendingAct {
  std::shared_ptr<Member> member;
  int64_t step = 0;
  std::vector<float> obs;
};

}  // namespace

class ReinforceAgent::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(ReinforceOptions options, rpc::Executor* executor, rpc::DeadlineTimer* timer)
      : options_(options), executor_(executor), timer_(timer), policy_(options.seed) {
    adam_ = std::make_unique<torch::optim::Adam>(policy_.parameters(),
                                                 torch::optim::AdamOptions(options.lr));
    log_ = [](const std::string& line) { std::fprintf(stderr, "[rl agent] %s\n", line.c_str()); };
  }

  void Start() {
    if (options_.batched) {
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
    ScheduleSilenceCheck();
  }

  // ---- the protocol --------------------------------------------------------

  rpc::Future<JoinReply> Join(const std::string& observer) {
    auto m = std::make_shared<Member>();
    m->name = observer;
    m->join_promise = rpc::Promise<JoinReply>(executor_);
    rpc::Future<JoinReply> out = m->join_promise.future();
    std::vector<std::function<void()>> later;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return rpc::MakeErrorFuture<JoinReply>(absl::CancelledError("rl agent: closed"));
      m->session = next_session_++;
      m->last_seen = absl::Now();
      sessions_[m->session] = m;
      ++joined_;
      Log(absl::StrCat(m->Who(), " joined", stopped_ ? " after training stopped" : ""));
      if (stopped_) {
        m->state = State::kStopped;
        m->join_promise.SetValue(JoinReply{m->session, round_, options_.steps_per_round, true});
        return out;
      }
      if (phase_ == Phase::kIdle) {
        const int64_t waiting = CountLocked(State::kJoining);
        if (started_ || waiting >= options_.min_observers) {
          StartRoundLocked(later);
        } else if (waiting == 1) {
          std::weak_ptr<Impl> weak = weak_from_this();
          first_round_timer_ =
              timer_->Schedule(absl::Now() + options_.first_round_wait, [weak] {
                if (auto self = weak.lock()) self->FirstRoundTimeout();
              });
        }
      }
    }
    for (auto& f : later) f();
    return out;
  }

  rpc::Future<int64_t> Act(int64_t session, int64_t round, int64_t step, std::vector<float> obs,
                           absl::Time deadline) {
    std::shared_ptr<Member> m;
    {
      absl::MutexLock lock(&mu_);
      auto found = FindLocked(session, "act");
      if (!found.ok()) return rpc::MakeErrorFuture<int64_t>(found.status());
      m = *found;
      if (m->state != State::kPlaying || m->round != round || step != m->next_step) {
        return rpc::MakeErrorFuture<int64_t>(absl::FailedPreconditionError(absl::StrCat(
            "rl agent: act from ", m->Who(), " for round ", round, " step ", step,
            " does not follow: it ", DescribeLocked(*m))));
      }
      if (absl::Status s = CheckObservation(obs); !s.ok()) {
        return rpc::MakeErrorFuture<int64_t>(
            absl::InvalidArgumentError(absl::StrCat("rl agent: act from ", m->Who(), " step ",
                                                    step, ": ", s.message())));
      }
      ++m->next_step;
      m->last_seen = absl::Now();
    }
    if (batcher_ != nullptr) return batcher_->Submit(PendingAct{m, step, std::move(obs)}, deadline);
    std::vector<PendingAct> one;
    one.push_back(PendingAct{m, step, std::move(obs)});
    auto actions = RunBatch(one);
    if (!actions.ok()) return rpc::MakeErrorFuture<int64_t>(actions.status());
    return rpc::MakeReadyFuture<int64_t>((*actions)[0]);
  }

  rpc::Future<RoundReply> Finish(int64_t session, int64_t round, std::vector<float> rewards,
                                 std::vector<int32_t> ends) {
    rpc::Future<RoundReply> out;
    {
      absl::MutexLock lock(&mu_);
      auto found = FindLocked(session, "finish");
      if (!found.ok()) return rpc::MakeErrorFuture<RoundReply>(found.status());
      Member& m = **found;
      const int64_t t = options_.steps_per_round;
      if (m.state != State::kPlaying || m.round != round || m.next_step != t ||
          m.answered.load() != t) {
        return rpc::MakeErrorFuture<RoundReply>(absl::FailedPreconditionError(absl::StrCat(
            "rl agent: finish from ", m.Who(), " for round ", round, " before its ", t,
            " steps were answered: it ", DescribeLocked(m))));
      }
      absl::Status bad;
      if (static_cast<int64_t>(rewards.size()) != t) {
        bad = absl::InvalidArgumentError(
            absl::StrCat(rewards.size(), " rewards for a round of ", t, " steps"));
      } else if (auto r = EpisodeRewards(rewards, ends); !r.ok()) {
        bad = r.status();
      } else {
        for (float x : rewards) {
          if (!std::isfinite(x)) bad = absl::InvalidArgumentError("a reward is not finite");
        }
      }
      if (!bad.ok()) {
        return rpc::MakeErrorFuture<RoundReply>(absl::InvalidArgumentError(absl::StrCat(
            "rl agent: finish from ", m.Who(), " round ", round, ": ", bad.message())));
      }
      m.rewards = std::move(rewards);
      m.ends = std::move(ends);
      m.state = State::kFinished;
      m.last_seen = absl::Now();
      m.finish_promise = rpc::Promise<RoundReply>(executor_);
      out = m.finish_promise.future();
      MaybeEndRoundLocked();
    }
    return out;
  }

  absl::Status Leave(int64_t session) {
    std::vector<std::function<void()>> later;
    {
      absl::MutexLock lock(&mu_);
      if (gone_.count(session) > 0) return absl::OkStatus();  // idempotent
      auto it = sessions_.find(session);
      if (it == sessions_.end()) {
        return absl::NotFoundError(absl::StrCat("rl agent: leave of unknown session ", session));
      }
      ++left_;
      RemoveLocked(it->second, "left", later);
    }
    for (auto& f : later) f();
    return absl::OkStatus();
  }

  void Stop(const std::string& reason) {
    std::vector<std::function<void()>> later;
    {
      absl::MutexLock lock(&mu_);
      StopLocked(reason, later);
    }
    for (auto& f : later) f();
  }

  bool WaitStopped(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&stopped_), timeout);
  }

  bool WaitAllLeft(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sessions_.empty(); };
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
    ReinforceStats s;
    s.rounds = rounds_done_;
    s.episodes = running_.episodes;
    s.running_reward = running_.value;
    s.solved_at = solved_at_;
    s.steps = steps_;
    s.forwards = forwards_.load();
    s.joined = joined_;
    s.dropped = dropped_;
    s.left = left_;
    s.alive = static_cast<int64_t>(sessions_.size());
    s.seconds = started_ ? absl::ToDoubleSeconds(absl::Now() - first_round_start_) : 0;
    for (const auto& [session, n] : episodes_by_session_) s.episodes_by_session.push_back({session, n});
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
      stopped_ = true;
      for (auto& [s, m] : sessions_) {
        joins.push_back(m->join_promise);
        finishes.push_back(m->finish_promise);
      }
      if (first_round_timer_ != 0) timer_->Cancel(first_round_timer_);
      if (silence_timer_ != 0) timer_->Cancel(silence_timer_);
      first_round_timer_ = silence_timer_ = 0;
    }
    if (batcher_ != nullptr) batcher_->Close();
    const absl::Status closed = absl::CancelledError("rl agent: closed");
    for (auto& p : joins) p.SetError(closed);
    for (auto& p : finishes) p.SetError(closed);
  }

 private:
  enum class Phase { kIdle, kPlaying, kUpdating };

  void Log(const std::string& line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { log_(line); }

  static absl::Status CheckObservation(const std::vector<float>& obs) {
    if (static_cast<int64_t>(obs.size()) != Policy::kInputs) {
      return absl::InvalidArgumentError(absl::StrCat("an observation has ", Policy::kInputs,
                                                     " values; got ", obs.size()));
    }
    for (size_t i = 0; i < obs.size(); ++i) {
      if (!std::isfinite(obs[i])) {
        return absl::InvalidArgumentError(absl::StrCat("observation[", i, "] is not finite"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Member>> FindLocked(int64_t session, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = sessions_.find(session);
    if (it != sessions_.end()) return it->second;
    if (auto g = gone_.find(session); g != gone_.end()) {
      return absl::AbortedError(absl::StrCat("rl agent: ", what, " from session ", session,
                                             ", which ", g->second, "; join again"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("rl agent: ", what, " from unknown session ", session));
  }

  std::string DescribeLocked(const Member& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (m.state) {
      case State::kJoining:
        return absl::StrCat("waits for round ", round_, " to start");
      case State::kPlaying:
        return absl::StrCat("plays round ", m.round, ", next step ", m.next_step, " of ",
                            options_.steps_per_round, " (", m.answered.load(), " answered)");
      case State::kFinished:
        return absl::StrCat("finished round ", m.round, " and waits for the update");
      case State::kStopped:
        return "was told that training is over";
    }
    return "?";
  }

  int64_t CountLocked(State state) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t n = 0;
    for (const auto& [s, m] : sessions_) n += m->state == state;
    return n;
  }

  // Actions for `batch`, recorded into each member's round.
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
      Member& m = *batch[i].member;
      const int64_t t = batch[i].step;
      std::memcpy(m.states.data_ptr<float>() + t * Policy::kInputs, sp + i * Policy::kInputs,
                  sizeof(float) * Policy::kInputs);
      std::memcpy(m.masks.data_ptr<float>() + t * Policy::kHidden, mp + i * Policy::kHidden,
                  sizeof(float) * Policy::kHidden);
      m.actions.data_ptr<int64_t>()[t] = ap[i];
      m.answered.fetch_add(1, std::memory_order_release);
    }
    return out;
  }

  // Starts round_ with every finished member and every joiner. Replies go
  // out through `later` (after the lock is released).
  void StartRoundLocked(std::vector<std::function<void()>>& later)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (first_round_timer_ != 0) timer_->Cancel(first_round_timer_);
    first_round_timer_ = 0;
    const absl::Time now = absl::Now();
    const int64_t t = options_.steps_per_round;
    int64_t players = 0;
    for (auto& [s, mp] : sessions_) {
      Member& m = *mp;
      if (m.state != State::kJoining && m.state != State::kFinished) continue;
      const bool joining = m.state == State::kJoining;
      m.state = State::kPlaying;
      m.round = round_;
      m.next_step = 0;
      m.answered.store(0);
      m.last_seen = now;
      if (!m.states.defined()) {
        m.states = at::zeros({t, Policy::kInputs}, at::kFloat);
        m.masks = at::zeros({t, Policy::kHidden}, at::kFloat);
        m.actions = at::zeros({t}, at::kLong);
      }
      ++players;
      if (joining) {
        later.push_back(
            [p = m.join_promise, r = JoinReply{m.session, round_, t, false}] { p.SetValue(r); });
      } else {
        later.push_back([p = m.finish_promise, r = RoundReply{round_, false}] { p.SetValue(r); });
      }
    }
    if (players == 0) {
      phase_ = Phase::kIdle;
      return;
    }
    if (!started_) {
      started_ = true;
      first_round_start_ = now;
    }
    phase_ = Phase::kPlaying;
    forwards_at_round_start_ = forwards_.load();
    requests_at_round_start_ = batched_requests_.load();
    if (batcher_ != nullptr) batcher_->set_max_batch(static_cast<int>(players));
  }

  void FirstRoundTimeout() {
    std::vector<std::function<void()>> later;
    {
      absl::MutexLock lock(&mu_);
      first_round_timer_ = 0;
      if (phase_ != Phase::kIdle || started_ || stopped_ || CountLocked(State::kJoining) == 0) {
        return;
      }
      Log(absl::StrCat("starting the first round with ", CountLocked(State::kJoining), " of ",
                       options_.min_observers, " observers after waiting ",
                       absl::FormatDuration(options_.first_round_wait)));
      StartRoundLocked(later);
    }
    for (auto& f : later) f();
  }

  // When no member plays any more, the round ends: the update runs on the
  // executor.
  void MaybeEndRoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ != Phase::kPlaying) return;
    const int64_t playing = CountLocked(State::kPlaying);
    if (playing > 0) {
      if (batcher_ != nullptr) batcher_->set_max_batch(static_cast<int>(playing));
      return;
    }
    phase_ = Phase::kUpdating;
    std::weak_ptr<Impl> weak = weak_from_this();
    if (!executor_->Submit([weak] {
          if (auto self = weak.lock()) self->EndRound();
        })) {
      Log("the executor is closed; the round cannot end");
    }
  }

  // Removes a member (left, dropped); its steps of this round are discarded.
  void RemoveLocked(std::shared_ptr<Member> m, const std::string& why,
                    std::vector<std::function<void()>>& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    gone_[m->session] = why;
    sessions_.erase(m->session);
    const absl::Status gone =
        absl::AbortedError(absl::StrCat("rl agent: ", m->Who(), " ", why));
    if (m->state == State::kJoining) {
      later.push_back([p = m->join_promise, gone] { p.SetError(gone); });
    } else if (m->state == State::kFinished) {
      later.push_back([p = m->finish_promise, gone] { p.SetError(gone); });
    }
    Log(absl::StrCat(m->Who(), " ", why, m->state == State::kPlaying
                                             ? absl::StrCat("; its ", m->next_step,
                                                            " steps of round ", m->round,
                                                            " are discarded")
                                             : std::string()));
    m->state = State::kStopped;
    MaybeEndRoundLocked();
  }

  void StopLocked(const std::string& reason, std::vector<std::function<void()>>& later)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopped_) return;
    stopped_ = true;
    Log(absl::StrCat("training stops: ", reason));
    for (auto& [s, mp] : sessions_) {
      if (mp->state != State::kJoining) continue;
      mp->state = State::kStopped;
      later.push_back([p = mp->join_promise, r = JoinReply{s, round_, options_.steps_per_round,
                                                           true}] { p.SetValue(r); });
    }
    // Members playing finish their round; its Finish replies say stop.
  }

  void EndRound() {
    std::vector<std::shared_ptr<Member>> finished;
    bool update;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [s, m] : sessions_) {
        if (m->state == State::kFinished) finished.push_back(m);  // session order
      }
      update = !finished.empty() && !closed_;
    }
    const absl::Time t0 = absl::Now();
    absl::Status status = update ? Update(finished) : absl::OkStatus();
    const double update_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);

    std::vector<std::function<void()>> later;
    RoundSummary summary;
    std::function<void(const RoundSummary&)> on_round;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok()) {
        Log(absl::StrCat("round ", round_, ": the update failed: ", status.ToString()));
        StopLocked(absl::StrCat("the update failed: ", status.message()), later);
      }
      // Count the episodes of members still present (R4: a member removed
      // meanwhile took its steps with it only if it was still playing).
      for (const auto& m : finished) {
        const std::vector<double> episodes =
            EpisodeRewards(m->rewards, m->ends).value();  // checked by Finish()
        for (double r : episodes) {
          running_.Add(r);
          ++m->episodes;
          ++episodes_by_session_[m->session];
          if (solved_at_ < 0 && running_.value > options_.solve_threshold) {
            solved_at_ = running_.episodes;
          }
        }
        steps_ += options_.steps_per_round;
      }
      ++rounds_done_;
      summary.round = round_;
      summary.members = static_cast<int64_t>(finished.size());
      summary.episodes = running_.episodes;
      summary.running_reward = running_.value;
      const double seconds = absl::ToDoubleSeconds(absl::Now() - first_round_start_);
      summary.seconds = seconds;
      summary.steps_per_s = seconds > 0 ? steps_ / seconds : 0;
      const int64_t forwards = forwards_.load() - forwards_at_round_start_;
      const int64_t requests = batched_requests_.load() - requests_at_round_start_;
      summary.mean_batch = forwards > 0 ? static_cast<double>(requests) / forwards : 0;
      summary.update_ms = update_ms;
      summary.dropped = dropped_;
      summary.solved_at = solved_at_;
      if (solved_at_ >= 0) {
        StopLocked(absl::StrCat("solved at episode ", solved_at_, " (running reward ",
                                running_.value, " > ", options_.solve_threshold, ")"),
                   later);
      } else if (options_.max_episodes > 0 && running_.episodes >= options_.max_episodes) {
        StopLocked(absl::StrCat("the episode budget of ", options_.max_episodes,
                                " ran out (running reward ", running_.value, ")"),
                   later);
      }
      ++round_;
      if (stopped_) {
        for (auto& [s, m] : sessions_) {
          if (m->state != State::kFinished) continue;
          m->state = State::kStopped;
          m->last_seen = absl::Now();
          later.push_back([p = m->finish_promise, r = RoundReply{round_, true}] { p.SetValue(r); });
        }
        phase_ = Phase::kIdle;
      } else {
        StartRoundLocked(later);
      }
      summary.observers_alive = static_cast<int64_t>(sessions_.size());
      on_round = on_round_;
    }
    for (auto& f : later) f();
    if (on_round) on_round(summary);
  }

  absl::Status Update(const std::vector<std::shared_ptr<Member>>& finished) {
    std::vector<at::Tensor> states, masks, actions;
    std::vector<float> returns;
    for (const auto& m : finished) {
      auto g = EpisodeReturns(m->rewards, m->ends, options_.gamma);
      if (!g.ok()) return g.status();
      returns.insert(returns.end(), g->begin(), g->end());
      states.push_back(m->states);
      masks.push_back(m->masks);
      actions.push_back(m->actions);
    }
    at::Tensor g = at::from_blob(returns.data(), {static_cast<int64_t>(returns.size())}, at::kFloat);
    absl::WriterMutexLock lock(&policy_mu_);
    auto logp = policy_.LogProbs(at::cat(states), at::cat(masks), at::cat(actions));
    if (!logp.ok()) return logp.status();
    at::Tensor loss = -(*logp * g).sum() / static_cast<double>(finished.size());
    adam_->zero_grad();
    loss.backward();
    adam_->step();
    return absl::OkStatus();
  }

  void ScheduleSilenceCheck() {
    const absl::Duration every =
        std::clamp(options_.observer_timeout / 4, absl::Milliseconds(10), absl::Milliseconds(500));
    std::weak_ptr<Impl> weak = weak_from_this();
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    silence_timer_ = timer_->Schedule(absl::Now() + every, [weak] {
      if (auto self = weak.lock()) self->CheckSilence();
    });
  }

  // Timer thread: drops the members the round waits for that went silent.
  void CheckSilence() {
    std::vector<std::function<void()>> later;
    {
      absl::MutexLock lock(&mu_);
      silence_timer_ = 0;
      const absl::Time now = absl::Now();
      std::vector<std::shared_ptr<Member>> silent;
      for (auto& [s, m] : sessions_) {
        const bool awaited = m->state == State::kPlaying || m->state == State::kStopped;
        if (awaited && now - m->last_seen > options_.observer_timeout) silent.push_back(m);
      }
      for (auto& m : silent) {
        ++dropped_;
        RemoveLocked(m,
                     absl::StrCat("was dropped after ",
                                  absl::FormatDuration(absl::Trunc(now - m->last_seen,
                                                                   absl::Milliseconds(1))),
                                  " of silence"),
                     later);
      }
    }
    for (auto& f : later) f();
    ScheduleSilenceCheck();
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
  std::map<int64_t, std::shared_ptr<Member>> sessions_ ABSL_GUARDED_BY(mu_);  // alive
  std::map<int64_t, std::string> gone_ ABSL_GUARDED_BY(mu_);                  // why
  std::map<int64_t, int64_t> episodes_by_session_ ABSL_GUARDED_BY(mu_);
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kIdle;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;  // the current (or next) round
  int64_t rounds_done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  RunningReward running_ ABSL_GUARDED_BY(mu_);
  int64_t solved_at_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t joined_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t left_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_round_start_ ABSL_GUARDED_BY(mu_);
  int64_t forwards_at_round_start_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t requests_at_round_start_ ABSL_GUARDED_BY(mu_) = 0;
  rpc::DeadlineTimer::Id first_round_timer_ ABSL_GUARDED_BY(mu_) = 0;
  rpc::DeadlineTimer::Id silence_timer_ ABSL_GUARDED_BY(mu_) = 0;
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
  auto impl = std::make_shared<Impl>(options, executor, timer);
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
            self->Act(req.session, req.round, req.step, std::move(req.observation),
                      ctx.deadline),
            [](int64_t action) { return ActResponse{action}; });
      });
  if (!s.ok()) return s;
  s = registry.Register(
      internal::kFinishFn, [weak, closed](FinishRequest req) -> rpc::Future<FinishResponse> {
        auto self = weak.lock();
        if (self == nullptr) return rpc::MakeErrorFuture<FinishResponse>(closed);
        return ToWire<FinishResponse>(
            self->Finish(req.session, req.round, std::move(req.rewards),
                         std::move(req.episode_ends)),
            [](const RoundReply& r) { return FinishResponse{r.next_round, r.stop}; });
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
    return absl::DeadlineExceededError(absl::StrCat("rl: no reply to ", what, " within ",
                                                    absl::FormatDuration(timeout)));
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
    return Await(agent_->Act(session, round, step, observation, absl::Now() + timeout_),
                 timeout_, "act");
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
