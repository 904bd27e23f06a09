// A job for tests/group/supervision_test.sh, run by baton-run with roles
// boss:1 and member:M (--restart_policy member=worker), on one node or
// several (then boss0 supervises and the other bosses only serve). boss0
// supervises the members as a group (group/supervisor.h) and:
//   1. calls them all through the group;
//   2. calls member<victim> with a function that never returns: the
//      supervisor reports the call hung (SV2) and the handler asks
//      baton-run to restart that member (SV5, LR3);
//   3. calls the group until the victim's successor answers (a higher
//      incarnation), which the call that hung could not;
//   4. drops member<drop> (SV4, LR4) and calls the group without it;
//   5. shuts down with the others; baton-run must then exit 0 (a dropped
//      worker's end is no failure).
// Flags: --victim=K --drop=J (role ranks of members; defaults 0 and 1).
// Prints "[boss] RESULT OK" only if every step held.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/file_io.h"
#include "env/env.h"
#include "env/launcher_request.h"
#include "group/group.h"
#include "group/supervisor.h"
#include "rpc/agent.h"

namespace baton {
namespace {

// The member's role rank and incarnation, as "r/i".
const rpc::Function<std::string(int)> kWhoFn("who");
// Never returns (until the process is stopped).
const rpc::Function<int()> kHangFn("hang");

int Fail(const std::string& me, const absl::Status& s) {
  std::printf("[%s] FAILED: %s\n", me.c_str(), s.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

void Say(const std::string& me, const std::string& text) {
  std::printf("[%s] %s\n", me.c_str(), text.c_str());
  std::fflush(stdout);
}

// The members' answers to kWhoFn, by role rank: "r/incarnation".
absl::StatusOr<std::vector<std::string>> Who(const group::Supervisor& sup) {
  absl::StatusOr<group::Group> g = sup.group();
  if (!g.ok()) return g.status();
  group::GroupResult<std::string> r = g->call(kWhoFn, 0).value();
  if (!r.ok()) return r.status();
  return r.values();
}

// "r/incarnation" for each member, in role-rank order; `victim`'s
// incarnation is `victim_incarnation`, `drop` is left out (-1: none).
std::vector<std::string> Expected(int members, int victim, int victim_incarnation, int drop) {
  std::vector<std::string> out;
  for (int r = 0; r < members; ++r) {
    if (r == drop) continue;
    out.push_back(absl::StrCat(r, "/", r == victim ? victim_incarnation : 1));
  }
  return out;
}

int Boss(rpc::RpcAgent& agent, int members_count, int victim, int drop) {
  const std::string me = "boss";
  const std::string victim_name = absl::StrCat("member", victim);
  group::GroupOptions go;
  go.fanout = 2;
  go.timeout = absl::Seconds(30);
  auto members = group::Group::WithPrefix(agent, "member", go);
  if (!members.ok()) return Fail(me, members.status());
  absl::Mutex mu;
  std::vector<group::MemberFailure> events;
  absl::Notification hung;
  group::Supervisor* sup_ptr = nullptr;
  group::SupervisorOptions so;
  so.hung_after = absl::Seconds(1);
  auto sup = group::Supervisor::Watch(
      *members,
      [&](const group::MemberFailure& f) {
        Say(me, absl::StrCat("event ", group::KindName(f.kind), " ", f.member.name, " incarnation ",
                             f.incarnation, ": ", f.cause.message()));
        // The restart is for the call that hangs. Under load a group call
        // that answers later than hung_after is a hung event too (SV2); it
        // is logged and left alone.
        if (f.kind == group::MemberFailure::Kind::kHung && f.function == kHangFn.name()) {
          absl::Status s = sup_ptr->Restart(f, "its call hung");
          Say(me, absl::StrCat("asked for the restart of ", f.member.name, ": ", s.ToString()));
          if (!hung.HasBeenNotified()) hung.Notify();
        }
        absl::MutexLock lock(&mu);
        events.push_back(f);
      },
      so);
  if (!sup.ok()) return Fail(me, sup.status());
  sup_ptr = sup->get();

  // LR2, LR5: a request baton-run cannot read, and one about no worker of
  // the job, are logged and do nothing.
  if (const char* dir = std::getenv(kEnvLauncherRequests)) {
    if (absl::Status s = WriteFileAtomically(absl::StrCat(dir, "/0-junk.req"), {"action=reboot\n"});
        !s.ok()) {
      return Fail(me, s);
    }
    if (absl::Status s = SendLauncherRequest({LauncherRequest::Action::kRestart, 99, 0, "test"});
        !s.ok()) {
      return Fail(me, s);
    }
  }

  // 1. Every member answers, first incarnations.
  auto first = Who(**sup);
  if (!first.ok()) return Fail(me, first.status());
  Say(me, absl::StrCat("step 1: ", absl::StrJoin(*first, " ")));
  if (*first != Expected(members_count, victim, 1, -1)) {
    return Fail(me, absl::InternalError("step 1: unexpected answers"));
  }

  // 2. A call that hangs: heard of in about hung_after, long before its
  // 60-s deadline; the handler has member0 restarted.
  const absl::Time hang_start = absl::Now();
  rpc::CallOptions co;
  co.timeout = absl::Seconds(60);
  rpc::Future<int> hanging = agent.rpc_async(co, victim_name, kHangFn);
  if (!hung.WaitForNotificationWithTimeout(absl::Seconds(20))) {
    return Fail(me, absl::DeadlineExceededError("step 2: no hung event within 20 s"));
  }
  Say(me, absl::StrCat("step 2: hung call reported after ",
                       absl::FormatDuration(absl::Now() - hang_start)));

  // 3. The successor answers; the call that hung failed when its callee
  // was stopped.
  const absl::Time until = absl::Now() + absl::Seconds(90);
  std::vector<std::string> after;
  while (absl::Now() < until) {
    auto who = Who(**sup);
    if (who.ok() && *who != Expected(members_count, victim, 1, -1)) {
      after = *who;
      break;
    }
  }
  if (after.empty()) return Fail(me, absl::DeadlineExceededError("step 3: no successor"));
  Say(me, absl::StrCat("step 3: ", absl::StrJoin(after, " ")));
  if (after != Expected(members_count, victim, 2, -1)) {
    return Fail(me, absl::InternalError("step 3: unexpected answers"));
  }
  absl::StatusOr<int> hung_result = hanging.result();
  Say(me, absl::StrCat("step 3: the hung call ended: ", hung_result.status().ToString()));
  if (hung_result.ok()) return Fail(me, absl::InternalError("step 3: the hung call returned"));

  // 4. Drop a member: the group goes on without it, and baton-run stops
  // it (a direct call first opens the stream whose end tells this agent).
  const std::string drop_name = absl::StrCat("member", drop);
  absl::StatusOr<rpc::WorkerInfo> dropped_info = agent.worker(drop_name);
  if (!dropped_info.ok()) return Fail(me, dropped_info.status());
  absl::Notification dropped_died;
  agent.runtime().AddPeerFailureListener([&](const rpc::PeerFailure& f) {
    if (f.peer == dropped_info->id && !dropped_died.HasBeenNotified()) dropped_died.Notify();
  });
  if (absl::StatusOr<std::string> r = agent.rpc_async(dropped_info->id, kWhoFn, 0).result();
      !r.ok()) {
    return Fail(me, r.status());
  }
  if (absl::Status s = (*sup)->Drop(drop_name, "not needed any more"); !s.ok()) {
    return Fail(me, s);
  }
  auto dropped = Who(**sup);
  if (!dropped.ok()) return Fail(me, dropped.status());
  Say(me, absl::StrCat("step 4: ", absl::StrJoin(*dropped, " ")));
  if (*dropped != Expected(members_count, victim, 2, drop)) {
    return Fail(me, absl::InternalError("step 4: unexpected answers"));
  }
  if (!dropped_died.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    return Fail(me, absl::DeadlineExceededError("step 4: the dropped member never stopped"));
  }
  Say(me, "step 4: the dropped member stopped");
  (*sup)->Stop();
  {
    // SV2 reports each call that hangs, once: step 2's call to the victim's
    // first incarnation. Other calls may be hung events of their own under
    // load (a group call of step 3 that reached that incarnation before
    // baton-run stopped it, or any member slower than hung_after); they are
    // not the call that hangs.
    absl::MutexLock lock(&mu);
    int hung_events = 0;
    for (const auto& e : events) {
      if (e.kind != group::MemberFailure::Kind::kHung || e.function != kHangFn.name()) continue;
      ++hung_events;
      if (e.member.name != victim_name || e.incarnation != 1) {
        return Fail(me, absl::InternalError(absl::StrCat(
                            "step 2: a hung event about ", e.member.name, " incarnation ",
                            e.incarnation, ", expected only ", victim_name, " incarnation 1")));
      }
    }
    if (hung_events != 1) {
      return Fail(
          me, absl::InternalError(absl::StrCat(
                  "step 2: ", hung_events, " hung events of the call that hangs, expected one")));
    }
  }
  // 5. Shut down with the others; the dropped member is not waited for.
  if (absl::Status s = agent.Shutdown(); !s.ok()) return Fail(me, s);
  Say(me, "RESULT OK");
  return 0;
}

int Run(int victim, int drop) {
  auto env = ReadLaunchEnv();
  if (!env.ok()) return Fail("?", env.status());
  const std::string me = absl::StrCat(env->role, env->role_rank);
  Say(me, absl::StrCat("pid ", ::getpid(), " restart ", env->restart_count));
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  if (absl::Status s = group::Install(*registry); !s.ok()) return Fail(me, s);
  const int role_rank = env->role_rank;
  (void)registry->Register(kWhoFn, [role_rank](const rpc::CallContext& ctx, int) {
    return absl::StrCat(role_rank, "/", ctx.runtime->incarnation());
  });
  (void)registry->Register(kHangFn, [] {
    absl::Notification never;
    never.WaitForNotification();
    return 0;
  });
  auto options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return Fail(me, options.status());
  options->timeouts.shutdown = absl::Seconds(60);
  auto agent = rpc::RpcAgent::Create(*options, registry);
  if (!agent.ok()) return Fail(me, agent.status());
  if (env->role == "boss" && env->role_rank == 0) {
    const int bosses = env->role_world_size;
    return Boss(**agent, env->world_size - bosses, victim, drop);
  }
  // The others serve until everyone shuts down.
  absl::Status s = (*agent)->Shutdown();
  Say(me, absl::StrCat("shut down: ", s.ToString()));
  return s.ok() ? 0 : Fail(me, s);
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  int victim = 0;
  int drop = 1;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--victim=") && absl::SimpleAtoi(arg, &victim)) continue;
    if (absl::ConsumePrefix(&arg, "--drop=") && absl::SimpleAtoi(arg, &drop)) continue;
    std::fprintf(stderr, "usage: supervision_job [--victim=K] [--drop=J]\n");
    return 2;
  }
  return baton::Run(victim, drop);
}
