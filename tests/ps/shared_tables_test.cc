// The same-host dense tables of ps/internal/shared_tables.h: the parameter
// board and the gradient boxes, in one process (their protocol with the
// RPCs runs between processes in ps_multiprocess_test).
#include "ps/internal/shared_tables.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "ps/sharding.h"
#include "ps/spec.h"
#include "rpc/channel/shm/shm_channel.h"

namespace baton::ps::internal {
namespace {

using dist_optim::OptimizerOptions;

// Two dense tables (one float, one double) and an embedding, on 2 servers.
PsSpec Spec() {
  PsSpec spec;
  spec.tables = {TableSpec::Dense("a", {1000}, at::kFloat, OptimizerOptions::SGD(0.1)),
                 TableSpec::Embedding("e", 100, 4, RowInit::Zeros(), RowOptimizer::SGD(1)),
                 TableSpec::Dense("b", {3, 50}, at::kDouble, OptimizerOptions::SGD(0.1))};
  spec.num_trainers = 2;
  return spec;
}

bool Exists(const std::string& name) { return ::access(("/dev/shm" + name).c_str(), F_OK) == 0; }

// Each dense chunk of `server`, filled with `value`.
std::vector<at::Tensor> Chunks(const PsSpec& spec, const DenseLayout& l, double value) {
  std::vector<at::Tensor> out(spec.tables.size());
  for (size_t i = 0; i < spec.tables.size(); ++i) {
    if (l.offset[i] >= 0) out[i] = at::full({l.numel[i]}, value, spec.tables[i].dtype);
  }
  return out;
}

TEST(SharedTables, LayoutHoldsEachServersChunksAligned) {
  const PsSpec spec = Spec();
  const ShardPlan plan = ShardPlan::Make(spec, 2);
  int64_t total = 0;
  for (int s = 0; s < 2; ++s) {
    const DenseLayout l = MakeDenseLayout(spec, plan, s);
    EXPECT_EQ(l.offset[1], -1);  // the embedding table
    for (int t : {0, 2}) {
      EXPECT_EQ(l.numel[t], plan.ChunkOf(t, s).size());
      if (l.offset[t] >= 0) {
        EXPECT_EQ(l.offset[t] % 64, 0);
      }
      total += l.numel[t];
    }
  }
  EXPECT_EQ(total, 1000 + 150);
}

TEST(SharedTables, SD1_AReaderCopiesOneWholeVersionWhileTheServerPublishes) {
  const PsSpec spec = Spec();
  const DenseLayout l = MakeDenseLayout(spec, ShardPlan::Make(spec, 1), 0);
  auto board = ParameterBoard::Create(l, 0);
  ASSERT_TRUE(board.ok()) << board.status();
  auto reader = ParameterBoard::Open((*board)->announced(), l);
  ASSERT_TRUE(reader.ok()) << reader.status();
  (*board)->Publish(0, Chunks(spec, l, 0));
  // The reader copies table a's chunk 40 times per read, so that the server,
  // publishing without pause, laps it often: a read that a publish overtook
  // must be retried or refused, never returned torn.
  std::vector<std::pair<int, at::Tensor>> into;
  for (int k = 0; k < 40; ++k) into.emplace_back(0, at::empty({l.numel[0]}, at::kFloat));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> published{0};
  std::thread writer([&] {
    for (int64_t v = 1; !stop.load(); ++v) {
      (*board)->Publish(v, Chunks(spec, l, v));
      published = v;
    }
  });
  int whole = 0, refused = 0;
  int64_t last = 0;
  for (int i = 0; i < 500; ++i) {
    auto v = (*reader)->Read(last, into);
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable) << v.status();
      ++refused;
      continue;
    }
    // Every element of every copy is the version's value: nothing torn.
    for (const auto& [table, dst] : into) {
      ASSERT_TRUE(at::all(dst == static_cast<double>(*v)).item<bool>()) << "version " << *v;
    }
    EXPECT_GE(*v, last);  // SD2: never older than asked
    last = *v;
    ++whole;
  }
  stop = true;
  writer.join();
  std::printf("while publishing: %d whole reads, %d refused; %lld versions published\n", whole,
              refused, static_cast<long long>(published.load()));
  // Once the server is quiet, the newest version reads whole, both tables.
  at::Tensor b = at::empty({l.numel[2]}, at::kDouble);
  auto quiet = (*reader)->Read(published, {{0, into[0].second}, {2, b}});
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  EXPECT_EQ(*quiet, published.load());
  EXPECT_TRUE(at::all(b == static_cast<double>(*quiet)).item<bool>());
}

