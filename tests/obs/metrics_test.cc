// Metrics in Prometheus's format (obs/metrics.h, obs/http_server.h): what
// the registry renders, what the HTTP endpoint answers, and a live job's
// scrape checked by the real `promtool check metrics` (Debian's prometheus).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/status.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_optim/optimizer_options.h"
#include "obs/http_server.h"
#include "obs/metrics.h"
#include "ps/server.h"
#include "ps/spec.h"
#include "rpc/agent.h"
#include "rref/rref_service.h"
#include "testing/promtool.h"
#include "testing/rpc/loopback_job.h"

namespace baton::obs {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// GET `path` from 127.0.0.1:port; the whole response, headers included.
std::string HttpGet(int port, const std::string& path, const std::string& method = "GET") {
  auto r = obs::HttpGet(absl::StrCat("127.0.0.1:", port), path, absl::Seconds(10), method);
  return r.ok() ? *r : std::string(r.status().message());
}

std::string Body(const std::string& response) { return HttpBody(response); }

using ::baton::testing::Promtool;

TEST(Metrics, RendersCountersHistogramsAndCollectedFamilies) {
  MetricsRegistry m;
  RpcMetrics* f = m.Rpc("train \"step\"\n");
  EXPECT_EQ(m.Rpc("train \"step\"\n"), f);  // one object per function
  f->Record(Side::kCaller, absl::StatusCode::kOk, absl::Microseconds(80));
  f->Record(Side::kCaller, absl::StatusCode::kOk, absl::Milliseconds(3));
  f->Record(Side::kCaller, absl::StatusCode::kDeadlineExceeded, absl::Seconds(20));
  f->Record(Side::kCallee, absl::StatusCode::kOk, absl::Microseconds(30));
  m.AddCollector([](MetricsWriter& w) {
    w.Family("baton_test_live", "A gauge a component adds.", "gauge");
    w.Sample({{"kind", "owned"}}, 3);
  });
  const std::string text = m.Render();
  const std::string fn = R"(function="train \"step\"\n")";
  EXPECT_THAT(text, HasSubstr(absl::StrCat("baton_rpc_calls_total{", fn,
                                           R"(,side="caller",code="OK"} 2)")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("baton_rpc_calls_total{", fn,
                                           R"(,side="caller",code="DEADLINE_EXCEEDED"} 1)")));
  // 80 us falls in the 100 us bucket; 3 ms in 5 ms; 20 s only in +Inf.
  EXPECT_THAT(text, HasSubstr(absl::StrCat("baton_rpc_call_duration_seconds_bucket{", fn,
                                           R"(,side="caller",le="5e-05"} 0)")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("baton_rpc_call_duration_seconds_bucket{", fn,
                                           R"(,side="caller",le="0.0001"} 1)")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("baton_rpc_call_duration_seconds_bucket{", fn,
                                           R"(,side="caller",le="10"} 2)")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("baton_rpc_call_duration_seconds_bucket{", fn,
                                           R"(,side="caller",le="+Inf"} 3)")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("baton_rpc_call_duration_seconds_count{", fn,
                                           R"(,side="callee"} 1)")));
  EXPECT_THAT(text, HasSubstr(R"(baton_test_live{kind="owned"} 3)"));
  auto [code, said] = Promtool(text);
  EXPECT_EQ(code, 0) << said << "\n" << text;
}

