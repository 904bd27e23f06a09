// Plain and TLS connections of the bulk channel (connection.h).
//
// TLS runs over a non-blocking socket so that the reader and the writer of
// one connection can share it: each OpenSSL call on the SSL object is made
// under the connection's lock and never blocks; waiting for the socket
// (poll) happens outside the lock, so a reader waiting for bytes never holds
// up the writer. Reads go through a large read-ahead buffer, so one recv
// brings many TLS records.
#include "rpc/channel/tcp/connection.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/channel/tcp/socket_io.h"

namespace baton::rpc::internal::tcp {

bool Connection::Discard(uint64_t n) {
  char sink[64 << 10];
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, sizeof sink));
    if (!ReadAll(sink, chunk)) return false;
    n -= chunk;
  }
  return true;
}

namespace {

class Plain final : public Connection {
 public:
  explicit Plain(int fd) : fd_(fd) {}
  bool ReadAll(void* dst, size_t n) override { return tcp::ReadAll(fd_, dst, n); }
  bool WriteAll(std::vector<iovec> iov) override { return tcp::WriteAll(fd_, std::move(iov)); }
  void SetTimeout(absl::Duration d) override { tcp::SetTimeout(fd_, d); }

 private:
  const int fd_;
};

// OpenSSL's error queue of this thread, as text (and emptied).
std::string SslErrors() {
  std::string out;
  char buf[256];
  while (unsigned long e = ERR_get_error()) {
    ERR_error_string_n(e, buf, sizeof buf);
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "no detail" : out;
}

// OpenSSL's passphrase callback: none. An encrypted key fails to load
// instead of prompting on the terminal.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) { return -1; }

// Each PEM block of `pem`, parsed by `read` (PEM_read_bio_X509, ...).
template <typename T, typename Read>
std::vector<T*> PemBlocks(const std::string& pem, Read read) {
  std::vector<T*> out;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return out;
  while (T* item = read(bio, nullptr, &NoPassphrase, nullptr)) out.push_back(item);
  ERR_clear_error();  // the end of the blocks reads as an error
  BIO_free(bio);
  return out;
}

}  // namespace

struct TlsContext::Impl {
  SSL_CTX* ctx = nullptr;
  std::string server_name;
  ~Impl() {
    if (ctx != nullptr) SSL_CTX_free(ctx);
  }
};

TlsContext::~TlsContext() = default;

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Create(const TlsConfig& config) {
  std::shared_ptr<TlsContext> out(new TlsContext());
  out->impl_ = std::make_unique<Impl>();
  out->impl_->server_name = config.server_name;
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("TLS context: ", SslErrors()));
  out->impl_->ctx = ctx;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // AES-128-GCM first: the fastest with AES-NI, and what the bulk path is for.
  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384");
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: connections are few and long
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_default_read_buffer_len(ctx, 256 << 10);
  SSL_CTX_set_read_ahead(ctx, 1);

  auto certs = PemBlocks<X509>(config.cert_pem, PEM_read_bio_X509);
  auto keys = PemBlocks<EVP_PKEY>(config.key_pem, PEM_read_bio_PrivateKey);
  auto cas = PemBlocks<X509>(config.ca_pem, PEM_read_bio_X509);
  absl::Status status;
  if (certs.empty() || keys.empty() || cas.empty()) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "TLS for the bulk channel: no ",
        certs.empty()  ? "certificate"
        : keys.empty() ? "private key"
                       : "CA certificate",
        " could be read from its PEM", keys.empty() ? " (an encrypted key is not supported)" : ""));
  } else if (SSL_CTX_use_certificate(ctx, certs[0]) != 1 ||
             SSL_CTX_use_PrivateKey(ctx, keys[0]) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    status = absl::InvalidArgumentError(
        absl::StrCat("TLS for the bulk channel: certificate or key refused: ", SslErrors()));
  } else {
    for (size_t i = 1; i < certs.size() && status.ok(); ++i) {
      if (SSL_CTX_add1_chain_cert(ctx, certs[i]) != 1) {
        status = absl::InvalidArgumentError(
            absl::StrCat("TLS for the bulk channel: certificate chain refused: ", SslErrors()));
      }
    }
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    for (X509* ca : cas) {
      if (status.ok() && X509_STORE_add_cert(store, ca) != 1) {
        status = absl::InvalidArgumentError(
            absl::StrCat("TLS for the bulk channel: CA certificate refused: ", SslErrors()));
      }
    }
    // OpenSSL fills each certificate's cache of decoded extensions on first
    // use, checking whether it did without a lock; handshakes of several
    // connections at once (the lanes, B10) would race on that first fill.
    // Filled here, before any handshake.
    for (X509* c : certs) X509_check_purpose(c, -1, 0);
    for (X509* ca : cas) X509_check_purpose(ca, -1, 0);
  }
  for (X509* c : certs) X509_free(c);
  for (EVP_PKEY* k : keys) EVP_PKEY_free(k);
  for (X509* c : cas) X509_free(c);
  if (!status.ok()) return status;
  return std::shared_ptr<const TlsContext>(std::move(out));
}

