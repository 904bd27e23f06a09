// WorkerIdentity (base/identity.h): the proofs a stream's opener presents
// (docs/flow_control.md, W1).
#include "base/identity.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace baton {
namespace {

// W1: two incarnations prove to each other what no third key pair can.
TEST(WorkerIdentity, W1_OnlyTheHolderOfAKeyProvesItToItsPeer) {
  auto a = WorkerIdentity::Generate();
  auto b = WorkerIdentity::Generate();
  auto c = WorkerIdentity::Generate();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->public_key().size(), WorkerIdentity::kKeyBytes);
  EXPECT_NE(a->public_key(), b->public_key());
  const std::string statement = "worker 0 to worker 1";
  auto proof = a->Prove(b->public_key(), statement);
  ASSERT_TRUE(proof.ok()) << proof.status();
  EXPECT_EQ(proof->size(), WorkerIdentity::kProofBytes);
  // b checks it against a's registered key.
  EXPECT_TRUE(b->Verify(a->public_key(), statement, *proof).ok());
  // c, holding the same token but not a's key, proves nothing as a.
  auto forged = c->Prove(b->public_key(), statement);
  ASSERT_TRUE(forged.ok());
  absl::Status s = b->Verify(a->public_key(), statement, *forged);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "does not match")) << s;
  // A proof is for one statement and one peer.
  EXPECT_EQ(b->Verify(a->public_key(), "worker 0 to worker 2", *proof).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(c->Verify(a->public_key(), statement, *proof).code(),
            absl::StatusCode::kPermissionDenied);
  // Cut or flipped proofs.
  EXPECT_EQ(b->Verify(a->public_key(), statement, proof->substr(0, 31)).code(),
            absl::StatusCode::kPermissionDenied);
  std::string flipped = *proof;
  flipped[5] ^= 1;
  EXPECT_EQ(b->Verify(a->public_key(), statement, flipped).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(WorkerIdentity, W1_AKeyThatIsNoX25519KeyIsInvalidArgument) {
  auto a = WorkerIdentity::Generate();
  ASSERT_TRUE(a.ok());
  absl::Status s = a->Prove("short", "x").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "32 bytes, this one 5")) << s;
  // The all-zero point makes every shared secret zero: refused.
  s = a->Prove(std::string(WorkerIdentity::kKeyBytes, '\0'), "x").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(a->Verify("", "x", "").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton
