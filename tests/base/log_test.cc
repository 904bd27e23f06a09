// The one log path of library code (base/log.h): the line's form, children's
// prefixes, and lines from many threads reaching the sink whole and, per
// thread, in order.
#include "base/log.h"

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace baton {
namespace {

struct Captured {
  std::vector<std::pair<LogSeverity, std::string>> lines;
  Logger::Sink sink() {
    return [this](LogSeverity s, const std::string& line) { lines.emplace_back(s, line); };
  }
};

TEST(Logger, ALineNamesItsSeverityAndWhoLogsIt) {
  Captured c;
  Logger log("worker 'w0'", c.sink());
  log.Info("ready");
  log.Warning("serves no state");
  log.Child("bulk channel").Error("handshake failed");
  Logger(std::string(), c.sink()).Info("bare");
  ASSERT_EQ(c.lines.size(), 4u);
  EXPECT_EQ(c.lines[0],
            std::make_pair(LogSeverity::kInfo, std::string("baton I worker 'w0': ready")));
  EXPECT_EQ(c.lines[1].second, "baton W worker 'w0': serves no state");
  EXPECT_EQ(c.lines[2],
            std::make_pair(LogSeverity::kError,
                           std::string("baton E worker 'w0': bulk channel: handshake failed")));
  EXPECT_EQ(c.lines[3].second, "baton I bare");
}

// The sink is called one line at a time (no line is torn or lost), and a
// thread's lines arrive in the order it logged them, through copies and
// children alike.
TEST(Logger, LinesOfManyThreadsArriveWholeAndInEachThreadsOrder) {
  Captured c;  // not thread-safe itself: the logger's lock guards it
  Logger log("job", c.sink());
  constexpr int kThreads = 8, kLines = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([log, t] {
      Logger mine = log.Child(absl::StrCat("t", t));
      for (int i = 0; i < kLines; ++i) mine.Info(absl::StrCat(i));
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(c.lines.size(), size_t{kThreads * kLines});
  std::vector<int> next(kThreads, 0);
  for (const auto& [severity, line] : c.lines) {
    // "baton I job: t<k>: <i>"
    std::vector<std::string> parts = absl::StrSplit(line, ": ");
    ASSERT_EQ(parts.size(), 3u) << line;
    int t = -1, i = -1;
    ASSERT_TRUE(absl::SimpleAtoi(parts[1].substr(1), &t)) << line;
    ASSERT_TRUE(absl::SimpleAtoi(parts[2], &i)) << line;
    ASSERT_TRUE(t >= 0 && t < kThreads) << line;
    EXPECT_EQ(i, next[t]++) << line;
  }
}

}  // namespace
}  // namespace baton
