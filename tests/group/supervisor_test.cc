// Supervision (group/supervisor.h, SV1-SV5) over the loopback transport:
// real agents in one process, Kill() taking a member away. Restarts and
// drops carried out by baton-run are tests/group/supervision_test.sh's.
#include "group/supervisor.h"

#include <dirent.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/file_io.h"
#include "env/launcher_request.h"
#include "gtest/gtest.h"
#include "proto/group.pb.h"
#include "testing/eventually.h"
#include "testing/rpc/loopback_job.h"
#include "testing/rpc/loopback_transport.h"
#include "testing/temp_dir.h"

namespace baton::group {
namespace {

using rpc::Function;
using rpc::testing::Fate;
using rpc::testing::FrameInfo;
using rpc::testing::LoopbackJob;
using rpc::testing::LoopbackJobOptions;

// The member's rank.
const Function<int()> kRankFn("rank");
// Blocks on the rank given until the test releases it.
const Function<int(int)> kBlockOnFn("block_on");

struct Job {
  absl::Notification release;
  std::unique_ptr<LoopbackJob> job;

  explicit Job(int n) {
    LoopbackJobOptions o;
    o.world_size = n;
    o.rpc_timeout = absl::Seconds(20);
    o.shutdown_timeout = absl::Seconds(20);
    o.install = [this](int rank, rpc::FunctionRegistry& r) {
      ASSERT_TRUE(Install(r).ok());
      ASSERT_TRUE(r.Register(kRankFn, [rank] { return rank; }).ok());
      ASSERT_TRUE(r.Register(kBlockOnFn, [this, rank](int slow) {
                     if (rank == slow) release.WaitForNotification();
                     return rank;
                   }).ok());
    };
    auto started = LoopbackJob::Start(o);
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) job = *std::move(started);
  }
  ~Job() {
    if (!release.HasBeenNotified()) release.Notify();
    job.reset();
  }
};

// What a supervisor heard, for the test to wait on and read.
struct Events {
  absl::Mutex mu;
  std::vector<MemberFailure> heard ABSL_GUARDED_BY(mu);

  Supervisor::Handler Handler() {
    return [this](const MemberFailure& f) {
      absl::MutexLock lock(&mu);
      heard.push_back(f);
    };
  }
  size_t size() {
    absl::MutexLock lock(&mu);
    return heard.size();
  }
  MemberFailure at(size_t i) {
    absl::MutexLock lock(&mu);
    return heard.at(i);
  }
};

// A job of `n` workers whose worker `from` supervises `members` (one call
// first opens the streams a death is heard through).
struct Supervised {
  Job j;
  Events events;
  std::unique_ptr<Supervisor> sup;

  Supervised(int n, int from, const std::vector<rpc::WorkerRef>& members) : j(n) {
    if (j.job == nullptr) return;
    auto g = Group::Of(j.job->agent(from), members);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok() || !g->call(kRankFn).value().ok()) return;
    auto watched = Supervisor::Watch(*g, events.Handler());
    EXPECT_TRUE(watched.ok()) << watched.status();
    if (watched.ok()) sup = *std::move(watched);
  }
};

// The deaths a worker's agent reports (what a supervisor hears of, or not).
class AgentReports {
 public:
  explicit AgentReports(rpc::RpcAgent& agent) {
    agent.runtime().AddPeerFailureListener([this](const rpc::PeerFailure& failure) {
      absl::MutexLock lock(&mu_);
      reported_.push_back(failure.peer);
    });
  }
  // Waits (bounded) until the agent reported `peer` dead.
  bool Reported(int peer) {
    return baton::testing::Eventually([&] {
      absl::MutexLock lock(&mu_);
      return std::find(reported_.begin(), reported_.end(), peer) != reported_.end();
    });
  }

 private:
  absl::Mutex mu_;
  std::vector<int> reported_ ABSL_GUARDED_BY(mu_);
};

std::vector<int> Ranks(const Group& g) {
  std::vector<int> out;
  for (const rpc::WorkerInfo& m : g.members()) out.push_back(m.id);
  return out;
}

