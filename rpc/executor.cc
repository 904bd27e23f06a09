#include "rpc/executor.h"

#include <sched.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"

namespace baton::rpc {

// Everything a pool thread touches. Threads hold it by shared_ptr, so a
// thread that Join() detached (its task outlived the timeout) finishes
// against this state even after the Executor is destroyed.
struct Executor::State : std::enable_shared_from_this<State> {
  State(int max_threads, int parallelism, absl::Duration starvation_interval)
      : max_threads(max_threads),
        parallelism(parallelism),
        starvation_interval(starvation_interval) {}

  const int max_threads;
  const int parallelism;
  const absl::Duration starvation_interval;

  mutable absl::Mutex mu;
  absl::CondVar work;  // idle workers wait here
  std::deque<absl::AnyInvocable<void()>> queue ABSL_GUARDED_BY(mu);
  std::vector<std::thread> threads ABSL_GUARDED_BY(mu);  // workers
  std::vector<std::thread::id> thread_ids ABSL_GUARDED_BY(mu);
  std::thread monitor ABSL_GUARDED_BY(mu);
  int idle ABSL_GUARDED_BY(mu) = 0;
  int starting ABSL_GUARDED_BY(mu) = 0;  // started, not yet in their loop
  int running ABSL_GUARDED_BY(mu) = 0;   // tasks started and not finished
  int blocked ABSL_GUARDED_BY(mu) = 0;   // of those, inside a BlockingScope
  int exited ABSL_GUARDED_BY(mu) = 0;
  int extra ABSL_GUARDED_BY(mu) = 0;  // E3's allowance above parallelism
  uint64_t started ABSL_GUARDED_BY(mu) = 0;
  bool closed ABSL_GUARDED_BY(mu) = false;
  bool joined ABSL_GUARDED_BY(mu) = false;
  // E4: at most one idle worker spins for the next task before sleeping;
  // it watches `dispatches`, which every DispatchLocked bumps.
  int spinning ABSL_GUARDED_BY(mu) = 0;
  int64_t sleeps ABSL_GUARDED_BY(mu) = 0;   // idle workers that went to sleep
  int64_t spin_ns ABSL_GUARDED_BY(mu) = 0;  // adapts within [kMinSpin, max_spin]
  absl::Duration max_spin;
  std::atomic<uint64_t> dispatches{0};

  // How many queued tasks may start now (E1-E3; all of them once closed).
  int StartableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int queued = static_cast<int>(queue.size());
    if (closed) return queued;
    const int slots = parallelism + extra - (running - blocked);
    return std::max(0, std::min(queued, slots));
  }

  // Makes sure a thread will take the next task that may start: wakes an
  // idle one, or starts one. A woken thread counts as idle until it takes
  // its task, so two quick events must not both count on it.
  void DispatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    dispatches.fetch_add(1, std::memory_order_release);
    const int startable = StartableLocked();
    if (startable == 0) return;
    if (startable <= spinning) return;  // E4: the spinning worker takes it
    if (startable > idle + starting && static_cast<int>(threads.size()) < max_threads && !joined) {
      StartThreadLocked();
    } else {
      work.Signal();
    }
  }

  void SpinLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // E4: a task often follows the last one within microseconds (a caller's
    // next request after its reply): looking for it costs less than the
    // wake-up a sleep would need. The spin adapts like the same-host
    // transport's receiver: doubled when it found work, halved when not.
    constexpr int64_t kMinSpinNs = 2000;
    const int64_t max_ns = absl::ToInt64Nanoseconds(max_spin);
    if (spin_ns == 0) spin_ns = max_ns;
    ++spinning;
    const uint64_t seen = dispatches.load(std::memory_order_acquire);
    const absl::Time end = absl::Now() + absl::Nanoseconds(spin_ns);
    mu.Unlock();
    bool found = false;
    for (int rounds = 1;; ++rounds) {
      if (dispatches.load(std::memory_order_acquire) != seen) {
        found = true;
        break;
      }
      if (absl::Now() >= end) break;
      if (rounds % 8 == 0) sched_yield();
    }
    mu.Lock();
    --spinning;
    spin_ns = found ? std::min(max_ns, spin_ns * 2) : std::max(kMinSpinNs, spin_ns / 2);
    if (!found && StartableLocked() == 0 && !closed) {
      ++sleeps;
      work.Wait(&mu);
    }
  }

  void StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++starting;
    threads.emplace_back([self = shared_from_this()] { WorkerLoop(self); });
    thread_ids.push_back(threads.back().get_id());
  }
};

namespace {
// The pool (an Executor::State) whose thread this is, for its lifetime.
thread_local void* t_pool = nullptr;
}  // namespace

Executor::BlockingScope::BlockingScope() : state_(t_pool) {
  if (state_ == nullptr) return;
  State& s = *static_cast<State*>(state_);
  absl::MutexLock lock(&s.mu);
  ++s.blocked;
  s.DispatchLocked();  // E2: the next task may take this thread's place
}

Executor::BlockingScope::~BlockingScope() {
  if (state_ == nullptr) return;
  State& s = *static_cast<State*>(state_);
  absl::MutexLock lock(&s.mu);
  --s.blocked;
}

namespace {
int Parallelism(const Executor::Options& o) {
  if (o.parallelism > 0) return o.parallelism;
  return std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
}
}  // namespace