class TlsConnection final : public Connection {
 public:
  TlsConnection(int fd, std::shared_ptr<const TlsContext> context, SSL* ssl)
      : fd_(fd), context_(std::move(context)), ssl_(ssl) {}
  ~TlsConnection() override { SSL_free(ssl_); }

  // The handshake, as client (`peer_host` checked) or server.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(int fd,
                                                          std::shared_ptr<const TlsContext> context,
                                                          const std::string* peer_host,
                                                          absl::Duration timeout);

  bool ReadAll(void* dst, size_t n) override {
    return Whole(static_cast<char*>(dst), n, [](SSL* ssl, char* p, size_t left) {
      return SSL_read(ssl, p, static_cast<int>(std::min<size_t>(left, INT_MAX)));
    });
  }

  bool WriteAll(std::vector<iovec> iov) override {
    for (const iovec& piece : iov) {
      const bool ok = Whole(
          static_cast<char*>(piece.iov_base), piece.iov_len, [](SSL* ssl, char* p, size_t left) {
            return SSL_write(ssl, p, static_cast<int>(std::min<size_t>(left, 1 << 20)));
          });
      if (!ok) return false;
    }
    return true;
  }

  void SetTimeout(absl::Duration d) override {
    absl::MutexLock lock(&mu_);
    timeout_ = d;
  }

 private:
  // Moves all `n` bytes at `p` by `io` (SSL_read or SSL_write of up to
  // `left` bytes, called under the lock), waiting for the socket between
  // calls as OpenSSL asks; false when a call failed for good.
  template <typename Io>
  bool Whole(char* p, size_t n, Io io) {
    while (n > 0) {
      int error;
      const int moved = Locked([&](SSL* ssl) { return io(ssl, p, n); }, &error);
      if (moved > 0) {
        p += moved;
        n -= static_cast<size_t>(moved);
      } else if (!Wait(error, absl::InfiniteFuture())) {
        return false;
      }
    }
    return true;
  }

  // One OpenSSL call on the connection, under its lock: the call's result,
  // and in `error` why it made no progress (SSL_ERROR_NONE when it did).
  template <typename Call>
  int Locked(Call call, int* error) {
    absl::MutexLock lock(&mu_);
    ERR_clear_error();  // SSL_get_error reads this thread's queue
    const int r = call(ssl_);
    *error = r > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl_, r);
    if (r <= 0) ERR_clear_error();
    return r;
  }

  // Waits for the socket as an OpenSSL call that returned `error` asks,
  // within the timeout and before `deadline`; false when the call failed for
  // good or the wait ran out.
  bool Wait(int error, absl::Time deadline) {
    short events;
    if (error == SSL_ERROR_WANT_READ) {
      events = POLLIN;
    } else if (error == SSL_ERROR_WANT_WRITE) {
      events = POLLOUT;
    } else {
      return false;  // the end of the stream, a reset, a bad record
    }
    absl::Duration timeout;
    {
      absl::MutexLock lock(&mu_);
      timeout = timeout_;
    }
    if (timeout > absl::ZeroDuration()) deadline = std::min(deadline, absl::Now() + timeout);
    for (;;) {
      pollfd p{fd_, events, 0};
      int wait_ms = -1;
      if (deadline != absl::InfiniteFuture()) {
        wait_ms = static_cast<int>(
            std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()), 0, INT_MAX));
      }
      const int ready = poll(&p, 1, wait_ms);
      if (ready < 0 && errno == EINTR) continue;
      // Readable also means closed or failed: the next call says which.
      return ready > 0;
    }
  }

  const int fd_;
  const std::shared_ptr<const TlsContext> context_;  // outlives ssl_
  absl::Mutex mu_;
  SSL* const ssl_ ABSL_PT_GUARDED_BY(mu_);
  absl::Duration timeout_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

