#include "rl/rounds.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace baton::rl {

absl::StatusOr<std::unique_ptr<Rounds>> Rounds::Create(Options options) {
  if (options.steps_per_round < 1 || options.observation_size < 0 || options.min_observers < 1 ||
      options.observer_timeout <= absl::ZeroDuration() || options.max_episodes < 0) {
    return absl::InvalidArgumentError(
        "rl rounds: needs steps_per_round >= 1, observation_size >= 0, min_observers >= 1, "
        "observer_timeout > 0 and max_episodes >= 0");
  }
  return std::unique_ptr<Rounds>(new Rounds(std::move(options)));
}

std::string Rounds::Member::Who() const {
  return absl::StrCat("observer '", name, "' (session ", session, ")");
}

// ---- the protocol ----------------------------------------------------------

int64_t Rounds::Join(const std::string& observer, Effects* out) {
  const absl::Time now = clock_->Now();
  const int64_t session = next_session_++;
  Member& m = members_[session];
  m.session = session;
  m.name = observer;
  m.last_seen = now;
  ++joined_;
  out->log.push_back(absl::StrCat(m.Who(), " joined", stopped_ ? " after training stopped" : ""));
  if (stopped_) {
    m.state = State::kStopped;
    out->join_replies.push_back({session, JoinReply{session, round_, options_.steps_per_round,
                                                    /*stop=*/true}});
    return session;
  }
  if (phase_ == Phase::kIdle) {
    const int64_t waiting = Count(State::kJoining);
    if (started_ || waiting >= options_.min_observers) {
      StartRound(now, out);
    } else if (waiting == 1) {
      first_round_at_ = now + options_.first_round_wait;
    }
  }
  return session;
}

absl::Status Rounds::Act(int64_t session, int64_t round, int64_t step,
                         const std::vector<float>& observation) {
  ASSIGN_OR_RETURN(Member * found, Find(session, "act"));
  Member& m = *found;
  if (m.state != State::kPlaying || m.round != round || step != m.next_step) {
    return absl::FailedPreconditionError(absl::StrCat("rl agent: act from ", m.Who(), " for round ",
                                                      round, " step ", step,
                                                      " does not follow: it ", Describe(m)));
  }
  absl::Status bad;
  if (static_cast<int64_t>(observation.size()) != options_.observation_size) {
    bad = absl::InvalidArgumentError(absl::StrCat("an observation has ", options_.observation_size,
                                                  " values; got ", observation.size()));
  } else {
    for (size_t i = 0; i < observation.size() && bad.ok(); ++i) {
      if (!std::isfinite(observation[i])) {
        bad = absl::InvalidArgumentError(absl::StrCat("observation[", i, "] is not finite"));
      }
    }
  }
  if (!bad.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rl agent: act from ", m.Who(), " step ", step, ": ", bad.message()));
  }
  ++m.next_step;
  m.last_seen = clock_->Now();
  return absl::OkStatus();
}

void Rounds::Answered(int64_t session, int64_t round) {
  auto it = members_.find(session);
  if (it == members_.end()) return;
  Member& m = it->second;
  if (m.state == State::kPlaying && m.round == round && m.answered < m.next_step) ++m.answered;
}

absl::Status Rounds::Finish(int64_t session, int64_t round, std::vector<float> rewards,
                            std::vector<int32_t> episode_ends, Effects* out) {
  ASSIGN_OR_RETURN(Member * found, Find(session, "finish"));
  Member& m = *found;
  const int64_t t = options_.steps_per_round;
  if (m.state != State::kPlaying || m.round != round || m.next_step != t || m.answered != t) {
    return absl::FailedPreconditionError(absl::StrCat("rl agent: finish from ", m.Who(),
                                                      " for round ", round, " before its ", t,
                                                      " steps were answered: it ", Describe(m)));
  }
  absl::Status bad;
  if (static_cast<int64_t>(rewards.size()) != t) {
    bad = absl::InvalidArgumentError(
        absl::StrCat(rewards.size(), " rewards for a round of ", t, " steps"));
  } else if (auto r = EpisodeRewards(rewards, episode_ends); !r.ok()) {
    bad = r.status();
  } else if (!std::all_of(rewards.begin(), rewards.end(),
                          [](float x) { return std::isfinite(x); })) {
    bad = absl::InvalidArgumentError("a reward is not finite");
  }
  if (!bad.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rl agent: finish from ", m.Who(), " round ", round, ": ", bad.message()));
  }
  m.rewards = std::move(rewards);
  m.ends = std::move(episode_ends);
  m.state = State::kFinished;
  m.last_seen = clock_->Now();
  MaybeEndRound(out);
  return absl::OkStatus();
}

