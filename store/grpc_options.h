// Channel and server settings shared by every gRPC endpoint in baton.
//
// Thread-safety: stateless.
#ifndef BATON_STORE_GRPC_OPTIONS_H_
#define BATON_STORE_GRPC_OPTIONS_H_

#include <cstdint>

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

namespace baton {

// Metadata key carrying the job token on every call.
inline constexpr char kTokenMetadataKey[] = "x-baton-token";

// Arguments for a channel to another baton process: no HTTP proxy (jobs talk
// to their own hosts), fast reconnect backoff (peers may start late),
// keepalive to notice a silent peer, and the given message limit.
grpc::ChannelArguments BatonChannelArguments(int64_t max_message_bytes);

// The matching server side: no port sharing, keepalive pings from clients
// accepted, and the same bulk-transfer windows and message limit.
void ApplyBatonServerArguments(grpc::ServerBuilder& builder, int64_t max_message_bytes);

}  // namespace baton

#endif  // BATON_STORE_GRPC_OPTIONS_H_
