// The job's rendezvous with its store served by rank 0 (baton's built-in
// store) against the store on etcd (store/etcd_store.h), for issue 26's
// target: etcd within 2x of the built-in store.
//
//   bazel build //bench:rendezvous_bench
//   bazel-bin/bench/rendezvous_bench [--workers 64] [--rounds 3] [--builtin_only]
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
//
// Issue 48's idle footprint too: once its Create() returned, each worker,
// idle (no call made or served yet), reports its resident memory and its
// thread count (/proc/self/status), and how much of each Create() added
// (agent_rss, agent_threads: the rest is the process with LibTorch loaded);
// and how many requests it sent to the store during Create() (constant in
// the number of workers: rendezvous_store_requests) and the CPU time that
// Create() took in all its threads (rendezvous_cpu: on one host the workers
// share its cores, so the rendezvous takes at least the workers' CPU
// divided by the cores); per round and store, the median and the largest
// over the workers.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
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

// The first "<key> <n> ..." value in a /proc file; -1 where unreadable.
double ProcValue(const char* path, const char* format) {
  double out = -1;
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return out;
  char line[256];
  long v = 0;
  while (out < 0 && std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, format, &v) == 1) out = static_cast<double>(v);
  }
  std::fclose(f);
  return out;
}

// VmRSS and Threads of this process (/proc/self/status), and its PSS
// (/proc/self/smaps_rollup: shared pages, LibTorch's above all, divided
// among the processes that map them; what the machine's memory pays).
struct Usage {
  double rss_kib, pss_kib, threads;
};
Usage Footprint() {
  return {ProcValue("/proc/self/status", "VmRSS: %ld kB"),
          ProcValue("/proc/self/smaps_rollup", "Pss: %ld kB"),
          ProcValue("/proc/self/status", "Threads: %ld")};
}

int RunWorker(const bench::Flags& flags) {
  bench::WorkerChannel ch = bench::WorkerChannel::Open();
  auto options = rpc::AgentOptions::FromEnv("w");
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", options.status().ToString().c_str());
    return 1;
  }
  options->transport.same_host_shm = false;  // the store's protocol alone
  options->timeouts.init = absl::Seconds(120);
  if (flags.Str("store", "") == "etcd") {
    options->security.job_token = kToken;
    options->etcd.endpoint = flags.Str("etcd", "");
    options->etcd.prefix = flags.Str("prefix", "");
  }
  const Usage before = Footprint();
  const double cpu0 = bench::ProcessCpuSeconds() * 1e3;
  const double t0 = bench::Now();
  auto agent = rpc::RpcAgent::Create(*options, std::make_shared<rpc::FunctionRegistry>());
  const double t1 = bench::Now();
  if (!agent.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", options->rank, agent.status().ToString().c_str());
    return 1;
  }
  // Create() returns past the init barrier: every worker's process is up
  // by then, so the shared pages are divided among all of them.
  const Usage idle = Footprint();
  // What the rendezvous asked of the store: 0 on the rank that serves the
  // built-in store (it uses it in-process).
  const double requests = static_cast<double>((*agent)->runtime().store().RequestsSent());
  ch.Send(bench::Numbers({t0, t1, idle.rss_kib, idle.threads, before.rss_kib, before.threads,
                          idle.pss_kib, requests, bench::ProcessCpuSeconds() * 1e3 - cpu0}));
  if (!ch.WaitRelease()) return 1;
  if (absl::Status s = (*agent)->Shutdown(); !s.ok()) {
    std::fprintf(stderr, "rank %d: shutdown: %s\n", options->rank, s.ToString().c_str());
    return 1;
  }
  return 0;
}

struct Round {
  double seconds = -1;  // from the last Create() call to the last return; < 0: failed
  std::vector<double> rss_mib, threads;  // each idle worker's
  // What Create() added to each: the agent's own share (the rest is the
  // process with LibTorch loaded, before any agent).
  std::vector<double> agent_rss_mib, agent_threads;
  std::vector<double> pss_mib;         // each worker's share of the machine's memory
  std::vector<double> store_requests;  // each worker's, through its init
  std::vector<double> create_cpu_ms;   // the CPU each worker's Create() took
};

