// The job's rendezvous with its store served by rank 0 (baton's built-in
// store) against the store on etcd (store/etcd_store.h), for issue 26's
// target: etcd within 2x of the built-in store.
//
//   bazel build //bench:rendezvous_bench
//   bazel-bin/bench/rendezvous_bench [--workers 64] [--rounds 3]
//
// Each round starts `workers` processes per store, alternating the stores.
// Every worker notes the monotonic clock (shared by the processes of one
// machine) when it calls RpcAgent::Create() and when Create() returns; the
// rendezvous time is from the last worker's call to the last return, so
// process start-up (LibTorch's load) is not counted, only the store's
// protocol: init rounds, registrations, every worker reading every other's,
// the init barrier. A real etcd is started for the run (Debian's
// etcd-server). Prints one JSON line per round and store, then the medians
// and the ratio of each round.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/worker_procs.h"
#include "rpc/agent.h"
#include "testing/etcd_server.h"
#include "testing/ports.h"

namespace baton {
namespace {

constexpr char kToken[] = "rendezvous-bench-token-0123456789";

int RunWorker(const bench::Flags& flags) {
  bench::WorkerChannel ch = bench::WorkerChannel::Open();
  auto options = rpc::AgentOptions::FromEnv("w");
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", options.status().ToString().c_str());
    return 1;
  }
  options->same_host_shm = false;  // the store's protocol alone
  options->init_timeout = absl::Seconds(120);
  if (flags.Str("store", "") == "etcd") {
    options->job_token = kToken;
    options->etcd.endpoint = flags.Str("etcd", "");
    options->etcd.prefix = flags.Str("prefix", "");
  }
  const double t0 = bench::Now();
  auto agent = rpc::RpcAgent::Create(*options, std::make_shared<rpc::FunctionRegistry>());
  const double t1 = bench::Now();
  if (!agent.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", options->rank, agent.status().ToString().c_str());
    return 1;
  }
  ch.Send(bench::Numbers({t0, t1}));
  if (!ch.WaitRelease()) return 1;
  return (*agent)->Shutdown().ok() ? 0 : 1;
}

// Starts `n` workers on `store`; the seconds from the last Create() call to
// the last return, or a negative value on failure.
double OneRound(const std::vector<std::string>& args, int n) {
  std::vector<bench::WorkerSpec> specs;
  for (int r = 0; r < n; ++r) specs.push_back({absl::StrCat("w", r), r});
  auto group = bench::WorkerGroup::Spawn(specs, args, baton::testing::FreePort());
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return -1;
  }
  double last_call = 0, last_return = 0;
  int reported = 0;
  absl::Status s =
      (*group)->Wait(absl::Minutes(5), absl::Seconds(30), [&](int, const std::string& line) {
        auto t = bench::ParseNumbers(line);
        if (t.size() != 2) return;
        last_call = std::max(last_call, t[0]);
        last_return = std::max(last_return, t[1]);
        if (++reported == n) (*group)->ReleaseAll();
      });
  if (!s.ok() || reported != n) {
    std::fprintf(stderr, "round failed: %s\n", s.ToString().c_str());
    return -1;
  }
  return last_return - last_call;
}

int Run(int argc, char** argv) {
  bench::Flags flags({"workers", "rounds", "store", "etcd", "prefix"}, {});
  if (!flags.Parse(bench::ForwardedArgs(argc, argv))) return 2;
  if (bench::WorkerIndex(argc, argv) >= 0) return RunWorker(flags);
  const int n = static_cast<int>(flags.Int("workers", 64));
  const int rounds = static_cast<int>(flags.Int("rounds", 3));
  auto etcd = baton::testing::EtcdServer::Start();
  if (!etcd.ok()) {
    std::fprintf(stderr, "%s\n", etcd.status().ToString().c_str());
    return 1;
  }
  std::vector<double> builtin, on_etcd, ratios;
  for (int round = 0; round < rounds; ++round) {
    const double b = OneRound({"--workers", absl::StrCat(n), "--store", "builtin"}, n);
    const double e =
        OneRound({"--workers", absl::StrCat(n), "--store", "etcd", "--etcd", (*etcd)->endpoint(),
                  "--prefix", absl::StrCat("/bench/rendezvous/", round, "/")},
                 n);
    if (b < 0 || e < 0) return 1;
    builtin.push_back(b);
    on_etcd.push_back(e);
    ratios.push_back(e / b);
    for (const auto& [store, v] : {std::pair<const char*, double>{"builtin", b}, {"etcd", e}}) {
      bench::JsonLine()
          .Add("system", "baton")
          .Add("metric", absl::StrCat("rendezvous_", n, "_workers_", store))
          .Add("round", round)
          .Add("value", v)
          .Add("unit", "s")
          .Print();
    }
  }
  bench::JsonLine()
      .Add("system", "baton")
      .Add("metric", absl::StrCat("rendezvous_", n, "_workers_etcd_over_builtin"))
      .Add("value", bench::Median(ratios))
      .Add("ratios", bench::Numbers(ratios))
      .Add("builtin_median_s", bench::Median(builtin))
      .Add("etcd_median_s", bench::Median(on_etcd))
      .Add("target", "<= 2")
      .Print();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Run(argc, argv); }
