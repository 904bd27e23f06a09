// Shared pieces of the soak job: flags, tags, the Accumulator remote object,
// the PS spec, failure classification and leak measurements (soak_common.h).
#include "tests/soak/soak_common.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "dist_autograd/dist_autograd.h"

namespace baton::soak {

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("flag '", arg, "': expected --name=value"));
    }
    const std::string name = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    int64_t* target = nullptr;
    if (name == "duration_s") target = &f.duration_s;
    if (name == "warm_s") target = &f.warm_s;
    if (name == "pace_ms") target = &f.pace_ms;
    if (name == "fd_slack") target = &f.fd_slack;
    if (name == "call_timeout_s") target = &f.call_timeout_s;
    if (target != nullptr) {
      if (!absl::SimpleAtoi(value, target) || *target < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, ": '", value, "' is not a non-negative integer"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return f;
}

absl::Status StartAgent(Worker& w, std::function<void(int peer)> on_death) {
  auto options = rpc::AgentOptions::FromEnv();
  if (!options.ok()) return options.status();
  options->timeouts.rpc = absl::Seconds(w.flags.call_timeout_s);
  options->timeouts.shutdown = absl::Seconds(30);
  auto agent = rpc::RpcAgent::Create(*options, w.registry);
  if (!agent.ok()) return agent.status();
  w.agent = *std::move(agent);
  w.rrefs->Attach(w.agent.get());
  w.agent->runtime().AddPeerFailureListener(
      [name = w.name, mortal = TrainerNames(w.env), everyone = AllNames(w.env),
       on_death = std::move(on_death)](const rpc::PeerFailure& f) {
        on_death(f.peer);
        Say(name, absl::StrCat("PEER_FAILURE peer=", f.peer, " incarnation=", f.incarnation,
                               " class=", ClassifyFailure(f.cause, mortal, everyone),
                               " msg=", f.cause.message()));
      });
  return absl::OkStatus();
}

void Say(const std::string& who, const std::string& text) {
  std::printf("[%s] %s @%lld\n", who.c_str(), text.c_str(),
              static_cast<long long>(absl::ToUnixMillis(absl::Now())));
  std::fflush(stdout);
}

at::Tensor TagTensor(const Tag& tag) { return at::tensor(at::ArrayRef<int64_t>(tag), at::kLong); }

absl::StatusOr<Tag> TagOf(const at::Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kLong || t.dim() != 1 || t.numel() != 4) {
    return absl::InvalidArgumentError("not a tag tensor (4 int64 values)");
  }
  at::Tensor c = t.contiguous();
  return Tag(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + 4);
}

std::string TagText(const Tag& tag) { return absl::StrCat("[", absl::StrJoin(tag, ","), "]"); }

std::string KeepKey(const Tag& tag) { return absl::StrJoin(tag, "/"); }

std::vector<int64_t> Accumulator::add(at::Tensor x) {
  absl::MutexLock lock(&mu_);
  sum_ += x.sum().item<double>();
  ++adds_;
  return {rank_, incarnation_, adds_};
}

void RegisterAccumulator(rref::RRefService& rrefs) {
  rref::RegisterClass<Accumulator>(rrefs, "soak.Accumulator")
      .Constructor<int64_t, int64_t>()
      .Method("add", &Accumulator::add);
}

ps::PsSpec MakeSpec(int num_trainers) {
  ps::PsSpec spec;
  spec.tables.push_back(
      ps::TableSpec::Dense("w", {64, 256}, at::kFloat, dist_optim::OptimizerOptions::SGD(0.01)));
  spec.tables.push_back(ps::TableSpec::Embedding("emb", 1000, 16, ps::RowInit::Uniform(0.1, 7),
                                                 ps::RowOptimizer::SGD(0.05)));
  spec.consistency = ps::Consistency::Async();
  spec.num_trainers = num_trainers;
  return spec;
}

std::string ClassifyFailure(const absl::Status& s, const std::vector<std::string>& mortal,
                            const std::vector<std::string>& everyone) {
  if (s.ok()) return "ok";
  const std::string code = absl::StatusCodeToString(s.code());
  const absl::string_view msg = s.message();
  auto names = [&](const std::string& w) {
    return absl::StrContains(msg, absl::StrCat("worker '", w, "'"));
  };
  // The worker the message names first (the outermost annotation).
  std::string named;
  size_t best = absl::string_view::npos;
  for (const auto& w : everyone) {
    const size_t at = msg.find(absl::StrCat("worker '", w, "'"));
    if (at < best) {
      best = at;
      named = w;
    }
  }
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
      for (const auto& w : mortal) {
        if (names(w)) return absl::StrCat("named/", code, "/", w);
      }
      break;
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kCancelled:
      if (!named.empty()) return absl::StrCat("named/", code, "/", named);
      break;
    default: break;
  }
  if (absl::StrContains(msg, "shut down") || absl::StrContains(msg, "shutting down")) {
    return absl::StrCat("shutdown/", code);
  }
  return absl::StrCat("UNEXPLAINED/", code);
}

