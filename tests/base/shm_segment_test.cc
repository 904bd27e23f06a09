// base/shm_segment.h: creation reserves the pages, opening checks the size,
// names and mappings have separate lifetimes, and every error names the
// object with the right code.
#include "base/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/host.h"

namespace baton {
namespace {

std::string FreshName() { return absl::StrCat("/baton-test-seg-", getpid(), "-", RandomHex(6)); }

bool NameExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(ShmSegment, CreatedMemoryIsSharedWithWhoeverOpensIt) {
  const std::string name = FreshName();
  auto a = ShmSegment::Create(name, 8192, /*populate=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size(), 8192u);
  EXPECT_EQ(a->name(), name);
  auto b = ShmSegment::Open(name, 8192);
  ASSERT_TRUE(b.ok()) << b.status();
  std::memcpy(a->data(), "hello", 6);
  EXPECT_STREQ(static_cast<const char*>(b->data()), "hello");
  static_cast<char*>(b->data())[8191] = 'z';
  EXPECT_EQ(static_cast<const char*>(a->data())[8191], 'z');
  // Opening a prefix of it is fine.
  EXPECT_TRUE(ShmSegment::Open(name, 100).ok());
  a->Unlink();
}

TEST(ShmSegment, ANameIsCreatedOnce) {
  const std::string name = FreshName();
  auto a = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  auto again = ShmSegment::Create(name, 4096);
  ASSERT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), name)) << again.status();
  // The failed attempt did not remove the first one's name.
  EXPECT_TRUE(NameExists(name));
  a->Unlink();
}

TEST(ShmSegment, AMissingObjectIsNotFound) {
  const std::string name = FreshName();
  auto s = ShmSegment::Open(name, 4096);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), name)) << s.status();
}

TEST(ShmSegment, ATruncatedObjectIsRefusedBeforeAnythingIsMapped) {
  const std::string name = FreshName();
  auto a = ShmSegment::Create(name, 1 << 16);
  ASSERT_TRUE(a.ok()) << a.status();
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);  // another process shrinks it
  close(fd);
  auto b = ShmSegment::Open(name, 1 << 16);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "holds 4096 bytes, 65536 expected"))
      << b.status();
  a->Unlink();
}

TEST(ShmSegment, TheMappingOutlivesTheNameAndMovesWithTheObject) {
  const std::string name = FreshName();
  auto a = ShmSegment::Create(name, 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  a->Unlink();
  EXPECT_FALSE(NameExists(name));
  a->Unlink();  // a name already gone is ignored
  static_cast<char*>(a->data())[0] = 'x';
  ShmSegment moved = *std::move(a);
  EXPECT_TRUE(moved.mapped());
  EXPECT_FALSE(a->mapped());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(static_cast<const char*>(moved.data())[0], 'x');
  moved.Reset();
  EXPECT_FALSE(moved.mapped());
  EXPECT_EQ(moved.size(), 0u);
}

TEST(ShmSegment, NoRoomIsResourceExhaustedAndLeavesNoName) {
  // More than any /dev/shm here holds: posix_fallocate fails with ENOSPC
  // (or the size is refused outright), never a later SIGBUS.
  const std::string name = FreshName();
  auto s = ShmSegment::Create(name, size_t{1} << 50);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.status().code() == absl::StatusCode::kResourceExhausted ||
              s.status().code() == absl::StatusCode::kInternal)
      << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), name)) << s.status();
  EXPECT_FALSE(NameExists(name));
}

}  // namespace
}  // namespace baton
