// WorkerIdentity: the key pair one incarnation of a worker proves itself
// with when it opens a stream to another worker (docs/flow_control.md, W1-W3).
//
// Every worker of a job holds the job token, so the token says "a member of
// this job", not "which member". Each incarnation therefore makes a fresh
// X25519 key pair at start-up and publishes the public half in its
// registration. Two workers A and B can both compute one secret that nobody
// else can: X25519 of A's private key and B's public key equals X25519 of
// B's private key and A's public key. A proof is an HMAC-SHA256, under that
// secret, of a statement (who opens the stream, to whom); the other side
// recomputes it from its own private key and the opener's public key.
//
// Contract:
// - Generate() makes a fresh pair from the system's random source.
//   INTERNAL if the crypto library fails.
// - Prove(peer_key, statement): 32 bytes. INVALID_ARGUMENT if `peer_key`
//   is not a 32-byte X25519 public key, or one of the degenerate keys that
//   make every shared secret zero.
// - Verify(peer_key, statement, proof): OK if `proof` is what the holder of
//   `peer_key`'s private half would prove to this identity for
//   `statement`; PERMISSION_DENIED otherwise (compared in constant time);
//   INVALID_ARGUMENT as Prove for a bad key.
// - A proof binds the two key pairs and the statement only; it carries no
//   time. Whoever can read a stream's metadata can replay its proof for the
//   same statement, so use TLS (base/tls.h) where links can be read.
//
// Thread-safety: immutable after Generate(); copies share the key.
#ifndef BATON_BASE_IDENTITY_H_
#define BATON_BASE_IDENTITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

class WorkerIdentity {
 public:
  static constexpr size_t kKeyBytes = 32;
  static constexpr size_t kProofBytes = 32;

  static absl::StatusOr<WorkerIdentity> Generate();

  // The public half (kKeyBytes raw bytes), for the registration.
  const std::string& public_key() const { return public_key_; }

  absl::StatusOr<std::string> Prove(absl::string_view peer_key, absl::string_view statement) const;
  absl::Status Verify(absl::string_view peer_key, absl::string_view statement,
                      absl::string_view proof) const;

 private:
  struct Key;
  WorkerIdentity(std::shared_ptr<const Key> key, std::string public_key)
      : key_(std::move(key)), public_key_(std::move(public_key)) {}

  std::shared_ptr<const Key> key_;
  std::string public_key_;
};

}  // namespace baton

#endif  // BATON_BASE_IDENTITY_H_
