#include "base/identity.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace baton {

struct WorkerIdentity::Key {
  EVP_PKEY* pkey = nullptr;
  ~Key() { EVP_PKEY_free(pkey); }
};

namespace {

// X25519 of our private key and `peer_key`: the secret both sides share.
absl::StatusOr<std::string> SharedSecret(EVP_PKEY* mine, absl::string_view peer_key) {
  if (peer_key.size() != WorkerIdentity::kKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an identity key has ", WorkerIdentity::kKeyBytes, " bytes, this one ", peer_key.size()));
  }
  EVP_PKEY* peer = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_X25519, nullptr, reinterpret_cast<const unsigned char*>(peer_key.data()),
      peer_key.size());
  if (peer == nullptr) return absl::InvalidArgumentError("not an X25519 public key");
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new(mine, nullptr);
  std::string secret(WorkerIdentity::kKeyBytes, '\0');
  size_t len = secret.size();
  // OpenSSL refuses the low-order points (the derived secret would be all
  // zero) in EVP_PKEY_derive.
  const bool ok =
      ctx != nullptr && EVP_PKEY_derive_init(ctx) == 1 &&
      EVP_PKEY_derive_set_peer(ctx, peer) == 1 &&
      EVP_PKEY_derive(ctx, reinterpret_cast<unsigned char*>(secret.data()), &len) == 1 &&
      len == secret.size();
  EVP_PKEY_CTX_free(ctx);
  EVP_PKEY_free(peer);
  if (!ok) return absl::InvalidArgumentError("an identity key that derives no shared secret");
  return secret;
}

}  // namespace

absl::StatusOr<WorkerIdentity> WorkerIdentity::Generate() {
  auto key = std::make_shared<Key>();
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr);
  const bool made =
      ctx != nullptr && EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &key->pkey) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!made) return absl::InternalError("could not generate an X25519 identity key");
  std::string pub(kKeyBytes, '\0');
  size_t len = pub.size();
  if (EVP_PKEY_get_raw_public_key(key->pkey, reinterpret_cast<unsigned char*>(pub.data()), &len) !=
          1 ||
      len != kKeyBytes) {
    return absl::InternalError("could not read an X25519 public key");
  }
  return WorkerIdentity(std::move(key), std::move(pub));
}

absl::StatusOr<std::string> WorkerIdentity::Prove(absl::string_view peer_key,
                                                  absl::string_view statement) const {
  ASSIGN_OR_RETURN(auto secret, SharedSecret(key_->pkey, peer_key));
  std::string mac(kProofBytes, '\0');
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(statement.data()), statement.size(),
           reinterpret_cast<unsigned char*>(mac.data()), &len) == nullptr ||
      len != kProofBytes) {
    return absl::InternalError("HMAC-SHA256 failed");
  }
  OPENSSL_cleanse(secret.data(), secret.size());
  return mac;
}

absl::Status WorkerIdentity::Verify(absl::string_view peer_key, absl::string_view statement,
                                    absl::string_view proof) const {
  ASSIGN_OR_RETURN(auto expected, Prove(peer_key, statement));
  if (proof.size() != expected.size() ||
      CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) != 0) {
    return absl::PermissionDeniedError("the proof does not match the key registered for it");
  }
  return absl::OkStatus();
}

}  // namespace baton