absl::StatusOr<std::unique_ptr<Connection>> TlsConnection::Open(
    int fd, std::shared_ptr<const TlsContext> context, const std::string* peer_host,
    absl::Duration timeout) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(
        absl::StrCat("TLS: cannot make the socket non-blocking: errno ", errno));
  }
  SSL* ssl = SSL_new(context->impl_->ctx);
  if (ssl == nullptr) return absl::InternalError(absl::StrCat("TLS: ", SslErrors()));
  // Nobody else has the connection until it is returned: `ssl` is used
  // without its lock meanwhile.
  auto conn = std::make_unique<TlsConnection>(fd, context, ssl);
  SSL_set_fd(ssl, fd);
  if (peer_host != nullptr) {
    // The dialling side checks the name, as the gRPC streams do.
    const std::string& name =
        context->impl_->server_name.empty() ? *peer_host : context->impl_->server_name;
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) != 1) {
      ERR_clear_error();  // not an address: a host name
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      if (SSL_set1_host(ssl, name.c_str()) != 1) {
        return absl::InvalidArgumentError(absl::StrCat("TLS: bad peer name '", name, "'"));
      }
      if (SSL_set_tlsext_host_name(ssl, name.c_str()) != 1) {
        return absl::InvalidArgumentError(absl::StrCat("TLS: bad peer name '", name, "'"));
      }
    }
    SSL_set_verify(ssl, SSL_VERIFY_PEER, nullptr);
    SSL_set_connect_state(ssl);
  } else {
    SSL_set_verify(ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    SSL_set_accept_state(ssl);
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    ERR_clear_error();  // SSL_get_error reads this thread's queue
    const int r = SSL_do_handshake(ssl);
    if (r == 1) break;
    const int error = SSL_get_error(ssl, r);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      if (conn->Wait(error, deadline) && absl::Now() < deadline) continue;
      if (absl::Now() >= deadline) return absl::DeadlineExceededError("TLS handshake: timed out");
      return absl::UnavailableError("TLS handshake: the connection failed");
    }
    const long verify = SSL_get_verify_result(ssl);
    const bool no_certificate =
        ERR_GET_REASON(ERR_peek_error()) == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE;
    const std::string detail = SslErrors();
    if (no_certificate) {
      return absl::UnauthenticatedError("TLS handshake: the peer presented no certificate");
    }
    if (verify != X509_V_OK) {
      return absl::UnauthenticatedError(absl::StrCat("TLS handshake: the peer's certificate: ",
                                                     X509_verify_cert_error_string(verify)));
    }
    return absl::UnavailableError(absl::StrCat("TLS handshake failed: ", detail));
  }
  return std::unique_ptr<Connection>(std::move(conn));
}

std::unique_ptr<Connection> PlainConnection(int fd) { return std::make_unique<Plain>(fd); }

void BlockSigpipeOnThisThread() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

absl::StatusOr<std::unique_ptr<Connection>> TlsClientConnection(
    int fd, std::shared_ptr<const TlsContext> context, const std::string& address,
    absl::Duration timeout) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return TlsConnection::Open(fd, std::move(context), &host, timeout);
}

absl::StatusOr<std::unique_ptr<Connection>> TlsServerConnection(
    int fd, std::shared_ptr<const TlsContext> context, absl::Duration timeout) {
  return TlsConnection::Open(fd, std::move(context), nullptr, timeout);
}

}  // namespace baton::rpc::internal::tcp