TEST(SharedTables, SD2_AVersionNotYetPublishedIsNotRead) {
  const PsSpec spec = Spec();
  const DenseLayout l = MakeDenseLayout(spec, ShardPlan::Make(spec, 1), 0);
  auto board = ParameterBoard::Create(l, 0);
  ASSERT_TRUE(board.ok()) << board.status();
  at::Tensor a = at::empty({l.numel[0]}, at::kFloat);
  EXPECT_EQ((*board)->version(), -1);
  EXPECT_EQ((*board)->Read(0, {{0, a}}).status().code(), absl::StatusCode::kUnavailable);
  (*board)->Publish(3, Chunks(spec, l, 3));
  (*board)->Publish(4, Chunks(spec, l, 4));
  EXPECT_EQ((*board)->version(), 4);
  auto v = (*board)->Read(4, {{0, a}});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 4);
  EXPECT_TRUE(at::all(a == 4).item<bool>());
  const auto later = (*board)->Read(5, {{0, a}}).status();
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(later.message(), "no whole version >= 5")) << later;
  // A destination that is not the chunk is refused before anything is read.
  EXPECT_EQ((*board)->Read(4, {{0, at::empty({10}, at::kFloat)}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*board)->Read(4, {{1, a}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*board)->Read(4, {{0, at::empty({l.numel[0]}, at::kDouble)}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedTables, SD3_ABoxIsWrittenAgainOnlyOnceTheServersViewsAreGone) {
  const PsSpec spec = Spec();
  const DenseLayout l = MakeDenseLayout(spec, ShardPlan::Make(spec, 1), 0);
  auto box = GradientBox::Create(l, /*trainer=*/1, /*server=*/0);
  ASSERT_TRUE(box.ok()) << box.status();
  auto server_side = GradientBox::Open((*box)->announced(), l);
  ASSERT_TRUE(server_side.ok()) << server_side.status();
  EXPECT_TRUE((*box)->Free());
  // A tensor that is not a table's chunk here is refused, nothing written.
  EXPECT_EQ((*box)->Write({{0, at::ones({999})}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*box)->Write({{1, at::ones({4})}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // the embedding table
  EXPECT_EQ((*box)->Write({{0, at::ones({1000}, at::kDouble)}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // twice the chunk's bytes
  EXPECT_TRUE((*box)->Free());
  auto written =
      (*box)->Write({{0, at::arange(1000, at::kFloat)}, {2, at::ones({150}, at::kDouble)}});
  ASSERT_TRUE(written.ok()) << written.status();
  const uint64_t g = *written;
  EXPECT_EQ(g, 1u);
  EXPECT_FALSE((*box)->Free());  // the server has not read it yet
  {
    auto views = GradientBox::Views(*server_side, g, {0, 2}, spec);
    ASSERT_TRUE(views.ok()) << views.status();
    EXPECT_TRUE(at::equal((*views)[0], at::arange(1000, at::kFloat)));
    EXPECT_EQ((*views)[1].scalar_type(), at::kDouble);
    EXPECT_DOUBLE_EQ((*views)[1].sum().item<double>(), 150);
    at::Tensor kept = (*views)[1];  // kSync keeps a contribution until its clock
    views->clear();
    EXPECT_FALSE((*box)->Free());
    kept = at::Tensor();
  }
  EXPECT_TRUE((*box)->Free());
  // A push naming a generation the box does not hold changes nothing.
  const auto stale = GradientBox::Views(*server_side, g + 1, {0}, spec).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(stale.message(), "names generation 2, the box holds 1")) << stale;
  EXPECT_EQ(GradientBox::Views(*server_side, g, {1}, spec).status().code(),
            absl::StatusCode::kInvalidArgument);  // no chunk of the embedding
}

TEST(SharedTables, SD4_OnlyTheAnnouncedSegmentIsMapped) {
  const PsSpec spec = Spec();
  const DenseLayout l = MakeDenseLayout(spec, ShardPlan::Make(spec, 1), 0);
  auto board = ParameterBoard::Create(l, 0);
  ASSERT_TRUE(board.ok()) << board.status();
  SharedName wrong = (*board)->announced();
  wrong.nonce ^= 1;
  auto s = ParameterBoard::Open(wrong, l).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "another segment than the one announced")) << s;
  const DenseLayout other = MakeDenseLayout(spec, ShardPlan::Make(spec, 2), 0);
  EXPECT_EQ(ParameterBoard::Open((*board)->announced(), other).status().code(),
            absl::StatusCode::kFailedPrecondition);
  SharedName gone = (*board)->announced();
  gone.name += "x";
  EXPECT_EQ(ParameterBoard::Open(gone, l).status().code(), absl::StatusCode::kNotFound);
  // A board is not a box.
  EXPECT_EQ(GradientBox::Open((*board)->announced(), l).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SharedTables, SD5_TheCreatorUnlinksAndTheSweepRemovesAKilledCreatorsSegments) {
  const PsSpec spec = Spec();
  const DenseLayout l = MakeDenseLayout(spec, ShardPlan::Make(spec, 1), 0);
  std::string name;
  {
    auto board = ParameterBoard::Create(l, 0);
    ASSERT_TRUE(board.ok()) << board.status();
    name = (*board)->announced().name;
    EXPECT_TRUE(Exists(name));
    EXPECT_GE((*board)->bytes(), static_cast<size_t>(2 * l.bytes));
  }
  EXPECT_FALSE(Exists(name));
  // A child creates a board and a box, reports their names, and is killed.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    auto board = ParameterBoard::Create(l, 0);
    auto box = GradientBox::Create(l, 0, 0);
    std::string names = board.ok() && box.ok() ? absl::StrCat((*board)->announced().name, " ",
                                                              (*box)->announced().name, "\n")
                                               : "failed\n";
    (void)!::write(fds[1], names.data(), names.size());
    ::pause();  // until killed
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) {
    got.append(buf, n);
    if (absl::StrContains(got, "\n")) break;
  }
  ::close(fds[0]);
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(absl::StrContains(got, "psboard")) << got;
  const std::string board_name = got.substr(0, got.find(' '));
  const std::string box_name = got.substr(got.find(' ') + 1, got.find('\n') - got.find(' ') - 1);
  EXPECT_TRUE(Exists(board_name));
  EXPECT_TRUE(Exists(box_name));
  rpc::internal::ShmChannel::Sweep();
  EXPECT_FALSE(Exists(board_name));
  EXPECT_FALSE(Exists(box_name));
}

}  // namespace
}  // namespace baton::ps::internal
