// One call to every other worker of a job: a group call through a tree
// (group/group.h) against baton's own flat loop of rpc_async, for issue
// 48's target (the tree at least 3x faster than the loop at 256 workers).
//
//   bazel build //bench:group_bench
//   bazel-bin/bench/group_bench [--workers 64] [--rounds 3] [--calls 30] [--fanout 8]
//
// Each round starts `workers` processes on this host over the network
// transport (gRPC streams, no shared memory: what a job across hosts
// uses). Rank 0 calls a no-op that takes and returns an int64 on all the
// others, `calls` times each way, alternating the loop and the tree (after
// warm-up calls of each), and reports the median of each; the loop waits
// for every future, as the tree's caller does for every member. Prints one
// JSON line per round and way, then the medians and the loop/tree ratio.
// Each line also has the caller's CPU per call (rank 0's process, every
// thread): on hosts where every worker has a core of its own, the loop's
// call cannot take less than that, and the tree's caller only sends and
// receives `fanout` messages, whose CPU is what the tree saves.
#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/worker_procs.h"
#include "group/group.h"
#include "rpc/agent.h"
#include "testing/ports.h"

namespace baton {
namespace {

const rpc::Function<int64_t(int64_t)> kNoop("group_bench.noop");

// The time of one call to every member, the loop's way: one rpc_async per
// member, then every future waited for.
double FlatCall(rpc::RpcAgent& agent, const std::vector<rpc::WorkerInfo>& members) {
  const double t0 = bench::Now();
  std::vector<rpc::Future<int64_t>> futures;
  futures.reserve(members.size());
  for (const auto& m : members) futures.push_back(agent.rpc_async(m.id, kNoop, int64_t{m.id}));
  for (auto& f : futures) {
    if (!f.status().ok()) return -1;
  }
  return bench::Now() - t0;
}

double TreeCall(const group::Group& g) {
  const double t0 = bench::Now();
  group::GroupResult<int64_t> r = g.call(kNoop, int64_t{1}).value();
  return r.ok() ? bench::Now() - t0 : -1;
}

int RunWorker(const bench::Flags& flags) {
  bench::WorkerChannel ch = bench::WorkerChannel::Open();
  auto options = rpc::AgentOptions::FromEnv("w");
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", options.status().ToString().c_str());
    return 1;
  }
  options->transport.same_host_shm = false;
  options->transport.local_transport = rpc::AgentOptions::LocalTransport::kNetwork;
  options->timeouts.init = absl::Seconds(300);
  options->timeouts.shutdown = absl::Seconds(120);
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  if (!registry->Register(kNoop, [](int64_t x) { return x; }).ok() ||
      !group::Install(*registry).ok()) {
    return 1;
  }
  auto agent = rpc::RpcAgent::Create(*options, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", options->rank, agent.status().ToString().c_str());
    return 1;
  }
  if (options->rank == 0) {
    std::vector<rpc::WorkerRef> others;
    for (const auto& w : (*agent)->workers()) {
      if (w.id != 0) others.emplace_back(w.id);
    }
    group::GroupOptions go;
    go.fanout = static_cast<int>(flags.Int("fanout", 8));
    auto g = group::Group::Of(**agent, others, go);
    if (!g.ok()) return 1;
    const int calls = static_cast<int>(flags.Int("calls", 30));
    for (int i = 0; i < 3; ++i) {
      if (FlatCall(**agent, g->members()) < 0 || TreeCall(*g) < 0) return 1;
    }
    std::vector<double> flat, tree;
    double flat_cpu = 0, tree_cpu = 0;
    for (int i = 0; i < calls; ++i) {
      const double c0 = bench::ProcessCpuSeconds();
      flat.push_back(FlatCall(**agent, g->members()));
      const double c1 = bench::ProcessCpuSeconds();
      tree.push_back(TreeCall(*g));
      tree_cpu += bench::ProcessCpuSeconds() - c1;
      flat_cpu += c1 - c0;
      if (flat.back() < 0 || tree.back() < 0) return 1;
    }
    ch.Send(bench::Numbers({bench::Median(flat) * 1e3, bench::Median(tree) * 1e3,
                            flat_cpu / calls * 1e3, tree_cpu / calls * 1e3}));
  } else {
    ch.Send("ready");
  }
  if (!ch.WaitRelease()) return 1;
  return (*agent)->Shutdown().ok() ? 0 : 1;
}

// One round of `n` workers: the loop's and the tree's median, and the
// caller's CPU per call of each, in ms; empty if it failed.
std::vector<double> OneRound(const std::vector<std::string>& args, int n) {
  std::vector<bench::WorkerSpec> specs;
  for (int r = 0; r < n; ++r) specs.push_back({absl::StrCat("w", r), r});
  auto group = bench::WorkerGroup::Spawn(specs, args, baton::testing::FreePort());
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return {};
  }
  std::vector<double> out;
  absl::Status s =
      (*group)->Wait(absl::Minutes(10), absl::Seconds(60), [&](int w, const std::string& line) {
        if (w != 0) return;
        auto t = bench::ParseNumbers(line);
        if (t.size() != 4) return;
        out = t;
        (*group)->ReleaseAll();
      });
  if (!s.ok()) {
    std::fprintf(stderr, "round failed: %s\n", s.ToString().c_str());
    return {};
  }
  return out;
}

int Run(int argc, char** argv) {
  bench::Flags flags({"workers", "rounds", "calls", "fanout"}, {});
  if (!flags.Parse(bench::ForwardedArgs(argc, argv))) return 2;
  if (bench::WorkerIndex(argc, argv) >= 0) return RunWorker(flags);
  const int n = static_cast<int>(flags.Int("workers", 64));
  const int rounds = static_cast<int>(flags.Int("rounds", 3));
  const std::vector<std::string> args = {"--calls", absl::StrCat(flags.Int("calls", 30)),
                                         "--fanout", absl::StrCat(flags.Int("fanout", 8))};
  std::vector<double> flat, tree, ratios;
  for (int round = 0; round < rounds; ++round) {
    const std::vector<double> r = OneRound(args, n);
    if (r.size() != 4) return 1;
    const double f = r[0], t = r[1];
    flat.push_back(f);
    tree.push_back(t);
    ratios.push_back(f / t);
    for (const auto& [way, v, cpu] :
         {std::tuple<const char*, double, double>{"flat_loop", f, r[2]}, {"tree", t, r[3]}}) {
      bench::JsonLine()
          .Add("system", "baton")
          .Add("metric", absl::StrCat("group_call_", n, "_workers_", way))
          .Add("round", round)
          .Add("value", v)
          .Add("unit", "ms")
          .Add("caller_cpu_ms", cpu)
          .Add("note", absl::StrCat("median of ", flags.Int("calls", 30),
                                    " calls of a no-op to the ", n - 1, " other workers"))
          .Print();
    }
  }
  bench::JsonLine()
      .Add("system", "baton")
      .Add("metric", absl::StrCat("group_call_", n, "_workers_flat_over_tree"))
      .Add("value", bench::Median(ratios))
      .Add("ratios", bench::Numbers(ratios))
      .Add("flat_median_ms", bench::Median(flat))
      .Add("tree_median_ms", bench::Median(tree))
      .Add("fanout", flags.Int("fanout", 8))
      .Print();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) { return baton::Run(argc, argv); }
