// Reading a job's TLS files (tls.h).
#include "base/tls.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_io.h"

namespace baton {

absl::StatusOr<TlsConfig> LoadTls(const TlsFiles& files) {
  TlsConfig out;
  out.server_name = files.server_name;
  if (!files.enabled()) return out;
  struct Part {
    const char* what;
    const std::string* path;
    std::string* pem;
  } parts[] = {{"CA certificate (--tls_ca, BATON_TLS_CA)", &files.ca_file, &out.ca_pem},
               {"certificate (--tls_cert, BATON_TLS_CERT)", &files.cert_file, &out.cert_pem},
               {"private key (--tls_key, BATON_TLS_KEY)", &files.key_file, &out.key_pem}};
  for (const Part& p : parts) {
    if (p.path->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TLS needs a CA certificate, a certificate and a private key; the ", p.what,
                       " is missing"));
    }
    auto pem = ReadFile(*p.path);
    if (!pem.ok()) {
      return absl::NotFoundError(absl::StrCat("TLS ", p.what, ": cannot read ", *p.path));
    }
    if (!absl::StrContains(*pem, "-----BEGIN")) {
      return absl::InvalidArgumentError(
          absl::StrCat("TLS ", p.what, ": ", *p.path, " holds no PEM block"));
    }
    *p.pem = *std::move(pem);
  }
  return out;
}

}  // namespace baton
