// The byte stream of one bulk-channel connection (bulk_channel.h): plain
// TCP, or mutual TLS over it when the job has TLS (base/tls.h). Internal to
// //rpc/channel/tcp.
//
// Contract:
// - TLS is the job's: each side presents its certificate from the job's CA
//   and checks the other's against that CA; the side that dialled also
//   checks the name (TlsConfig::server_name when set, else the host it
//   dialled, as the gRPC streams do). TLS 1.3 only, AES-GCM first.
// - ReadAll/WriteAll/Discard move whole buffers or fail (false): the end of
//   the stream, an error, a failed TLS record, or the timeout set by
//   SetTimeout (none by default). They ride out EINTR and never raise
//   SIGPIPE.
// - A TLS write to a peer that closed raises SIGPIPE on the writing thread
//   (OpenSSL writes with write(2)): threads that use TLS connections call
//   BlockSigpipeOnThisThread() first; the signal then stays pending on that
//   thread, harmless, and ends with it.
// - The connection borrows its socket: the caller closes it after the
//   Connection is gone, and interrupts a blocked ReadAll/WriteAll with
//   shutdown(2) on it, from any thread.
//
// Thread-safety: at most one reader (ReadAll, Discard) and one writer
// (WriteAll) at a time, on different threads if need be (the sender's
// acknowledgement reader beside its record writer); SetTimeout before both.
// A TlsContext is immutable once made and shared by its connections.
#ifndef BATON_RPC_CHANNEL_TCP_CONNECTION_H_
#define BATON_RPC_CHANNEL_TCP_CONNECTION_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/tls.h"

namespace baton::rpc::internal::tcp {

// The job's certificate, key and CA, loaded once for every connection.
class TlsContext {
 public:
  // INVALID_ARGUMENT when a PEM block cannot be parsed or the key does not
  // match the certificate.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> Create(const TlsConfig& config);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

 private:
  friend class TlsConnection;
  TlsContext() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Connection {
 public:
  virtual ~Connection() = default;
  virtual bool ReadAll(void* dst, size_t n) = 0;
  virtual bool WriteAll(std::vector<iovec> iov) = 0;
  // zero: none.
  virtual void SetTimeout(absl::Duration d) = 0;
  // Reads and drops n bytes.
  bool Discard(uint64_t n);
};

// See the contract: for the threads that read and write TLS connections.
void BlockSigpipeOnThisThread();

// Plain TCP on `fd`.
std::unique_ptr<Connection> PlainConnection(int fd);

// TLS on `fd`, the handshake done within `timeout`: as the side that
// dialled `address` ("host:port"), or as the side that accepted. An error
// says why the handshake failed (UNAUTHENTICATED for the peer's certificate).
absl::StatusOr<std::unique_ptr<Connection>> TlsClientConnection(
    int fd, std::shared_ptr<const TlsContext> context, const std::string& address,
    absl::Duration timeout);
absl::StatusOr<std::unique_ptr<Connection>> TlsServerConnection(
    int fd, std::shared_ptr<const TlsContext> context, absl::Duration timeout);

}  // namespace baton::rpc::internal::tcp

#endif  // BATON_RPC_CHANNEL_TCP_CONNECTION_H_
