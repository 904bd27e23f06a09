// The parameter server's wire messages (ps/internal/functions.h), in one
// process: the registered functions of a PsServer are called through its
// FunctionRegistry with requests encoded as a peer would encode them.
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "ps/internal/functions.h"
#include "ps/server.h"
#include "ps/spec.h"
#include "rpc/codec.h"
#include "rpc/function.h"

namespace baton::ps {
namespace {

using dist_optim::OptimizerOptions;

PsSpec OneTableSpec() {
  PsSpec spec;
  spec.tables = {TableSpec::Dense("w", {4}, at::kFloat, OptimizerOptions::SGD(1))};
  spec.consistency = Consistency::Async();
  return spec;
}

// Calls `fn` on `registry` the way the agent does, with `args` encoded as
// the caller's bytes; returns the reply's payload or the function's error.
absl::StatusOr<rpc::Payload> CallRaw(rpc::FunctionRegistry& registry, const std::string& fn,
                                     absl::StatusOr<rpc::Payload> args) {
  if (!args.ok()) return args.status();
  auto entry = registry.Find(fn);
  if (entry == nullptr) return absl::NotFoundError(fn);
  std::optional<absl::StatusOr<rpc::Payload>> reply;
  rpc::CallContext ctx;
  ctx.function = fn;
  entry->handler(ctx, *std::move(args),
                 [&reply](absl::StatusOr<rpc::Payload> r) { reply = std::move(r); });
  // These functions answer at once (a pull may park, and is not called here).
  if (!reply.has_value()) return absl::InternalError("test: no reply");
  return *std::move(reply);
}

template <typename Reply>
absl::StatusOr<Reply> Decode(absl::StatusOr<rpc::Payload> payload) {
  if (!payload.ok()) return payload.status();
  Reply out;
  if (absl::Status s = rpc::DecodeMessage(*payload, &out); !s.ok()) return s;
  return out;
}

TEST(PsWire, EveryFunctionTakesAndReturnsNamedTypes) {
  EXPECT_EQ(internal::kJoinFn.signature(),
            "(JoinRequest{int32,string,string,uint64,int64})"
            "->JoinReply{int64,int64,bool,string,uint64,int64}");
  EXPECT_EQ(internal::kPushFn.signature(),
            "(PushRequest{int32,int64,int64,bool,vector<string>,vector<Tensor>,"
            "vector<Tensor>,uint64,uint64})->PushReply{int64,int64,uint64}");
  EXPECT_EQ(internal::kPullFn.signature(),
            "(PullRequest{int32,int64,int64,vector<string>,vector<Tensor>,bool})"
            "->PullReply{int64,vector<Tensor>,int64,uint64}");
  EXPECT_EQ(internal::kStatsFn.signature(), "()->baton.proto.ShardStats");
  EXPECT_EQ(internal::kPushFn.name(), "baton.ps.push");
}

TEST(PsWire, ShardStatsTravelAsAProtoWithEveryCounter) {
  ShardStats in;
  in.server = 3;
  in.tables = {TableStats{"w", 1, 2, 3, 4, 5, 6}, TableStats{"emb", 7, 8, 9, 10, 11, 12}};
  in.applied_clock = 13;
  in.min_clock = 14;
  in.max_clock = 15;
  in.max_staleness = 16;
  in.applied_pushes = 17;
  in.stale_pushes = 18;
  in.live_trainers = 19;
  in.dropped_trainers = 20;
  in.parked_pulls = 21;
  in.duplicate_pushes = 22;
  auto out = Decode<proto::ShardStats>(rpc::EncodeMessage(internal::ToProto(in)));
  ASSERT_TRUE(out.ok()) << out.status();
  const ShardStats back = internal::FromProto(*out);
  // DebugString does not show every counter: compare them one by one.
  EXPECT_EQ(back.server, 3);
  ASSERT_EQ(back.tables.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const TableStats& a = in.tables[i];
    const TableStats& b = back.tables[i];
    EXPECT_EQ(std::tie(a.table, a.pulls, a.pushes, a.bytes_pulled, a.bytes_pushed,
                       a.applied_updates, a.rows),
              std::tie(b.table, b.pulls, b.pushes, b.bytes_pulled, b.bytes_pushed,
                       b.applied_updates, b.rows));
  }
  EXPECT_EQ(std::tie(in.applied_clock, in.min_clock, in.max_clock, in.max_staleness,
                     in.applied_pushes, in.stale_pushes, in.live_trainers, in.dropped_trainers,
                     in.parked_pulls, in.duplicate_pushes),
            std::tie(back.applied_clock, back.min_clock, back.max_clock, back.max_staleness,
                     back.applied_pushes, back.stale_pushes, back.live_trainers,
                     back.dropped_trainers, back.parked_pulls, back.duplicate_pushes));
}

TEST(PsWire, ServerAnswersTypedRequestsAndRefusesBadOnesNamingTheField) {
  rpc::FunctionRegistry registry;
  auto server = PsServer::Create(OneTableSpec(), ServerOptions{}, registry);
  ASSERT_TRUE(server.ok()) << server.status();

  internal::JoinRequest join;
  join.trainer = 0;
  join.fingerprint = OneTableSpec().Fingerprint();
  auto joined = Decode<internal::JoinReply>(
      CallRaw(registry, "baton.ps.join", rpc::EncodeMessage(std::make_tuple(join))));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->clock, 0);
  // The server announces its parameter board (same-host dense tables); this
  // trainer announced no gradient box.
  EXPECT_TRUE(absl::StrContains(joined->board, "psboard0.")) << joined->board;
  EXPECT_FALSE(joined->box_mapped);

