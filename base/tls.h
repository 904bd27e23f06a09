// TLS settings of a job: with them, every gRPC endpoint between baton
// processes (the rendezvous store, the RPC streams, the launcher's
// rendezvous) uses mutual TLS: each side presents a certificate signed by
// the job's CA and refuses a peer whose certificate is not. The job token is
// still checked on every call.
//
// Contract:
// - TlsFiles names three PEM files: the CA that signed every node's
//   certificate, this node's certificate (chain), and its private key. All
//   three or none.
// - LoadTls reads them once (at start-up, so a missing file fails at once and
//   names itself). Errors: INVALID_ARGUMENT when only some are given or a file
//   holds no PEM block ("-----BEGIN"), NOT_FOUND when one cannot be read.
// - Peers are checked against `server_name` when set (every node's
//   certificate then carries that name, e.g. one job-wide name), else against
//   the host of the address dialled (each node's certificate carries its own
//   address or host name as a subjectAltName).
//
// Thread-safety: plain values; LoadTls is stateless.
#ifndef BATON_BASE_TLS_H_
#define BATON_BASE_TLS_H_

#include <string>

#include "absl/status/statusor.h"

namespace baton {

struct TlsFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string server_name;
  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// The PEM contents, as gRPC takes them. Empty ca_pem: plain text.
struct TlsConfig {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string server_name;
  bool enabled() const { return !ca_pem.empty(); }
};

absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files);

}  // namespace baton

#endif  // BATON_BASE_TLS_H_
