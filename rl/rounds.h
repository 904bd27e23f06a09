// Rounds: the bookkeeping of ReinforceAgent's protocol (rl/reinforce_agent.h
// states it and numbers its guarantees R1-R7), without RPC, tensors or
// threads: who is a member, which round runs, which step each member plays
// next, when a round ends, who is dropped at which deadline, when training
// stops, and what was counted. ReinforceAgent holds one and does the rest:
// promises, the policy, batching, timers. Tests drive it directly on a fake
// clock (tests/rl/rounds_test.cc).
//
//   Rounds::Effects e;
//   int64_t s = rounds->Join("alice", &e);    // e: replies, log lines, ...
//   rounds->Act(s, round, step, observation); // for each step, then
//   rounds->Answered(s, round);               // once its action is recorded
//   rounds->Finish(s, round, rewards, ends, &e);
//   if (e.round_ended) {                      // everyone finished or left
//     auto played = rounds->BeginUpdate();    // their steps, session order
//     ...                                     // the update
//     rounds->EndUpdate(status, &e);          // counts, stops or goes on
//   }
//   rounds->Tick(&e);                         // at NextDeadline()
//
// Contract:
// - Members. Join() makes a new session (1, 2, ...) that waits for the next
//   round; Leave() and a drop end it. Act() and Finish() of a session that
//   ended fail with ABORTED saying why ("... which left; join again"), of
//   an unknown one with INVALID_ARGUMENT; Leave() of an ended session is OK,
//   of an unknown one NOT_FOUND.
// - Rounds. A round starts when a member waits and no round runs: at once
//   once the first round started, else when min_observers members wait or
//   first_round_wait after the first of them joined (Tick). At the start
//   every waiting joiner and every member that finished the previous round
//   plays the new round from step 0; their replies are in the Effects. The
//   round ends (Effects::round_ended) when no member plays any more: each
//   finished (Finish after all steps_per_round steps were accepted and
//   answered) or ended. BeginUpdate() then hands over the finished members'
//   rewards and episode ends in session order, and EndUpdate() counts their
//   episodes (the running reward of rl/returns.h, members in session order,
//   episodes in time order), stops training if it is solved, out of
//   episodes or the update failed, and starts the next round or tells the
//   finished members to stop.
// - Deadlines. A member the round waits for (playing, or told to stop and
//   not yet gone) that has sent nothing since observer_timeout ago is
//   dropped by the first Tick() at or after that deadline: its steps of the
//   round are discarded and the round goes on without it. Joiners and
//   members waiting for the update are never dropped. NextDeadline() is the
//   earliest time at which Tick() has something to do.
// - Stop() (or an EndUpdate that stops) tells waiting joiners to stop;
//   members playing finish the round and their finish replies say stop;
//   later joins are answered with stop at once. It logs once.
// - Bad input changes nothing: Act() and Finish() check, in this order, the
//   session, the member's state, round and step (FAILED_PRECONDITION), then
//   the values (INVALID_ARGUMENT), naming the observer.
// - Every time comes from Options::now, read once per call.
// - Effects: what a call decided that the caller carries out afterwards,
//   outside its lock: replies by session, sessions that ended, log lines in
//   the order they happened, and whether a round started or ended. The
//   replies of a call are in session order.
//
// Thread-safety: not safe for concurrent use (thread-compatible): the caller
// serializes calls (ReinforceAgent holds it under its mutex). No call
// blocks or runs a callback.
#ifndef BATON_RL_ROUNDS_H_
#define BATON_RL_ROUNDS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "rl/protocol.h"
#include "rl/returns.h"

namespace baton::rl {

class Rounds {
 public:
  struct Options {
    int64_t steps_per_round = 500;
    int64_t observation_size = 4;  // values per observation
    int min_observers = 1;
    absl::Duration first_round_wait = absl::Seconds(60);
    absl::Duration observer_timeout = absl::Seconds(5);
    double solve_threshold = 475.0;
    int64_t max_episodes = 0;  // 0: no limit
    // Where time is read (waits, observer timeouts, statistics). Null: the
    // real clock. Otherwise it outlives the rounds (base/clock.h).
    const Clock* clock = nullptr;
  };

  struct Effects {
    std::vector<std::pair<int64_t, absl::StatusOr<JoinReply>>> join_replies;
    std::vector<std::pair<int64_t, absl::StatusOr<RoundReply>>> finish_replies;
    std::vector<int64_t> gone;  // sessions that left or were dropped
    std::vector<std::string> log;
    bool round_started = false;
    bool round_ended = false;  // BeginUpdate(), update, EndUpdate()
  };

  // One finished member's round, for the update.
  struct Played {
    int64_t session = 0;
    std::vector<float> rewards;
    std::vector<int32_t> episode_ends;
  };

  // What EndUpdate() counted.
  struct RoundEnd {
    int64_t round = 0;     // the round that ended
    int64_t members = 0;   // whose steps went into the update
    int64_t episodes = 0;  // counted so far
    double running_reward = 0;
    double seconds = 0;   // since the first round began
    int64_t steps = 0;    // counted so far, all members and rounds
    int64_t alive = 0;    // sessions alive after it
    int64_t dropped = 0;  // so far
    int64_t solved_at = -1;
  };