// A collector's value that is not a finite number (a ratio of nothing, an
// unbounded limit) is written as the text format spells it, and a value past
// the int64 range as a float: promtool accepts all of them.
TEST(Metrics, NonFiniteAndHugeValuesAreWrittenAsPrometheusSpellsThem) {
  MetricsRegistry m;
  m.AddCollector([](MetricsWriter& w) {
    w.Family("baton_test_values", "Values of every kind.", "gauge");
    w.Sample({{"v", "nan"}}, std::nan(""));
    w.Sample({{"v", "inf"}}, std::numeric_limits<double>::infinity());
    w.Sample({{"v", "-inf"}}, -std::numeric_limits<double>::infinity());
    w.Sample({{"v", "huge"}}, 1e300);
    w.Sample({{"v", "whole"}}, 42);
    w.Sample({{"v", "half"}}, 0.5);
  });
  const std::string text = m.Render();
  EXPECT_THAT(text, HasSubstr(R"(baton_test_values{v="nan"} NaN)"));
  EXPECT_THAT(text, HasSubstr(R"(baton_test_values{v="inf"} +Inf)"));
  EXPECT_THAT(text, HasSubstr(R"(baton_test_values{v="-inf"} -Inf)"));
  EXPECT_THAT(text, HasSubstr(R"(baton_test_values{v="huge"} 1e+300)"));
  EXPECT_THAT(text, HasSubstr(R"(baton_test_values{v="whole"} 42)"));
  EXPECT_THAT(text, HasSubstr(R"(baton_test_values{v="half"} 0.5)"));
  auto [code, said] = Promtool(text);
  EXPECT_EQ(code, 0) << said << "\n" << text;
}

std::map<std::string, HttpRoute> MetricsRoutes(const MetricsRegistry* m) {
  return {{"/metrics", {std::string(kMetricsContentType), [m] { return m->Render(); }}}};
}

// baton-run --node_metrics_port: two workers' scrapes in one, each sample
// labelled with its rank, accepted by promtool.
TEST(Metrics, MergedExpositionsLabelEverySampleAndPassPromtool) {
  MetricsRegistry a, b;
  a.Rpc("f")->Record(Side::kCaller, absl::StatusCode::kOk, absl::Microseconds(80));
  b.Rpc("f")->Record(Side::kCallee, absl::StatusCode::kOk, absl::Microseconds(30));
  b.Rpc("g")->Record(Side::kCaller, absl::StatusCode::kNotFound, absl::Milliseconds(2));
  for (MetricsRegistry* m : {&a, &b}) {
    m->AddCollector([](MetricsWriter& w) { w.Gauge("baton_test_plain", "No labels.", 7); });
  }
  const std::string merged = MergeExpositions("rank", {{"0", a.Render()}, {"1", b.Render()}});
  EXPECT_THAT(merged, HasSubstr(R"(baton_rpc_calls_total{rank="0",function="f",side="caller",)"
                                R"(code="OK"} 1)"));
  EXPECT_THAT(merged, HasSubstr(R"(baton_rpc_calls_total{rank="1",function="g",side="caller",)"
                                R"(code="NOT_FOUND"} 1)"));
  EXPECT_THAT(merged, HasSubstr(R"(baton_test_plain{rank="0"} 7)"));
  EXPECT_THAT(merged, HasSubstr(R"(baton_test_plain{rank="1"} 7)"));
  // Each family once.
  size_t types = 0;
  for (size_t at = merged.find("# TYPE baton_rpc_calls_total "); at != std::string::npos;
       at = merged.find("# TYPE baton_rpc_calls_total ", at + 1)) {
    ++types;
  }
  EXPECT_EQ(types, 1u);
  auto [code, said] = Promtool(merged);
  EXPECT_EQ(code, 0) << said << "\n" << merged;
}

