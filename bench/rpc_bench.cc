// baton's RPC benchmark: the same metrics, names and JSON lines as the peer
// script shared/peer/torch_rpc_bench.py, so both can be set side by side.
//
//   rpc_bench [--quick]
// Starts itself again as rank 1 (the server) on loopback; rank 0 drives.
// BATON_TRANSPORT=shm|grpc picks how the two talk (default: shm, the
// same-host transport; grpc: loopback gRPC, the path between hosts).
// First, the floors: shm_pingpong_floor_latency_p50 is a bare futex
// ping-pong between two processes over one shared page (each side sleeps on
// a futex until the other wakes it), no agent; shm_spin_floor_latency_p50
// is the same with both sides spinning (what two busy cores allow);
// tcp_echo_floor_<n>MB_bandwidth echoes n MiB over one TCP connection
// between two processes (blocking reads and writes, buffers reused), the
// floor of the network rows (issue: 16 MB echo over the bulk channel >= 70%
// of it); tcp_echo_floor_2conn_<n>MB_bandwidth the same cut in halves over
// two connections, one thread each (whether a second connection per peer
// pair would move more).
//
// Two "hosts" (bench/netns_bench.sh): BATON_BENCH_PEER_NETNS=<name> runs
// rank 1, and the floor's echoing end, in that network namespace
// (/var/run/netns/<name>, entered with setns(2) before anything else), at
// BATON_BENCH_PEER_ADDR; rank 0 stays where it was started (MASTER_ADDR is
// its address there).
//
// Profiling one row: BATON_BENCH_ECHO_ONLY=<MB>:<seconds> skips the floors
// and every other row and echoes <MB> MiB tensors for that long (for `perf
// record -a` around it), then reports that row alone.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

#include "dist_autograd/dist_autograd.h"
#include "dist_optim/distributed_optimizer.h"
#include "rpc/agent.h"
#include "rref/rref.h"

extern char** environ;

namespace {

using baton::rpc::AgentOptions;
using baton::rpc::Function;
using baton::rpc::FunctionRegistry;
using baton::rpc::Future;
using baton::rpc::RpcAgent;

const Function<void()> noop_fn("noop");
const Function<at::Tensor(at::Tensor)> echo_fn("echo");

// The peer's remote layer: x @ w with a 256x256 weight that requires grad.
class Linear {
 public:
  explicit Linear(int64_t n) : w_(at::randn({n, n}).requires_grad_(true)) {}
  at::Tensor forward(at::Tensor x) { return x.mm(w_); }
  const at::Tensor& weight() const { return w_; }