absl::Status Rounds::Leave(int64_t session, Effects* out) {
  if (gone_.count(session) > 0) return absl::OkStatus();  // idempotent
  if (members_.count(session) == 0) {
    return absl::NotFoundError(absl::StrCat("rl agent: leave of unknown session ", session));
  }
  ++left_;
  Remove(session, "left", out);
  return absl::OkStatus();
}

void Rounds::Stop(const std::string& reason, Effects* out) { StopAt(reason, clock_->Now(), out); }

// ---- deadlines -------------------------------------------------------------

bool Rounds::Awaited(const Member& m) const {
  return m.state == State::kPlaying || m.state == State::kStopped;
}

void Rounds::Tick(Effects* out) {
  const absl::Time now = clock_->Now();
  std::vector<std::pair<int64_t, absl::Duration>> silent;
  for (const auto& [session, m] : members_) {
    if (Awaited(m) && now >= m.last_seen + options_.observer_timeout) {
      silent.push_back({session, now - m.last_seen});
    }
  }
  for (const auto& [session, silence] : silent) {
    ++dropped_;
    Remove(session,
           absl::StrCat("was dropped after ",
                        absl::FormatDuration(absl::Trunc(silence, absl::Milliseconds(1))),
                        " of silence"),
           out);
  }
  if (!started_ && !stopped_ && phase_ == Phase::kIdle && now >= first_round_at_) {
    const int64_t waiting = Count(State::kJoining);
    if (waiting > 0) {
      out->log.push_back(absl::StrCat("starting the first round with ", waiting, " of ",
                                      options_.min_observers, " observers after waiting ",
                                      absl::FormatDuration(options_.first_round_wait)));
      StartRound(now, out);
    }
  }
}

absl::Time Rounds::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  if (!started_ && !stopped_ && phase_ == Phase::kIdle && Count(State::kJoining) > 0) {
    next = first_round_at_;
  }
  for (const auto& [session, m] : members_) {
    if (Awaited(m)) next = std::min(next, m.last_seen + options_.observer_timeout);
  }
  return next;
}

// ---- the update ------------------------------------------------------------

std::vector<Rounds::Played> Rounds::BeginUpdate() {
  updating_.clear();
  if (phase_ != Phase::kUpdating) return {};
  for (const auto& [session, m] : members_) {
    if (m.state == State::kFinished) updating_.push_back(Played{session, m.rewards, m.ends});
  }
  return updating_;
}

Rounds::RoundEnd Rounds::EndUpdate(const absl::Status& update, Effects* out) {
  RoundEnd end;
  end.round = round_;
  if (phase_ != Phase::kUpdating) return end;  // REQUIRES violated: nothing to end
  const absl::Time now = clock_->Now();
  if (!update.ok()) {
    out->log.push_back(absl::StrCat("round ", round_, ": the update failed: ", update.ToString()));
    StopAt(absl::StrCat("the update failed: ", update.message()), now, out);
  }
  // The members whose steps went into the update, even one that left since.
  for (const Played& p : updating_) {
    const std::vector<double> episodes =
        EpisodeRewards(p.rewards, p.episode_ends).value();  // checked by Finish()
    for (double r : episodes) {
      running_.Add(r);
      ++episodes_by_session_[p.session];
      if (solved_at_ < 0 && running_.value > options_.solve_threshold) {
        solved_at_ = running_.episodes;
        solved_reward_ = running_.value;
      }
    }
    steps_ += options_.steps_per_round;
  }
  ++rounds_done_;
  end.members = static_cast<int64_t>(updating_.size());
  updating_.clear();
  end.episodes = running_.episodes;
  end.running_reward = running_.value;
  end.seconds = absl::ToDoubleSeconds(now - first_round_start_);
  end.steps = steps_;
  if (solved_at_ >= 0) {
    StopAt(absl::StrCat("solved at episode ", solved_at_, " (running reward ", solved_reward_,
                        " > ", options_.solve_threshold, ")"),
           now, out);
  } else if (options_.max_episodes > 0 && running_.episodes >= options_.max_episodes) {
    StopAt(absl::StrCat("the episode budget of ", options_.max_episodes,
                        " ran out (running reward ", running_.value, ")"),
           now, out);
  }
  ++round_;
  if (stopped_) {
    for (auto& [session, m] : members_) {
      if (m.state != State::kFinished) continue;
      m.state = State::kStopped;
      m.last_seen = now;
      out->finish_replies.push_back({session, RoundReply{round_, /*stop=*/true}});
    }
    phase_ = Phase::kIdle;
  } else {
    StartRound(now, out);
  }
  end.alive = alive();
  end.dropped = dropped_;
  end.solved_at = solved_at_;
  return end;
}