std::string ReportFailure(const std::string& who, const std::string& op, const absl::Status& s,
                          const std::vector<std::string>& mortal,
                          const std::vector<std::string>& everyone) {
  std::string cls = ClassifyFailure(s, mortal, everyone);
  std::string msg(s.message());
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  Say(who, absl::StrCat("FAILURE op=", op, " class=", cls, " msg=", msg));
  return cls;
}

int64_t CountOpenFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int64_t n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

FdKinds OpenFdKinds() {
  FdKinds kinds;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return kinds;
  const int own = dirfd(d);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || std::atoi(e->d_name) == own) continue;
    char target[512];
    const ssize_t n =
        readlink(absl::StrCat("/proc/self/fd/", e->d_name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    std::string t(target, static_cast<size_t>(n));
    if (absl::StartsWith(t, "socket:")) t = "socket";
    if (absl::StartsWith(t, "pipe:")) t = "pipe";
    ++kinds[t];
  }
  closedir(d);
  return kinds;
}

std::string FdDiff(const FdKinds& before, const FdKinds& after) {
  std::vector<std::string> out;
  FdKinds all = before;
  for (const auto& [k, n] : after) all.emplace(k, 0);
  for (const auto& [k, unused] : all) {
    auto b = before.find(k);
    auto a = after.find(k);
    const int64_t d = (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
    if (d != 0) out.push_back(absl::StrCat(k, d > 0 ? "+" : "", d));
  }
  return out.empty() ? "none" : absl::StrJoin(out, " ");
}

LeakState LeakState::Measure(Worker& w, int64_t kept) {
  LeakState s;
  const rref::RRefDebugState r = w.rrefs->DebugState();
  s.rref_owned = static_cast<int64_t>(r.owned.size());
  s.rref_held = static_cast<int64_t>(r.held.size());
  s.rref_early = static_cast<int64_t>(r.early_entries);
  s.rref_unanswered = r.unanswered_messages;
  for (const auto& h : r.held) {
    s.held_ids.push_back(h.rref.worker);
    s.held_ids.push_back(static_cast<int64_t>(h.rref.local));
  }
  s.contexts = static_cast<int64_t>(dist_autograd::LiveContexts(*w.agent).size());
  const rpc::AgentStats st = w.agent->stats();
  s.pending_outgoing = st.pending_outgoing;
  s.running_incoming = st.running_incoming;
  s.shm_busy_segments = static_cast<int64_t>(st.shm_busy_segments);
  s.fds = CountOpenFds();
  s.kept = kept;
  return s;
}

std::vector<int64_t> LeakState::ToVector() const {
  std::vector<int64_t> v = {rref_owned,
                            rref_held,
                            rref_early,
                            rref_unanswered,
                            contexts,
                            pending_outgoing,
                            running_incoming,
                            shm_busy_segments,
                            fds,
                            kept};
  v.insert(v.end(), held_ids.begin(), held_ids.end());
  return v;
}

LeakState LeakState::FromVector(const std::vector<int64_t>& v) {
  LeakState s;
  if (v.size() < 10) return s;
  s.rref_owned = v[0];
  s.rref_held = v[1];
  s.rref_early = v[2];
  s.rref_unanswered = v[3];
  s.contexts = v[4];
  s.pending_outgoing = v[5];
  s.running_incoming = v[6];
  s.shm_busy_segments = v[7];
  s.fds = v[8];
  s.kept = v[9];
  s.held_ids.assign(v.begin() + 10, v.end());
  return s;
}

std::string LeakState::ToString() const {
  return absl::StrCat("rref_owned=", rref_owned, " rref_held=", rref_held,
                      " rref_early=", rref_early, " rref_unanswered=", rref_unanswered,
                      " contexts=", contexts, " pending_outgoing=", pending_outgoing,
                      " running_incoming=", running_incoming,
                      " shm_busy_segments=", shm_busy_segments, " fds=", fds, " kept=", kept);
}

std::vector<std::string> AllNames(const LaunchEnv& env) {
  std::vector<std::string> out = {kHub, kPs};
  for (const auto& t : TrainerNames(env)) out.push_back(t);
  return out;
}

std::vector<std::string> TrainerNames(const LaunchEnv& env) {
  std::vector<std::string> out;
  for (int i = 0; i < env.world_size - 2; ++i) out.push_back(absl::StrCat("trainer", i));
  return out;
}

rpc::CallOptions NestedTimeout(const Flags& f, const rpc::CallContext& ctx) {
  absl::Duration t = std::min(absl::Seconds(f.call_timeout_s), ctx.time_left());
  return rpc::CallOptions{std::max(t, absl::Milliseconds(1))};
}

}  // namespace baton::soak