 private:
  at::Tensor w_;
};
using LinearRef = baton::rref::RRef<Linear>;
using ParamRefs = std::vector<baton::rref::RRef<at::Tensor>>;
const Function<at::Tensor(LinearRef, at::Tensor)> forward_fn("linear_forward");
const Function<ParamRefs(LinearRef)> params_fn("linear_params");

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Pct(std::vector<double> xs, double p) {
  std::sort(xs.begin(), xs.end());
  return xs[std::min(xs.size() - 1, static_cast<size_t>(p * xs.size()))];
}

const char* TransportName() {
  const char* t = std::getenv("BATON_TRANSPORT");
  return t != nullptr && std::strcmp(t, "grpc") == 0 ? "grpc" : "shm";
}

void Report(const std::string& metric, double value, const std::string& unit,
            const std::string& extra = "") {
  std::printf(
      "{\"system\": \"baton\", \"version\": \"0.1.0\", \"transport\": \"%s\", "
      "\"metric\": \"%s\", \"value\": %.3f, \"unit\": \"%s\"%s}\n",
      TransportName(), metric.c_str(), value, unit.c_str(), extra.c_str());
  std::fflush(stdout);
}

// The floor: two processes bounce a counter through one shared page; with
// `spin`, each side spins for the other's write, else it sleeps on a futex
// until woken. Runs before any thread exists (it forks).
void PingPongFloor(bool quick, bool spin) {
  struct alignas(64) Word {
    std::atomic<uint32_t> value;
    std::atomic<uint32_t> sleeping;
  };
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return;
  Word* words = new (mem) Word[2]();
  auto wait_for = [spin](Word& w, uint32_t want) {
    for (int i = 0; spin; ++i) {
      if (w.value.load(std::memory_order_acquire) == want) return;
      __builtin_ia32_pause();
    }
    while (true) {
      w.sleeping.store(1, std::memory_order_seq_cst);
      const uint32_t v = w.value.load(std::memory_order_seq_cst);
      if (v == want) break;
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.value), FUTEX_WAIT, v, nullptr, nullptr, 0);
    }
    w.sleeping.store(0, std::memory_order_relaxed);
  };
  auto post = [](Word& w, uint32_t v) {
    w.value.store(v, std::memory_order_seq_cst);
    if (w.sleeping.load(std::memory_order_seq_cst) != 0) {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.value), FUTEX_WAKE, 1, nullptr, nullptr, 0);
    }
  };
  const int n = quick ? 2000 : 20000;
  const pid_t child = fork();
  if (child == 0) {
    for (uint32_t i = 1; i <= static_cast<uint32_t>(n); ++i) {
      wait_for(words[0], i);
      post(words[1], i);
    }
    _exit(0);
  }
  std::vector<double> lat;
  lat.reserve(n);
  for (uint32_t i = 1; i <= static_cast<uint32_t>(n); ++i) {
    const double t0 = Now();
    post(words[0], i);
    wait_for(words[1], i);
    lat.push_back((Now() - t0) * 1e6);
  }
  int status = 0;
  waitpid(child, &status, 0);
  munmap(mem, 4096);
  Report(spin ? "shm_spin_floor_latency_p50" : "shm_pingpong_floor_latency_p50", Pct(lat, 0.5),
         "us",
         absl::StrCat(", \"n\": ", n, ", \"note\": \"two processes, one shared page, ",
                      spin ? "both spinning" : "futex wait and wake", "; no agent\""));
}