// ---- state -----------------------------------------------------------------

int64_t Rounds::playing() const { return phase_ == Phase::kPlaying ? Count(State::kPlaying) : 0; }

Rounds::Stats Rounds::stats() const {
  Stats s;
  s.rounds = rounds_done_;
  s.episodes = running_.episodes;
  s.running_reward = running_.value;
  s.solved_at = solved_at_;
  s.solved_reward = solved_reward_;
  s.steps = steps_;
  s.joined = joined_;
  s.dropped = dropped_;
  s.left = left_;
  s.alive = alive();
  s.seconds = started_ ? absl::ToDoubleSeconds(clock_->Now() - first_round_start_) : 0;
  s.episodes_by_session.assign(episodes_by_session_.begin(), episodes_by_session_.end());
  return s;
}

absl::StatusOr<Rounds::Member*> Rounds::Find(int64_t session, const char* what) {
  auto it = members_.find(session);
  if (it != members_.end()) return &it->second;
  if (auto g = gone_.find(session); g != gone_.end()) {
    return absl::AbortedError(absl::StrCat("rl agent: ", what, " from session ", session,
                                           ", which ", g->second, "; join again"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("rl agent: ", what, " from unknown session ", session));
}

std::string Rounds::Describe(const Member& m) const {
  switch (m.state) {
    case State::kJoining: return absl::StrCat("waits for round ", round_, " to start");
    case State::kPlaying:
      return absl::StrCat("plays round ", m.round, ", next step ", m.next_step, " of ",
                          options_.steps_per_round, " (", m.answered, " answered)");
    case State::kFinished:
      return absl::StrCat("finished round ", m.round, " and waits for the update");
    case State::kStopped: return "was told that training is over";
  }
  return "?";
}

int64_t Rounds::Count(State state) const {
  int64_t n = 0;
  for (const auto& [session, m] : members_) n += m.state == state;
  return n;
}

// Starts round_ with every finished member and every joiner.
void Rounds::StartRound(absl::Time now, Effects* out) {
  first_round_at_ = absl::InfiniteFuture();
  const int64_t t = options_.steps_per_round;
  int64_t players = 0;
  for (auto& [session, m] : members_) {
    if (m.state != State::kJoining && m.state != State::kFinished) continue;
    const bool joining = m.state == State::kJoining;
    m.state = State::kPlaying;
    m.round = round_;
    m.next_step = 0;
    m.answered = 0;
    m.last_seen = now;
    ++players;
    if (joining) {
      out->join_replies.push_back({session, JoinReply{session, round_, t, /*stop=*/false}});
    } else {
      out->finish_replies.push_back({session, RoundReply{round_, /*stop=*/false}});
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
  out->round_started = true;
}

// When no member plays any more, the round ends.
void Rounds::MaybeEndRound(Effects* out) {
  if (phase_ != Phase::kPlaying || Count(State::kPlaying) > 0) return;
  phase_ = Phase::kUpdating;
  out->round_ended = true;
}

// Ends a member (left, dropped); its steps of this round are discarded.
void Rounds::Remove(int64_t session, const std::string& why, Effects* out) {
  auto it = members_.find(session);
  if (it == members_.end()) return;
  Member m = std::move(it->second);
  members_.erase(it);
  gone_[session] = why;
  const absl::Status gone = absl::AbortedError(absl::StrCat("rl agent: ", m.Who(), " ", why));
  if (m.state == State::kJoining) {
    out->join_replies.push_back({session, gone});
  } else if (m.state == State::kFinished) {
    out->finish_replies.push_back({session, gone});
  }
  out->log.push_back(absl::StrCat(
      m.Who(), " ", why,
      m.state == State::kPlaying
          ? absl::StrCat("; its ", m.next_step, " steps of round ", m.round, " are discarded")
          : std::string()));
  out->gone.push_back(session);
  MaybeEndRound(out);
}

void Rounds::StopAt(const std::string& reason, absl::Time now, Effects* out) {
  if (stopped_) return;
  stopped_ = true;
  out->log.push_back(absl::StrCat("training stops: ", reason));
  for (auto& [session, m] : members_) {
    if (m.state != State::kJoining) continue;
    m.state = State::kStopped;
    m.last_seen = now;  // told now: its silence counts from here
    out->join_replies.push_back(
        {session, JoinReply{session, round_, options_.steps_per_round, /*stop=*/true}});
  }
  // Members playing finish their round; its Finish replies say stop.
}

}  // namespace baton::rl