Executor::Executor(Options options)
    : parallelism_(Parallelism(options)),
      state_(std::make_shared<State>(std::max(1, options.max_threads), parallelism_,
                                     options.starvation_interval)) {
  absl::MutexLock lock(&state_->mu);
  state_->max_spin = options.spin;
  const int n = std::max(1, std::min(options.min_threads, state_->max_threads));
  for (int i = 0; i < n; ++i) state_->StartThreadLocked();
  state_->monitor = std::thread([s = state_] { MonitorLoop(s); });
}

Executor::~Executor() {
  Close();
  (void)Join(absl::Seconds(10));
}

bool Executor::Submit(absl::AnyInvocable<void()> task) {
  absl::MutexLock lock(&state_->mu);
  if (state_->closed) return false;
  state_->queue.push_back(std::move(task));
  state_->DispatchLocked();
  return true;
}

void Executor::WorkerLoop(std::shared_ptr<State> state) {
  State& s = *state;
  t_pool = &s;
  absl::MutexLock lock(&s.mu);
  --s.starting;
  while (true) {
    while (s.StartableLocked() == 0 && !(s.closed && s.queue.empty())) {
      ++s.idle;
      if (s.spinning == 0 && s.max_spin > absl::ZeroDuration() && !s.closed) {
        s.SpinLocked();
      } else {
        ++s.sleeps;
        s.work.Wait(&s.mu);
      }
      --s.idle;
    }
    if (s.queue.empty()) {  // closed and drained
      ++s.exited;
      t_pool = nullptr;
      return;
    }
    absl::AnyInvocable<void()> task = std::move(s.queue.front());
    s.queue.pop_front();
    ++s.running;
    ++s.started;
    // More may start (after Close(), all of them): another thread takes the
    // next.
    if (!s.queue.empty()) s.DispatchLocked();
    s.mu.Unlock();
    task();
    task = nullptr;  // destroy captures outside the lock
    s.mu.Lock();
    --s.running;
  }
}

void Executor::MonitorLoop(std::shared_ptr<State> state) {
  State& s = *state;
  absl::MutexLock lock(&s.mu);
  auto pending = [&s]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return s.closed || !s.queue.empty(); };
  while (true) {
    s.mu.Await(absl::Condition(&pending));
    if (s.closed) return;
    const uint64_t before = s.started;
    auto moved = [&s, before]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      return s.closed || s.queue.empty() || s.started != before;
    };
    s.mu.AwaitWithTimeout(absl::Condition(&moved), s.starvation_interval);
    if (s.closed) return;
    if (s.queue.empty()) {
      s.extra = 0;
      // Nothing waits: sleep until something is queued (above).
      continue;
    }
    if (s.started != before) {
      if (s.extra > 0) --s.extra;  // progress again: give the allowance back
      // Wait for the rest of the interval before looking again.
      auto closed = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return s.closed; };
      s.mu.AwaitWithTimeout(absl::Condition(&closed), s.starvation_interval);
      continue;
    }
    // E3: tasks wait and none started for a whole interval.
    if (s.running - s.blocked + s.extra < s.max_threads) ++s.extra;
    s.DispatchLocked();
  }
}

void Executor::Close() {
  absl::MutexLock lock(&state_->mu);
  state_->closed = true;
  state_->work.SignalAll();
  // What is queued now runs without the parallelism limit.
  state_->DispatchLocked();
}

bool Executor::InPool() const {
  absl::MutexLock lock(&state_->mu);
  return std::find(state_->thread_ids.begin(), state_->thread_ids.end(),
                   std::this_thread::get_id()) != state_->thread_ids.end();
}

absl::Status Executor::Join(absl::Duration timeout) {
  if (InPool()) {
    return absl::FailedPreconditionError("Executor::Join called from one of its own threads");
  }
  std::vector<std::thread> threads;
  std::thread monitor;
  int stuck = 0;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->joined) return absl::OkStatus();
    // Threads may still start while the queue drains (a task that blocks
    // lends its place, E2); none starts once `joined` is set.
    auto all_exited = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
      return state_->exited == static_cast<int>(state_->threads.size());
    };
    state_->mu.AwaitWithDeadline(absl::Condition(&all_exited), absl::Now() + timeout);
    state_->joined = true;
    const int started = static_cast<int>(state_->threads.size());
    threads.swap(state_->threads);
    monitor.swap(state_->monitor);
    stuck = started - state_->exited;
  }
  if (stuck > 0) {
    // They hold the shared state; nothing of this object is touched again.
    for (auto& t : threads) t.detach();
    if (monitor.joinable()) monitor.detach();
    return absl::DeadlineExceededError(absl::StrCat("executor: ", stuck,
                                                    " thread(s) still running a task after ",
                                                    absl::FormatDuration(timeout), "; detached"));
  }
  for (auto& t : threads) t.join();
  if (monitor.joinable()) monitor.join();
  return absl::OkStatus();
}

int Executor::num_threads() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int>(state_->threads.size());
}

int Executor::busy_threads() const {
  absl::MutexLock lock(&state_->mu);
  return state_->running;
}

int64_t Executor::sleeps() const {
  absl::MutexLock lock(&state_->mu);
  return state_->sleeps;
}

int Executor::blocked_threads() const {
  absl::MutexLock lock(&state_->mu);
  return state_->blocked;
}

}  // namespace baton::rpc