// Enters the peer's network namespace (BATON_BENCH_PEER_NETNS), if any.
bool EnterPeerNetns() {
  const char* ns = std::getenv("BATON_BENCH_PEER_NETNS");
  if (ns == nullptr || *ns == '\0') return true;
  const int fd = open(absl::StrCat("/var/run/netns/", ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    std::perror("setns");
    return false;
  }
  close(fd);
  return true;
}

// Reads or writes all n bytes (blocking), false on EOF or error.
bool Whole(int fd, char* p, size_t n, bool write_it) {
  while (n > 0) {
    const ssize_t r = write_it ? write(fd, p, n) : read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The network floor: `conns` TCP connections, a child echoing what each
// reads (in the peer's namespace, at its address, if set). With more than
// one, each echo is cut into `conns` equal slices, one per connection, each
// connection driven by its own thread on both ends, and an echo ends when
// every slice is back (what several connections per peer pair would give a
// transfer). Runs before the agent's threads exist (it forks; its own
// threads are joined before it returns).
void TcpEchoFloor(bool quick, int conns) {
  int ready[2];
  if (pipe(ready) != 0) return;
  const char* peer_addr = std::getenv("BATON_BENCH_PEER_ADDR");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (peer_addr != nullptr && *peer_addr != '\0') inet_pton(AF_INET, peer_addr, &addr.sin_addr);
  const size_t max = (size_t{64} << 20) / static_cast<size_t>(conns);
  const pid_t child = fork();
  if (child == 0) {
    socklen_t len = sizeof addr;
    const int listener = EnterPeerNetns() ? socket(AF_INET, SOCK_STREAM, 0) : -1;
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listener, conns) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      addr.sin_port = 0;
    }
    (void)!write(ready[1], &addr.sin_port, sizeof addr.sin_port);
    if (addr.sin_port == 0) _exit(1);
    std::vector<std::thread> echoes;
    for (int c = 0; c < conns; ++c) {
      const int fd = accept(listener, nullptr, nullptr);
      echoes.emplace_back([fd, max] {
        std::vector<char> buf(max);
        uint64_t n = 0;
        while (Whole(fd, reinterpret_cast<char*>(&n), 8, false) && n > 0 && n <= max &&
               Whole(fd, buf.data(), n, false) && Whole(fd, reinterpret_cast<char*>(&n), 8, true) &&
               Whole(fd, buf.data(), n, true)) {
        }
        close(fd);
      });
    }
    for (auto& t : echoes) t.join();
    _exit(0);
  }
  if (read(ready[0], &addr.sin_port, sizeof addr.sin_port) != sizeof addr.sin_port ||
      addr.sin_port == 0) {
    waitpid(child, nullptr, 0);
    return;
  }
  close(ready[0]);
  close(ready[1]);
  std::vector<int> fds;
  for (int c = 0; c < conns; ++c) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd);
      break;
    }
    fds.push_back(fd);
  }
  if (static_cast<int>(fds.size()) == conns) {
    std::vector<std::vector<char>> bufs(conns, std::vector<char>(max, 1));
    for (uint64_t mb : {1, 16, 64}) {
      const uint64_t slice = (mb << 20) / static_cast<uint64_t>(conns);
      const int reps = quick ? 5 : 20;
      // One echo: each connection's thread sends its slice and reads it
      // back; the echo ends when all have (one connection: no thread).
      auto one = [&](int c) {
        uint64_t n = slice;
        char* p = bufs[c].data();
        return Whole(fds[c], reinterpret_cast<char*>(&n), 8, true) &&
               Whole(fds[c], p, slice, true) &&
               Whole(fds[c], reinterpret_cast<char*>(&n), 8, false) &&
               Whole(fds[c], p, slice, false);
      };
      auto echo = [&] {
        if (conns == 1) return one(0);
        std::vector<std::thread> slices;
        std::atomic<bool> ok{true};
        for (int c = 0; c < conns; ++c) {
          slices.emplace_back([&, c] {
            if (!one(c)) ok = false;
          });
        }
        for (auto& t : slices) t.join();
        return ok.load();
      };
      bool ok = echo();
      const double t0 = Now();
      for (int i = 0; i < reps && ok; ++i) ok = echo();
      if (!ok) break;
      Report(absl::StrCat("tcp_echo_floor_", conns == 1 ? "" : absl::StrCat(conns, "conn_"), mb,
                          "MB_bandwidth"),
             2.0 * static_cast<double>(mb) * reps / 1024 / (Now() - t0), "GB/s",
             absl::StrCat(", \"note\": \"", conns, " TCP connection", conns == 1 ? "" : "s",
                          " between two processes, no agent\""));
    }
    const uint64_t zero = 0;
    for (int fd : fds) Whole(fd, const_cast<char*>(reinterpret_cast<const char*>(&zero)), 8, true);
  }
  for (int fd : fds) close(fd);
  int status = 0;
  waitpid(child, &status, 0);
}

// BATON_BENCH_ECHO_ONLY=<MB>:<seconds>, or {0, 0}.
std::pair<int, double> EchoOnly() {
  const char* v = std::getenv("BATON_BENCH_ECHO_ONLY");
  if (v == nullptr) return {0, 0};
  const std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(v, ':');
  int mb = 0;
  double seconds = 0;
  if (!absl::SimpleAtoi(parts.first, &mb) || !absl::SimpleAtod(parts.second, &seconds) || mb <= 0 ||
      seconds <= 0) {
    std::fprintf(stderr, "BATON_BENCH_ECHO_ONLY=%s: want <MB>:<seconds>, both positive\n", v);
    std::exit(2);
  }
  return {mb, seconds};
}

