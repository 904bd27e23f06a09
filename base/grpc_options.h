// Channel and server settings shared by every gRPC endpoint in baton.
//
// Thread-safety: stateless.
#ifndef BATON_BASE_GRPC_OPTIONS_H_
#define BATON_BASE_GRPC_OPTIONS_H_

#include <cstdint>
#include <memory>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/time/time.h"
#include "base/tls.h"

namespace baton {

// Metadata key carrying the job token on every call.
inline constexpr char kTokenMetadataKey[] = "x-baton-token";

// Arguments for a channel to another baton process: no HTTP proxy (jobs talk
// to their own hosts), fast reconnect backoff (peers may start late),
// keepalive to notice a silent peer, and the given message limit. With TLS
// and a server_name, peers' certificates are checked against that name.
// `silence_timeout`: how long the connection outlives silence (data or a
// keepalive ping unanswered: TCP_USER_TIMEOUT and the keepalive's timeout)
// before it breaks, so that a partition shorter than it costs no
// connection (the agent passes its partition tolerance).
inline constexpr absl::Duration kDefaultSilenceTimeout = absl::Seconds(30);
grpc::ChannelArguments BatonChannelArguments(
    int64_t max_message_bytes, const TlsConfig& tls = {},
    absl::Duration silence_timeout = kDefaultSilenceTimeout);

// Credentials of every baton endpoint (base/tls.h): plain text without TLS;
// with it, mutual TLS: a server requires and verifies the client's
// certificate against the job's CA, a channel verifies the server's.
std::shared_ptr<grpc::ServerCredentials> BatonServerCredentials(const TlsConfig& tls);
std::shared_ptr<grpc::ChannelCredentials> BatonChannelCredentials(const TlsConfig& tls);

// The matching server side: no port sharing, keepalive pings from clients
// accepted, and the same bulk-transfer windows and message limit.
void ApplyBatonServerArguments(grpc::ServerBuilder& builder, int64_t max_message_bytes);

}  // namespace baton

#endif  // BATON_BASE_GRPC_OPTIONS_H_