  internal::InitRequest init;
  init.tables = {"w"};
  init.values = {at::zeros({4})};
  auto inited = Decode<internal::InitReply>(
      CallRaw(registry, "baton.ps.init_dense", rpc::EncodeMessage(std::make_tuple(init))));
  ASSERT_TRUE(inited.ok()) << inited.status();
  EXPECT_EQ(inited->initialized, 1);

  internal::PushRequest push;
  push.session = joined->session;
  push.end_clock = true;
  push.tables = {"w"};
  push.ids = {at::Tensor()};
  push.gradients = {at::ones({4})};
  auto pushed = Decode<internal::PushReply>(
      CallRaw(registry, "baton.ps.push", rpc::EncodeMessage(std::make_tuple(push))));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(pushed->clock, 1);

  // The stats reply is the shard's own counters.
  auto stats = Decode<proto::ShardStats>(
      CallRaw(registry, "baton.ps.stats", rpc::EncodeMessage(std::tuple<>())));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(internal::FromProto(*stats).DebugString(), (*server)->shard().Stats().DebugString());
  EXPECT_EQ(stats->applied_pushes(), 1);
  ASSERT_EQ(stats->tables_size(), 1);
  EXPECT_EQ(stats->tables(0).bytes_pushed(), 16);

  // Parallel lists of different lengths: refused, naming the list.
  push.gradients.clear();
  auto uneven = CallRaw(registry, "baton.ps.push", rpc::EncodeMessage(std::make_tuple(push)));
  EXPECT_EQ(uneven.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(uneven.status().message(), "ps PushRequest: 1 tables but 0 gradients"))
      << uneven.status();

  // Undecodable bytes: DATA_LOSS naming the field.
  rpc::Encoder enc;
  rpc::EncodeValue(int32_t{0}, enc);  // trainer
  rpc::EncodeValue(int64_t{1}, enc);  // session
  rpc::EncodeValue(int64_t{1}, enc);  // clock
  enc.WritePod<uint8_t>(7);           // end_clock: not a bool
  auto corrupt = CallRaw(registry, "baton.ps.push", std::move(enc).Finish());
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(corrupt.status().message(), "PushRequest.end_clock: bad bool"))
      << corrupt.status();
  // Nothing of either changed the shard.
  EXPECT_EQ((*server)->shard().Stats().applied_pushes, 1);

  // A push that says its gradients are in a gradient box the server never
  // mapped: refused, naming the trainer, and nothing changes.
  push.gradients = {at::Tensor()};
  push.box_generation = 1;
  auto unboxed = CallRaw(registry, "baton.ps.push", rpc::EncodeMessage(std::make_tuple(push)));
  EXPECT_EQ(unboxed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(unboxed.status().message(),
                                "trainer 0 sent its gradients through a gradient box this server "
                                "has not mapped"))
      << unboxed.status();
  EXPECT_EQ((*server)->shard().Stats().applied_pushes, 1);
}

}  // namespace
}  // namespace baton::ps