void Drive(RpcAgent& agent, bool quick) {
  const int n = quick ? 300 : 3000;
  const std::string peer = "w1";
  if (const auto [mb, seconds] = EchoOnly(); mb > 0) {
    const at::Tensor big = at::ones({static_cast<int64_t>(mb) * 1024 * 1024 / 4});
    agent.rpc_sync(peer, echo_fn, big);
    int reps = 0;
    const double b0 = Now();
    while (Now() - b0 < seconds) {
      agent.rpc_sync(peer, echo_fn, big);
      ++reps;
    }
    Report(absl::StrCat("rpc_sync_echo_", mb, "MB_bandwidth"),
           2.0 * mb * reps / 1024 / (Now() - b0), "GB/s", ", \"note\": \"echo only\"");
    return;
  }
  for (int i = 0; i < 100; ++i) agent.rpc_sync(peer, noop_fn);
  std::vector<double> lat;
  for (int i = 0; i < n; ++i) {
    const double t0 = Now();
    agent.rpc_sync(peer, noop_fn);
    lat.push_back(Now() - t0);
  }
  Report("rpc_sync_noop_latency_p50", Pct(lat, 0.5) * 1e6, "us");
  Report("rpc_sync_noop_latency_p99", Pct(lat, 0.99) * 1e6, "us");

  const at::Tensor small = at::ones({16});
  lat.clear();
  for (int i = 0; i < n; ++i) {
    const double t0 = Now();
    agent.rpc_sync(peer, echo_fn, small);
    lat.push_back(Now() - t0);
  }
  Report("rpc_sync_echo_64B_latency_p50", Pct(lat, 0.5) * 1e6, "us");

  const int total = quick ? 2000 : 20000;
  const size_t window = 64;
  std::deque<Future<at::Tensor>> futs;
  const double t0 = Now();
  for (int i = 0; i < total; ++i) {
    futs.push_back(agent.rpc_async(peer, echo_fn, small));
    if (futs.size() >= window) {
      futs.front().value();
      futs.pop_front();
    }
  }
  for (auto& f : futs) f.value();
  Report("rpc_async_echo_64B_throughput", total / (Now() - t0), "calls/s", ", \"window\": 64");

  for (int mb : {1, 16, 64}) {
    const at::Tensor big = at::ones({static_cast<int64_t>(mb) * 1024 * 1024 / 4});
    const int reps = quick ? 5 : 20;
    agent.rpc_sync(peer, echo_fn, big);
    const double b0 = Now();
    for (int i = 0; i < reps; ++i) agent.rpc_sync(peer, echo_fn, big);
    const double dt = Now() - b0;
    Report(absl::StrCat("rpc_sync_echo_", mb, "MB_bandwidth"), 2.0 * mb * reps / 1024 / dt, "GB/s",
           ", \"note\": \"bytes sent plus bytes returned\"");
  }

  // remote() then to_here(), as the peer does.
  lat.clear();
  for (int i = 0; i < n / 3; ++i) {
    const double t0 = Now();
    baton::rref::RRef<at::Tensor> r = baton::rref::remote(agent, peer, echo_fn, small);
    r.to_here();
    lat.push_back(Now() - t0);
  }
  Report("remote_to_here_latency_p50", Pct(lat, 0.5) * 1e6, "us");

  // Distributed autograd and the distributed optimizer over one remote
  // 256x256 layer, as the peer does: forward through an RPC, backward, SGD.
  namespace da = baton::dist_autograd;
  LinearRef m = baton::rref::remote<Linear>(agent, peer, int64_t{256});
  ParamRefs params = agent.rpc_sync(peer, params_fn, m);
  auto opt = baton::dist_optim::DistributedOptimizer::Create(
      agent, baton::dist_optim::OptimizerOptions::SGD(0.01), params);
  if (!opt.ok()) {
    std::fprintf(stderr, "%s\n", opt.status().ToString().c_str());
    std::exit(1);
  }
  const at::Tensor x = at::randn({64, 256});
  const int steps = quick ? 50 : 300;
  double s0 = 0;
  for (int i = 0; i < steps + 10; ++i) {
    if (i == 10) s0 = Now();
    da::Context ctx(agent);
    at::Tensor y = agent.rpc_sync(peer, forward_fn, m, x);
    absl::Status s = da::Backward(agent, ctx.id(), {y.sum()});
    if (s.ok()) s = (*opt)->Step(ctx.id());
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  Report("dist_autograd_step_remote_linear256", (Now() - s0) / steps * 1e6, "us/step");
}

int RunRank(int rank, bool quick) {
  at::set_num_threads(1);
  auto registry = std::make_shared<FunctionRegistry>();
  (void)registry->Register(noop_fn, [] {});
  (void)registry->Register(echo_fn, [](at::Tensor t) { return t; });
  auto rrefs = baton::rref::RRefService::Install(*registry);
  if (absl::Status s = baton::dist_autograd::Install(*registry); !s.ok()) return 1;
  baton::dist_optim::Install(*rrefs);
  baton::rref::RegisterClass<Linear>(*rrefs, "Linear").Constructor<int64_t>();
  (void)registry->Register(forward_fn,
                           [](LinearRef m, at::Tensor x) { return m.local_value()->forward(x); });
  (void)registry->Register(params_fn, [](const baton::rpc::CallContext& ctx, LinearRef m) {
    return ParamRefs{baton::rref::MakeOwned(*ctx.agent, m.local_value()->weight())};
  });
  AgentOptions opts;
  opts.name = absl::StrCat("w", rank);
  opts.rank = rank;
  opts.world_size = 2;
  opts.master_port = std::atoi(std::getenv("MASTER_PORT"));
  opts.timeouts.rpc = absl::Seconds(120);
  if (std::strcmp(TransportName(), "grpc") == 0) {
    opts.transport.local_transport = AgentOptions::LocalTransport::kGrpc;
  }
  // Mutual TLS, as bench/compare.sh's TLS run sets it (AgentOptions::security.tls).
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  opts.security.tls = {env("BATON_TLS_CA"), env("BATON_TLS_CERT"), env("BATON_TLS_KEY"),
                       env("BATON_TLS_SERVER_NAME")};
  // BATON_SHM=0: large tensors travel on the stream, as between hosts.
  if (env("BATON_SHM") == "0") opts.transport.same_host_shm = false;
  // BATON_NET_BULK=0: large tensors between hosts on the stream, not on the
  // network bulk channel (rpc/channel/tcp/bulk_channel.h).
  opts.transport.network_bulk = env("BATON_NET_BULK") != "0";
  // BATON_NET_BULK_LANES=n: its connections per peer (B10; default 2).
  if (const std::string lanes = env("BATON_NET_BULK_LANES"); !lanes.empty()) {
    opts.transport.network_bulk_lanes = std::atoi(lanes.c_str());
  }
  // Rank 0's address where the two run on two "hosts" (netns_bench.sh).
  if (const std::string addr = env("MASTER_ADDR"); !addr.empty()) opts.master_addr = addr;
  opts.security.job_token = env("BATON_JOB_TOKEN");
  // BATON_METRICS=1: metrics collected, as a job with metrics on
  // (bench/metrics_cost.sh compares).
  opts.observability.collect_metrics = env("BATON_METRICS") == "1";
  auto agent = RpcAgent::Create(opts, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, agent.status().ToString().c_str());
    return 1;
  }
  rrefs->Attach(agent->get());
  if (rank == 0) Drive(**agent, quick);
  absl::Status s = (*agent)->Shutdown();
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strncmp(argv[i], "--rank=", 7) == 0) rank = std::atoi(argv[i] + 7);
  }
  if (rank >= 0) return RunRank(rank, quick);
  if (EchoOnly().first == 0) {
    PingPongFloor(quick, /*spin=*/false);
    PingPongFloor(quick, /*spin=*/true);
    TcpEchoFloor(quick, /*conns=*/1);
    TcpEchoFloor(quick, /*conns=*/2);
  }
  if (std::getenv("MASTER_PORT") == nullptr) setenv("MASTER_PORT", "29612", 1);
  std::string self = "/proc/self/exe", arg = "--rank=1", q = "--quick";
  char* child_argv[] = {self.data(), arg.data(), quick ? q.data() : nullptr, nullptr};
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) {
    if (!EnterPeerNetns()) _exit(1);
    execv("/proc/self/exe", child_argv);
    _exit(127);
  }
  const int code = RunRank(0, quick);
  int status = 0;
  if (code != 0) kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return code != 0 ? code : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
