// RETURN_IF_ERROR and ASSIGN_OR_RETURN (base/status_macros.h): the error
// comes back unchanged, the argument is evaluated once, and the value is
// moved, not copied.
#include "base/status_macros.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

absl::Status Step(bool ok, int* calls) {
  ++*calls;
  return ok ? absl::OkStatus() : absl::UnavailableError("peer gone");
}

absl::Status TwoSteps(bool first, bool second, int* calls) {
  RETURN_IF_ERROR(Step(first, calls));
  RETURN_IF_ERROR(Step(second, calls));
  return absl::OkStatus();
}

TEST(StatusMacros, ReturnIfErrorReturnsTheFirstErrorUnchangedAndEvaluatesOnce) {
  int calls = 0;
  absl::Status s = TwoSteps(true, false, &calls);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "peer gone");
  EXPECT_EQ(calls, 2);

  calls = 0;
  EXPECT_FALSE(TwoSteps(false, true, &calls).ok());
  EXPECT_EQ(calls, 1);  // stopped at the first

  calls = 0;
  EXPECT_TRUE(TwoSteps(true, true, &calls).ok());
  EXPECT_EQ(calls, 2);
}

absl::StatusOr<std::unique_ptr<std::string>> Make(bool ok, int* calls) {
  ++*calls;
  if (!ok) return absl::InvalidArgumentError("bad name");
  return std::make_unique<std::string>("worker1");
}

// A move-only value: ASSIGN_OR_RETURN moves it out.
absl::StatusOr<size_t> LengthOf(bool ok, int* calls) {
  ASSIGN_OR_RETURN(std::unique_ptr<std::string> name, Make(ok, calls));
  return name->size();
}

absl::StatusOr<std::string> Joined(int* calls) {
  std::string out = "w";
  ASSIGN_OR_RETURN(auto first, Make(true, calls));
  ASSIGN_OR_RETURN(auto second, Make(true, calls));  // two on one scope
  out += *first + *second;
  return out;
}

absl::Status IntoExisting(bool ok, std::unique_ptr<std::string>* into, int* calls) {
  ASSIGN_OR_RETURN(*into, Make(ok, calls));
  return absl::OkStatus();
}

TEST(StatusMacros, AssignOrReturnMovesTheValueOrReturnsTheStatus) {
  int calls = 0;
  absl::StatusOr<size_t> n = LengthOf(true, &calls);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 7u);
  EXPECT_EQ(calls, 1);

  calls = 0;
  n = LengthOf(false, &calls);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(n.status().message(), "bad name");
  EXPECT_EQ(calls, 1);

  calls = 0;
  absl::StatusOr<std::string> joined = Joined(&calls);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(*joined, "wworker1worker1");
  EXPECT_EQ(calls, 2);
}

TEST(StatusMacros, AssignOrReturnAssignsToAnExistingLvalue) {
  int calls = 0;
  std::unique_ptr<std::string> into;
  ASSERT_TRUE(IntoExisting(true, &into, &calls).ok());
  ASSERT_NE(into, nullptr);
  EXPECT_EQ(*into, "worker1");

  std::unique_ptr<std::string> untouched = std::make_unique<std::string>("kept");
  EXPECT_FALSE(IntoExisting(false, &untouched, &calls).ok());
  EXPECT_EQ(*untouched, "kept");  // an error leaves it as it was
}

}  // namespace
}  // namespace baton