// SV1: a member's death is heard of without a call to it.
TEST(Supervisor, SV1_AMembersDeathIsHeardWithoutACall) {
  Job j(4);
  ASSERT_NE(j.job, nullptr);
  auto g = Group::Of(j.job->agent(0), {1, 2, 3});
  ASSERT_TRUE(g.ok());
  // One call opens the streams the agent hears a death through.
  ASSERT_TRUE(g->call(kRankFn).value().ok());
  Events events;
  auto sup = Supervisor::Watch(*g, events.Handler());
  ASSERT_TRUE(sup.ok()) << sup.status();
  ASSERT_TRUE(j.job->Kill(2).ok());
  ASSERT_TRUE(baton::testing::Eventually([&] { return events.size() == 1; }));
  const MemberFailure f = events.at(0);
  EXPECT_EQ(f.kind, MemberFailure::Kind::kDied);
  EXPECT_EQ(f.member.name, "w2");
  EXPECT_EQ(f.incarnation, 1);
  EXPECT_EQ(f.cause.code(), absl::StatusCode::kUnavailable);
}

// SV3: handlers run one at a time (two members die at once), and none runs
// for a member dropped before its death or once Stop() returned, although
// the agent reports both deaths.
TEST(Supervisor, SV3_HandlersRunOneAtATimeAndNeverAfterADropOrStop) {
  Job j(6);
  ASSERT_NE(j.job, nullptr);
  AgentReports agent(j.job->agent(0));
  auto g = Group::Of(j.job->agent(0), {1, 2, 3, 4, 5});
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(g->call(kRankFn).value().ok());
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  Events events;
  auto sup = Supervisor::Watch(*g, [&](const MemberFailure& f) {
    const int now = running.fetch_add(1) + 1;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    events.Handler()(f);
    running.fetch_sub(1);
  });
  ASSERT_TRUE(sup.ok());
  ASSERT_TRUE(j.job->Kill(1).ok());
  ASSERT_TRUE(j.job->Kill(2).ok());
  ASSERT_TRUE(baton::testing::Eventually([&] { return events.size() == 2; }));
  EXPECT_EQ(most.load(), 1);
  ASSERT_TRUE((*sup)->Drop(3).ok());
  ASSERT_TRUE(j.job->Kill(3).ok());
  ASSERT_TRUE(agent.Reported(3));
  (*sup)->Stop();
  ASSERT_TRUE(j.job->Kill(4).ok());
  ASSERT_TRUE(agent.Reported(4));
  EXPECT_EQ(events.size(), 2u);
}

// SV2: a call that hangs is heard of after hung_after, long before its own
// deadline, and only once however long it hangs: by the time a second hung
// call is heard of, the first (still waiting, scanned every 50 ms) has not
// been heard of again.
TEST(Supervisor, SV2_ACallToAMemberThatHangsIsHeardOfOnceBeforeItsDeadline) {
  Job j(3);
  ASSERT_NE(j.job, nullptr);
  auto g = Group::Of(j.job->agent(0), {1, 2});
  ASSERT_TRUE(g.ok());
  Events events;
  SupervisorOptions so;
  so.hung_after = absl::Milliseconds(200);
  auto sup = Supervisor::Watch(*g, events.Handler(), so);
  ASSERT_TRUE(sup.ok()) << sup.status();
  const absl::Time start = absl::Now();
  rpc::Future<int> first = j.job->agent(0).rpc_async(2, kBlockOnFn, 2);
  ASSERT_TRUE(baton::testing::Eventually([&] { return events.size() >= 1; }));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));  // the call's deadline: 20 s
  MemberFailure f = events.at(0);
  EXPECT_EQ(f.kind, MemberFailure::Kind::kHung);
  EXPECT_EQ(f.member.name, "w2");
  EXPECT_EQ(f.function, "block_on");
  EXPECT_EQ(f.incarnation, 1);
  EXPECT_EQ(f.cause.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(f.cause.message(), "has not answered 'block_on'")) << f.cause;
  rpc::Future<int> second = j.job->agent(0).rpc_async(2, kBlockOnFn, 2);
  ASSERT_TRUE(baton::testing::Eventually([&] { return events.size() >= 2; }));
  EXPECT_EQ(events.size(), 2u);
  // A call that is not to a member is nobody's hang.
  j.release.Notify();
  EXPECT_EQ(first.value(), 2);
  EXPECT_EQ(second.value(), 2);
  // The agent's own calls to members that answer are not hangs.
  EXPECT_EQ(j.job->agent(0).rpc_sync(1, kRankFn), 1);
  EXPECT_EQ(events.size(), 2u);
}