  struct Stats {
    int64_t rounds = 0;  // ended
    int64_t episodes = 0;
    double running_reward = RunningReward::kStart;
    int64_t solved_at = -1;    // the episode at which it was solved
    double solved_reward = 0;  // the running reward then (the round's later episodes move it)
    int64_t steps = 0;
    int64_t joined = 0;
    int64_t dropped = 0;
    int64_t left = 0;
    int64_t alive = 0;   // sessions not ended
    double seconds = 0;  // since the first round began
    std::vector<std::pair<int64_t, int64_t>> episodes_by_session;
  };

  enum class Phase {
    kIdle,      // no round runs
    kPlaying,   // a round runs
    kUpdating,  // the round ended; EndUpdate() has not run yet
  };

  // INVALID_ARGUMENT unless steps_per_round >= 1, observation_size >= 0,
  // min_observers >= 1, observer_timeout > 0, max_episodes >= 0 and `now`
  // is set. (A first_round_wait <= 0 starts the first round at the first
  // Tick.)
  static absl::StatusOr<std::unique_ptr<Rounds>> Create(Options options);

  // A new session for `observer`; its join reply comes in `out` (now, or
  // from the call that starts its round or stops training).
  int64_t Join(const std::string& observer, Effects* out);

  // Accepts `step` of `round` from `session`: it must be the member's next
  // step of the round it plays, and `observation` observation_size finite
  // values.
  absl::Status Act(int64_t session, int64_t round, int64_t step,
                   const std::vector<float>& observation);
  // The action of one accepted step of `round` was recorded. Ignored for a
  // session that ended or plays another round.
  void Answered(int64_t session, int64_t round);

  // `session` played every step of `round`: `rewards` has steps_per_round
  // finite values and `episode_ends` the steps on which an episode ended
  // (rl/returns.h). Its reply comes from EndUpdate() (or its end).
  absl::Status Finish(int64_t session, int64_t round, std::vector<float> rewards,
                      std::vector<int32_t> episode_ends, Effects* out);

  absl::Status Leave(int64_t session, Effects* out);

  // Stops training with `reason` in the log; later calls do nothing.
  void Stop(const std::string& reason, Effects* out);

  // Drops the members past their deadline and starts the first round when
  // its wait is over, as of now.
  void Tick(Effects* out);
  // When Tick() has something to do next; InfiniteFuture() if nothing.
  absl::Time NextDeadline() const;

  // REQUIRES: phase() == kUpdating. The finished members' rounds, in
  // session order, for the update. Call once per ended round.
  std::vector<Played> BeginUpdate();
  // REQUIRES: BeginUpdate() was called for this round. `update` is the
  // update's outcome (an error stops training).
  RoundEnd EndUpdate(const absl::Status& update, Effects* out);

  Phase phase() const { return phase_; }
  // The round that runs, or the next one.
  int64_t round() const { return round_; }
  bool stopped() const { return stopped_; }
  // Members playing the current round (0 unless phase() == kPlaying).
  int64_t playing() const;
  int64_t alive() const { return static_cast<int64_t>(members_.size()); }
  Stats stats() const;

 private:
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
    int64_t next_step = 0;  // steps accepted this round
    int64_t answered = 0;   // steps whose action was recorded
    absl::Time last_seen;
    std::vector<float> rewards;
    std::vector<int32_t> ends;

    std::string Who() const;
  };

  explicit Rounds(Options options)
      : options_(std::move(options)),
        clock_(options_.clock != nullptr ? options_.clock : &real_clock_) {}

  absl::StatusOr<Member*> Find(int64_t session, const char* what);
  std::string Describe(const Member& m) const;
  int64_t Count(State state) const;
  bool Awaited(const Member& m) const;
  void StartRound(absl::Time now, Effects* out);
  void MaybeEndRound(Effects* out);
  void Remove(int64_t session, const std::string& why, Effects* out);
  void StopAt(const std::string& reason, absl::Time now, Effects* out);

  const Options options_;
  const RealClock real_clock_;
  const Clock* const clock_;             // options_.clock or real_clock_
  std::map<int64_t, Member> members_;    // alive, by session
  std::map<int64_t, std::string> gone_;  // ended sessions: why
  std::map<int64_t, int64_t> episodes_by_session_;
  std::vector<Played> updating_;  // BeginUpdate() to EndUpdate()
  Phase phase_ = Phase::kIdle;
  int64_t round_ = 0;
  int64_t rounds_done_ = 0;
  int64_t next_session_ = 1;
  bool started_ = false;
  bool stopped_ = false;
  RunningReward running_;
  int64_t solved_at_ = -1;
  double solved_reward_ = 0;
  int64_t steps_ = 0;
  int64_t joined_ = 0;
  int64_t dropped_ = 0;
  int64_t left_ = 0;
  absl::Time first_round_start_;
  absl::Time first_round_at_ = absl::InfiniteFuture();  // the first round's wait ends
};

}  // namespace baton::rl

#endif  // BATON_RL_ROUNDS_H_
