// Blocking socket helpers of the bulk channel (bulk_channel.h): whole
// reads and writes that ride out EINTR and never raise SIGPIPE, a connect
// with a timeout, and the socket options that set a connection's tolerance
// of silence. Internal to //rpc/channel/tcp.
//
// Thread-safety: functions only, no state; a file descriptor is used by
// one thread at a time, as the caller arranges.
#ifndef BATON_RPC_CHANNEL_TCP_SOCKET_IO_H_
#define BATON_RPC_CHANNEL_TCP_SOCKET_IO_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace baton::rpc::internal::tcp {

// Reads exactly n bytes; false at the end of the stream, an error, or a
// receive timeout (SetTimeout).
bool ReadAll(int fd, void* dst, size_t n);
// Reads and drops n bytes.
bool Discard(int fd, uint64_t n);
// Writes every byte of `iov`; false on an error (EPIPE, not SIGPIPE).
bool WriteAll(int fd, std::vector<iovec> iov);
// SO_RCVTIMEO and SO_SNDTIMEO (zero: none).
void SetTimeout(int fd, absl::Duration d);
void NoDelay(int fd);
// A connection outlives `silence` and no more (TCP_USER_TIMEOUT, keepalive).
void Tolerate(int fd, absl::Duration silence);
// A blocking connection to "host:port" or "[v6]:port" within `timeout`; -1
// if none.
int Connect(const std::string& address, absl::Duration timeout);
// Equal bytes, compared in time independent of where they differ.
bool SameBytes(const std::string& a, const std::string& b);

}  // namespace baton::rpc::internal::tcp

#endif  // BATON_RPC_CHANNEL_TCP_SOCKET_IO_H_