// SV2: a member that does not answer a call through group() is heard of
// as hung when its entry times out; the others answer. The forwarders that
// wait for it longer than hung_after are not hung.
TEST(Supervisor, SV2_AGroupEntryThatTimesOutIsHeardOfAsAHang) {
  Job j(4);
  ASSERT_NE(j.job, nullptr);
  GroupOptions go;
  go.fanout = 2;
  go.timeout = absl::Seconds(2);
  auto g = Group::Of(j.job->agent(0), {1, 2, 3}, go);
  ASSERT_TRUE(g.ok());
  Events events;
  SupervisorOptions so;
  // Long enough that w1 and w2, which answer at once, do so within it on a
  // loaded machine (a later answer would be a hang of its own).
  so.hung_after = absl::Milliseconds(500);
  auto sup = Supervisor::Watch(*g, events.Handler(), so);
  ASSERT_TRUE(sup.ok());
  auto current = (*sup)->group();
  ASSERT_TRUE(current.ok());
  GroupResult<int> r = current->call(kBlockOnFn, 3).value();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(*r.results[0], 1);
  EXPECT_EQ(*r.results[1], 2);
  EXPECT_EQ(r.results[2].status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(baton::testing::Eventually([&] { return events.size() == 1; }));
  MemberFailure f = events.at(0);
  EXPECT_EQ(f.kind, MemberFailure::Kind::kHung);
  EXPECT_EQ(f.member.name, "w3");
  EXPECT_EQ(f.function, "block_on");
  // The same group made without the supervisor reports nothing.
  r = g->call(kBlockOnFn, 3).value();
  EXPECT_FALSE(r.ok());
  j.release.Notify();
  EXPECT_EQ(g->call(kRankFn).value().values(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(events.size(), 1u);
}

// Members 1-9 of a job of 10, called from worker 0 through a tree of
// fanout 2: 0 sends to 1 and 6; 1 to 2 and 4; 2 to 3; 4 to 5; 6 to 7 and 9;
// 7 to 8. Its supervisor reports waits of 200 ms; the call's deadline is 3 s.
struct DeepTree {
  Job j{10};
  Events events;
  std::unique_ptr<Supervisor> sup;
  absl::StatusOr<Group> group = absl::UnknownError("not made");

  DeepTree() {
    if (j.job == nullptr) return;
    GroupOptions go;
    go.fanout = 2;
    go.timeout = absl::Seconds(3);
    auto g = Group::Of(j.job->agent(0), {1, 2, 3, 4, 5, 6, 7, 8, 9}, go);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return;
    SupervisorOptions so;
    so.hung_after = absl::Milliseconds(200);
    auto watched = Supervisor::Watch(*g, events.Handler(), so);
    EXPECT_TRUE(watched.ok()) << watched.status();
    if (!watched.ok()) return;
    sup = *std::move(watched);
    group = sup->group();
  }

  // No event beyond the first within a second: what the grace periods and
  // the call's end could still add has been delivered by then.
  bool NoSecondEvent() {
    return !baton::testing::Eventually([&] { return events.size() > 1; }, absl::Seconds(1));
  }
};

// SV2: a member whose function hangs three levels down the tree is heard of
// while the call still waits, by the report of its own hop; the forwarders
// above it, which wait for it, are not; its entry's timeout at the end is
// not heard of twice.
TEST(Supervisor, SV2_AMemberThatHangsDeepInTheTreeIsHeardOfBeforeTheCallsDeadline) {
  DeepTree t;
  ASSERT_TRUE(t.group.ok()) << t.group.status();
  Group* g = &*t.group;
  const absl::Time start = absl::Now();
  rpc::Future<GroupResult<int>> call = g->call(kBlockOnFn, 3);
  ASSERT_TRUE(baton::testing::Eventually([&] { return t.events.size() >= 1; }));
  EXPECT_FALSE(call.ready()) << "heard of only at the end, " << absl::Now() - start;
  MemberFailure f = t.events.at(0);
  EXPECT_EQ(f.kind, MemberFailure::Kind::kHung);
  EXPECT_EQ(f.member.name, "w3");
  EXPECT_EQ(f.function, "block_on");
  EXPECT_EQ(f.cause.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(
      absl::StrContains(f.cause.message(), "has run its part of a group call of 'block_on'"))
      << f.cause;
  GroupResult<int> r = call.value();
  for (int i = 0; i < 9; ++i) {
    if (i == 2) continue;
    EXPECT_EQ(*r.results[i], i + 1);
  }
  EXPECT_EQ(r.results[2].status().code(), absl::StatusCode::kDeadlineExceeded);
  // Once, and only w3: its forwarders (w1, w2) reported, so they are alive;
  // its entry's timeout is not a second event.
  EXPECT_TRUE(t.NoSecondEvent()) << t.events.at(1).cause;
}

// SV2: a member that has answered, but whose answer reaches its forwarder
// after the report moment (its forwarder reported it waiting), is alive: it
// is not heard of once its grace is over. Here w3's reply to w2 is 300 ms
// late, and w8 hangs, so that the call outlasts w3's grace.
TEST(Supervisor, SV2_AMemberWhoseAnswerArrivesAfterTheReportMomentIsNotHung) {
  DeepTree t;
  ASSERT_TRUE(t.group.ok()) << t.group.status();
  Group* g = &*t.group;
  t.j.job->network().SetRule([](const FrameInfo& info) {
    return !info.request && info.from == 3 && info.to == 2 && info.function == kForwardFn
               ? Fate::Delay(absl::Milliseconds(300))
               : Fate::Deliver();
  });
  rpc::Future<GroupResult<int>> call = g->call(kBlockOnFn, 8);
  ASSERT_TRUE(baton::testing::Eventually([&] { return t.events.size() >= 1; }));
  EXPECT_EQ(t.events.at(0).member.name, "w8");
  // w3's grace (250 ms from the moment) passes while w8 still hangs.
  EXPECT_TRUE(t.NoSecondEvent()) << t.events.at(1).cause;
  t.j.release.Notify();
  GroupResult<int> r = call.value();
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(t.events.size(), 1u);
  t.j.job->network().SetRule(nullptr);
}

// SV2: a member that never gets its request (its process stopped, its link
// cut) reports nothing of its own: its forwarder's report names it, and
// after a grace period it is heard of as hung; the forwarders above it are
// not.
TEST(Supervisor, SV2_AMemberThatCannotAnswerDeepInTheTreeIsHeardOfThroughItsForwarder) {
  DeepTree t;
  ASSERT_TRUE(t.group.ok()) << t.group.status();
  Group* g = &*t.group;
  t.j.job->network().SetRule([](const FrameInfo& info) {
    return info.request && info.to == 5 && info.function == kForwardFn ? Fate::Hold()
                                                                       : Fate::Deliver();
  });
  rpc::Future<GroupResult<int>> call = g->call(kRankFn);
  ASSERT_TRUE(baton::testing::Eventually([&] { return t.events.size() >= 1; }));
  EXPECT_FALSE(call.ready());
  MemberFailure f = t.events.at(0);
  EXPECT_EQ(f.kind, MemberFailure::Kind::kHung);
  EXPECT_EQ(f.member.name, "w5");
  EXPECT_EQ(f.function, "rank");
  EXPECT_TRUE(absl::StrContains(f.cause.message(), "to worker 'w4'")) << f.cause;
  EXPECT_TRUE(absl::StrContains(f.cause.message(), "sent no report of its own")) << f.cause;
  GroupResult<int> r = call.value();
  EXPECT_EQ(r.results[4].status().code(), absl::StatusCode::kDeadlineExceeded);
  for (int i : {0, 1, 2, 3, 5, 6, 7, 8}) EXPECT_EQ(*r.results[i], i + 1);
  EXPECT_TRUE(t.NoSecondEvent()) << t.events.at(1).cause;
  t.j.job->network().SetRule(nullptr);
  t.j.job->network().ReleaseHeld(/*reverse=*/false);
}

// A hang report that is garbage, about a worker the job does not have, or
// for no call in flight is refused or ignored: no crash, no event.
TEST(Supervisor, AHangReportForNoWatchedCallChangesNothing) {
  DeepTree t;
  ASSERT_TRUE(t.group.ok()) << t.group.status();
  rpc::Runtime& from = t.j.job->agent(4).runtime();
  auto send = [&](std::string bytes) {
    rpc::Payload p;
    p.bytes = std::move(bytes);
    return from.CallRaw(0, kHangReportFn, "", std::move(p)).status();
  };
  EXPECT_EQ(send("\xff\xff garbage").code(), absl::StatusCode::kDataLoss);
  proto::GroupHangReport r;
  r.set_watch_id(12345);
  r.set_member(99);
  r.set_kind(proto::GroupHangReport::OWN_RUNNING);
  absl::Status stranger = send(r.SerializeAsString());
  EXPECT_EQ(stranger.code(), absl::StatusCode::kInvalidArgument) << stranger;
  EXPECT_TRUE(absl::StrContains(stranger.message(), "worker 99")) << stranger;
  r.set_member(3);
  EXPECT_TRUE(send(r.SerializeAsString()).ok());
  // The group still works, and nothing was heard.
  EXPECT_EQ(t.group->call(kRankFn).value().values(), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(t.events.size(), 0u);
}

// SV4 and SV3: a dropped member leaves group() at once, its death is no
// event, and the others' graceful shutdown does not wait for it.
TEST(Supervisor, SV4_ADroppedMemberLeavesTheGroupAndNoShutdownWaitsForIt) {
  Supervised s(4, 0, {1, 2, 3});
  ASSERT_NE(s.sup, nullptr);
  Job& j = s.j;
  Supervisor* sup = s.sup.get();
  // Outside baton-run the drop still takes the member out.
  ASSERT_EQ(::getenv(kEnvLauncherRequests), nullptr);
  ASSERT_TRUE(sup->Drop(2, "not needed").ok());
  auto after = sup->group();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(Ranks(*after), (std::vector<int>{1, 3}));
  EXPECT_EQ(after->call(kRankFn).value().values(), (std::vector<int>{1, 3}));
  // Dropped twice, or a worker that never was a member: NOT_FOUND.
  EXPECT_EQ(sup->Drop(2).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sup->Restart(2).code(), absl::StatusCode::kNotFound);
  // baton-run would stop it now; its death is nobody's event.
  ASSERT_TRUE(j.job->Kill(2).ok());
  // The others shut down gracefully, together, without it.
  std::vector<absl::Status> shut(4);
  std::vector<std::thread> threads;
  for (int r : {0, 1, 3}) {
    threads.emplace_back([&, r] { shut[r] = j.job->agent(r).Shutdown(); });
  }
  for (auto& t : threads) t.join();
  for (int r : {0, 1, 3}) EXPECT_TRUE(shut[r].ok()) << "worker " << r << ": " << shut[r];
  EXPECT_EQ(s.events.size(), 0u);
}

// SV4/SV5 refusals, and SV5's requests as baton-run reads them (LR1): one
// file per restart asked, none for an incarnation already asked for.
TEST(Supervisor, SV5_ARestartIsARequestToBatonRunOncePerIncarnation) {
  Supervised s(5, 1, {0, 2, 3, 4});
  ASSERT_NE(s.sup, nullptr);
  Supervisor* sup = s.sup.get();
  absl::Status rank0 = sup->Drop(0);
  EXPECT_EQ(rank0.code(), absl::StatusCode::kFailedPrecondition) << rank0;
  EXPECT_TRUE(absl::StrContains(rank0.message(), "rank 0")) << rank0;
  absl::Status zero = sup->Restart(0);
  EXPECT_EQ(zero.code(), absl::StatusCode::kFailedPrecondition) << zero;
  absl::Status outside = sup->Restart(2);
  EXPECT_EQ(outside.code(), absl::StatusCode::kFailedPrecondition) << outside;
  EXPECT_TRUE(absl::StrContains(outside.message(), kEnvLauncherRequests)) << outside;

  const std::string dir = baton::testing::MakeTempDir("requests");
  ASSERT_EQ(::setenv(kEnvLauncherRequests, dir.c_str(), 1), 0);
  EXPECT_TRUE(sup->Restart(2, "hung\nfor good").ok());
  EXPECT_TRUE(sup->Restart(2).ok());  // the same incarnation: nothing more
  EXPECT_TRUE(sup->Restart("w3").ok());
  // An incarnation known dead is restarted by baton-run's policy: nothing
  // is asked (a request would stop its successor).
  AgentReports agent(s.j.job->agent(1));
  ASSERT_TRUE(s.j.job->Kill(4).ok());
  ASSERT_TRUE(agent.Reported(4));
  EXPECT_TRUE(sup->Restart("w4").ok());
  ::unsetenv(kEnvLauncherRequests);
  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (absl::EndsWith(e->d_name, kLauncherRequestSuffix) && e->d_name[0] != '.') {
        files.emplace_back(e->d_name);
      }
    }
    ::closedir(d);
  }
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 2u);
  std::vector<LauncherRequest> requests;
  for (const std::string& name : files) {
    auto text = ReadFile(absl::StrCat(dir, "/", name));
    ASSERT_TRUE(text.ok());
    auto request = DecodeLauncherRequest(*text);
    ASSERT_TRUE(request.ok()) << request.status();
    requests.push_back(*request);
  }
  std::sort(requests.begin(), requests.end(),
            [](const auto& a, const auto& b) { return a.rank < b.rank; });
  EXPECT_EQ(requests[0].action, LauncherRequest::Action::kRestart);
  EXPECT_EQ(requests[0].rank, 2);
  EXPECT_EQ(requests[0].from, 1);
  EXPECT_EQ(requests[0].reason, "hung for good");
  EXPECT_EQ(requests[1].rank, 3);
  // The members stay.
  auto current = sup->group();
  ASSERT_TRUE(current.ok());
  EXPECT_EQ(Ranks(*current), (std::vector<int>{0, 2, 3, 4}));
}

// SV2: only a member's own timeout is its hang, not one of a forwarder above
// it (GC2) or of a request that never left.
TEST(Supervisor, SV2_OnlyAMembersOwnTimeoutIsAHang) {
  EXPECT_TRUE(internal::MemberTimedOut(absl::DeadlineExceededError("worker 'w3': too slow")));
  EXPECT_FALSE(internal::MemberTimedOut(absl::UnavailableError("worker 'w3': dead")));
  EXPECT_FALSE(internal::MemberTimedOut(absl::DeadlineExceededError(
      absl::StrCat("worker 'w4': ", internal::kNoAnswerThrough, "worker 'w3' ..."))));
  EXPECT_FALSE(internal::MemberTimedOut(
      absl::DeadlineExceededError(absl::StrCat(internal::kNotSent, "the deadline passed"))));
}

TEST(Supervisor, ANegativeHungAfterIsRefused) {
  Job j(2);
  ASSERT_NE(j.job, nullptr);
  auto g = Group::Of(j.job->agent(0), {1});
  ASSERT_TRUE(g.ok());
  SupervisorOptions so;
  so.hung_after = absl::Seconds(-1);
  auto sup = Supervisor::Watch(
      *g, [](const MemberFailure&) {}, so);
  EXPECT_EQ(sup.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::group