TEST(HttpServer, AnswersMetricsAndRefusesTheRest) {
  MetricsRegistry m;
  m.Rpc("f")->Record(Side::kCallee, absl::StatusCode::kOk, absl::Microseconds(5));
  auto server = HttpServer::Start("127.0.0.1:0", MetricsRoutes(&m));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string ok = HttpGet(port, "/metrics");
  EXPECT_THAT(ok, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(ok, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_EQ(Body(ok), m.Render());
  EXPECT_THAT(HttpGet(port, "/"), HasSubstr("HTTP/1.1 404"));
  EXPECT_THAT(HttpGet(port, "/metrics", "POST"), HasSubstr("HTTP/1.1 405"));
  auto taken = HttpServer::Start(absl::StrCat("127.0.0.1:", port), MetricsRoutes(&m));
  ASSERT_FALSE(taken.ok());
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr(absl::StrCat(":", port)));
}

// A live job: two agents with metrics on, calls that succeed and fail, each
// worker's scrape accepted by promtool and counting them.
TEST(AgentMetrics, ALiveJobsScrapePassesPromtoolAndCountsTheCalls) {
  static const rpc::Function<int64_t(int64_t)> echo_fn("echo");
  static const rpc::Function<int64_t(int64_t)> fail_fn("fail");
  static const rpc::Function<int64_t(int64_t)> hold_fn("hold");
  absl::Notification started, release;
  rpc::testing::LoopbackJobOptions o;
  o.world_size = 2;
  o.install = [&started, &release](int, rpc::FunctionRegistry& r) {
    ASSERT_TRUE(r.Register(echo_fn, [](int64_t v) { return v; }).ok());
    ASSERT_TRUE(r.Register(hold_fn, [&started, &release](int64_t v) {
                   started.Notify();  // called once
                   release.WaitForNotificationWithTimeout(absl::Seconds(30));
                   return v;
                 }).ok());
    ASSERT_TRUE(r.Register(fail_fn, [](int64_t) -> int64_t {
                   throw Error(absl::InvalidArgumentError("no such row"));
                 }).ok());
  };
  // The protocol layers' families too: RRefs and autograd contexts on both,
  // a one-table PS shard on worker 1.
  std::unique_ptr<ps::PsServer> shard;
  o.install = [&, base = o.install](int rank, rpc::FunctionRegistry& r) {
    base(rank, r);
    rref::RRefService::Install(r);
    ASSERT_TRUE(dist_autograd::Install(r).ok());
    if (rank == 1) {
      ps::PsSpec spec;
      spec.tables = {
          ps::TableSpec::Dense("w", {4}, at::kFloat, dist_optim::OptimizerOptions::SGD(1))};
      auto s = ps::PsServer::Create(spec, ps::ServerOptions{}, r);
      ASSERT_TRUE(s.ok()) << s.status();
      shard = *std::move(s);
    }
  };
  o.configure = [](int, rpc::AgentOptions& opts) {
    opts.observability.metrics_address = "127.0.0.1:0";
  };
  auto job = rpc::testing::LoopbackJob::Start(o);
  ASSERT_TRUE(job.ok()) << job.status();
  for (int i = 0; i < 5; ++i) EXPECT_EQ((*job)->agent(0).rpc_sync(1, echo_fn, i), i);
  EXPECT_FALSE((*job)->agent(0).rpc_async(1, fail_fn, 1).result().ok());
  ASSERT_NE((*job)->agent(0).runtime().metrics(), nullptr);
  const std::string caller = Body(HttpGet((*job)->agent(0).metrics_port(), "/metrics"));
  const std::string callee = Body(HttpGet((*job)->agent(1).metrics_port(), "/metrics"));
  EXPECT_THAT(caller,
              HasSubstr(R"(baton_rpc_calls_total{function="echo",side="caller",code="OK"} 5)"));
  EXPECT_THAT(callee,
              HasSubstr(R"(baton_rpc_calls_total{function="echo",side="callee",code="OK"} 5)"));
  EXPECT_THAT(caller, HasSubstr(R"(function="fail",side="caller",code="INVALID_ARGUMENT"} 1)"));
  EXPECT_THAT(caller, HasSubstr("baton_rpc_pending_outgoing 0"));
  // Traffic per peer and transport: six requests out, six replies in.
  EXPECT_THAT(caller, HasSubstr(R"(baton_rpc_messages_total{peer="w1",transport="grpc",)"
                                R"(direction="out"} 6)"));
  EXPECT_THAT(caller, HasSubstr(R"(baton_rpc_messages_total{peer="w1",transport="grpc",)"
                                R"(direction="in"} 6)"));
  EXPECT_THAT(callee, HasSubstr(R"(baton_rpc_messages_total{peer="w0",transport="grpc",)"
                                R"(direction="in"} 6)"));
  EXPECT_THAT(caller, HasSubstr(R"(baton_rpc_payload_bytes_total{peer="w1",transport="grpc",)"
                                R"(direction="out"})"));
  EXPECT_THAT(caller, HasSubstr("# TYPE baton_rpc_call_duration_seconds histogram"));
  EXPECT_THAT(caller, HasSubstr("baton_autograd_contexts 0"));
  EXPECT_THAT(caller, HasSubstr("baton_rref_owned 0"));
  EXPECT_THAT(callee, HasSubstr(R"(baton_ps_pulls_total{server="0",table="w"} 0)"));
  EXPECT_THAT(callee, HasSubstr(R"(baton_ps_applied_clock{server="0"} 0)"));
  // The shard's parameter board: a 4 KiB header and two 64-byte buffers.
  EXPECT_THAT(callee, HasSubstr(R"(baton_ps_shared_memory_bytes{server="0"} 4224)"));
  EXPECT_THAT(callee, HasSubstr(R"(baton_ps_board_pulls_total{server="0"} 0)"));
  EXPECT_THAT(callee, HasSubstr(R"(baton_ps_box_pushes_total{server="0"} 0)"));
  for (const std::string& text : {caller, callee}) {
    auto [code, said] = Promtool(text);
    EXPECT_EQ(code, 0) << said << "\n" << text;
  }
  // Per peer: a call held on w1 is in w0's window toward w1 and held (not
  // queued: it runs) by w1 for w0; its label names it on both sides.
  rpc::CallOptions labelled;
  labelled.label = "train.step";
  auto held = (*job)->agent(0).rpc_async(labelled, 1, hold_fn, int64_t{7});
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  const std::string caller_busy = Body(HttpGet((*job)->agent(0).metrics_port(), "/metrics"));
  const std::string callee_busy = Body(HttpGet((*job)->agent(1).metrics_port(), "/metrics"));
  EXPECT_THAT(caller_busy, HasSubstr(R"(baton_rpc_peer_calls_in_flight{peer="w1"} 1)"));
  EXPECT_THAT(caller_busy, HasSubstr(R"(baton_rpc_peer_calls_in_flight{peer="w0"} 0)"));
  EXPECT_THAT(caller_busy, HasSubstr(R"(baton_rpc_peer_bytes_in_flight{peer="w1"} )"));
  EXPECT_THAT(callee_busy, HasSubstr(R"(baton_rpc_peer_requests_held{peer="w0"} 1)"));
  EXPECT_THAT(callee_busy, HasSubstr(R"(baton_rpc_peer_requests_queued{peer="w0"} 0)"));
  for (const std::string& text : {caller_busy, callee_busy}) {
    auto [code, said] = Promtool(text);
    EXPECT_EQ(code, 0) << said << "\n" << text;
  }
  release.Notify();
  ASSERT_EQ(held.result().value_or(-1), 7);
  const std::string caller_after = Body(HttpGet((*job)->agent(0).metrics_port(), "/metrics"));
  const std::string callee_after = Body(HttpGet((*job)->agent(1).metrics_port(), "/metrics"));
  EXPECT_THAT(
      caller_after,
      HasSubstr(R"(baton_rpc_calls_total{function="train.step",side="caller",code="OK"} 1)"));
  EXPECT_THAT(
      callee_after,
      HasSubstr(R"(baton_rpc_calls_total{function="train.step",side="callee",code="OK"} 1)"));
  EXPECT_THAT(callee_after, HasSubstr(R"(baton_rpc_peer_requests_held{peer="w0"} 0)"));
  EXPECT_THAT(caller_after, Not(HasSubstr(R"(function="hold")")));
  EXPECT_TRUE((*job)->ShutdownAll().ok());
  if (shard != nullptr) {
    EXPECT_TRUE(shard->Stop().ok());
  }
}

}  // namespace
}  // namespace baton::obs