// Starts `n` workers on `store`.
Round OneRound(const std::vector<std::string>& args, int n) {
  Round out;
  std::vector<bench::WorkerSpec> specs;
  for (int r = 0; r < n; ++r) specs.push_back({absl::StrCat("w", r), r});
  auto group = bench::WorkerGroup::Spawn(specs, args, baton::testing::FreePort());
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return out;
  }
  double last_call = 0, last_return = 0;
  int reported = 0;
  absl::Status s =
      (*group)->Wait(absl::Minutes(5), absl::Seconds(30), [&](int, const std::string& line) {
        auto t = bench::ParseNumbers(line);
        if (t.size() != 9) return;
        last_call = std::max(last_call, t[0]);
        last_return = std::max(last_return, t[1]);
        out.rss_mib.push_back(t[2] / 1024);
        out.threads.push_back(t[3]);
        out.agent_rss_mib.push_back((t[2] - t[4]) / 1024);
        out.agent_threads.push_back(t[3] - t[5]);
        out.pss_mib.push_back(t[6] / 1024);
        out.store_requests.push_back(t[7]);
        out.create_cpu_ms.push_back(t[8]);
        if (++reported == n) (*group)->ReleaseAll();
      });
  if (!s.ok() || reported != n) {
    std::fprintf(stderr, "round failed: %s\n", s.ToString().c_str());
    return out;
  }
  out.seconds = last_return - last_call;
  return out;
}

void PrintFootprint(const Round& r, int n, const char* store, int round) {
  for (const auto& [what, values, unit] :
       {std::tuple<const char*, const std::vector<double>*, const char*>{"idle_worker_rss",
                                                                         &r.rss_mib, "MiB"},
        {"idle_worker_pss", &r.pss_mib, "MiB"},
        {"idle_worker_threads", &r.threads, "threads"},
        {"idle_worker_agent_rss", &r.agent_rss_mib, "MiB"},
        {"idle_worker_agent_threads", &r.agent_threads, "threads"},
        {"rendezvous_store_requests", &r.store_requests, "requests"},
        {"rendezvous_cpu", &r.create_cpu_ms, "ms"}}) {
    bench::JsonLine()
        .Add("system", "baton")
        .Add("metric", absl::StrCat(what, "_", n, "_workers_", store))
        .Add("round", round)
        .Add("value", bench::Median(*values))
        .Add("max", *std::max_element(values->begin(), values->end()))
        .Add("unit", unit)
        .Add("note",
             "median over the workers, once Create() returned, no call made (store requests "
             "and CPU: those of each Create())")
        .Print();
  }
}

void PrintRound(int n, const char* store, int round, double seconds) {
  bench::JsonLine()
      .Add("system", "baton")
      .Add("metric", absl::StrCat("rendezvous_", n, "_workers_", store))
      .Add("round", round)
      .Add("value", seconds)
      .Add("unit", "s")
      .Print();
}

int Run(int argc, char** argv) {
  bench::Flags flags({"workers", "rounds", "store", "etcd", "prefix"}, {"builtin_only"});
  if (!flags.Parse(bench::ForwardedArgs(argc, argv))) return 2;
  if (bench::WorkerIndex(argc, argv) >= 0) return RunWorker(flags);
  const int n = static_cast<int>(flags.Int("workers", 64));
  const int rounds = static_cast<int>(flags.Int("rounds", 3));
  const bool with_etcd = !flags.Bool("builtin_only");
  auto etcd = baton::testing::EtcdServer::Start();
  if (!etcd.ok()) {
    std::fprintf(stderr, "%s\n", etcd.status().ToString().c_str());
    return 1;
  }
  std::vector<double> builtin, on_etcd, ratios;
  for (int round = 0; round < rounds; ++round) {
    const Round built_in = OneRound({"--workers", absl::StrCat(n), "--store", "builtin"}, n);
    if (built_in.seconds < 0) return 1;
    PrintFootprint(built_in, n, "builtin", round);
    PrintRound(n, "builtin", round, built_in.seconds);
    builtin.push_back(built_in.seconds);
    if (!with_etcd) continue;
    const Round etcd_round =
        OneRound({"--workers", absl::StrCat(n), "--store", "etcd", "--etcd", (*etcd)->endpoint(),
                  "--prefix", absl::StrCat("/bench/rendezvous/", round, "/")},
                 n);
    if (etcd_round.seconds < 0) return 1;
    PrintFootprint(etcd_round, n, "etcd", round);
    PrintRound(n, "etcd", round, etcd_round.seconds);
    on_etcd.push_back(etcd_round.seconds);
    ratios.push_back(etcd_round.seconds / built_in.seconds);
  }
  if (!with_etcd) return 0;
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
