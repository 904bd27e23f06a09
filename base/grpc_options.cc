#include "base/grpc_options.h"

#include <algorithm>
#include <climits>

namespace baton {

namespace {

int Limit(int64_t max_message_bytes) {
  return static_cast<int>(std::min<int64_t>(max_message_bytes, INT_MAX));
}

// Bulk tensors: large flow-control windows and read chunks, so a big message
// is not throttled to many small windows and reads. Shared by both sides.
template <typename SetInt>
void ApplyBulkTuning(SetInt set) {
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20);
  set(GRPC_ARG_TCP_READ_CHUNK_SIZE, 1 << 20);
  set(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256 << 10);
  set(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16 << 20);
}

}  // namespace

grpc::ChannelArguments BatonChannelArguments(int64_t max_message_bytes, const TlsConfig& tls,
                                             absl::Duration silence_timeout) {
  grpc::ChannelArguments args;
  if (tls.enabled() && !tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  const int limit = Limit(max_message_bytes);
  args.SetMaxReceiveMessageSize(limit);
  args.SetMaxSendMessageSize(limit);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  // Reconnect soon (100 ms, gRPC's floor, growing to 500 ms) to a peer or
  // store that is not up yet or restarted. Despite its name, gRPC uses
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS as the time each connection attempt
  // (TCP, TLS and HTTP/2 handshakes) may take: it stays at gRPC's 20 s, so
  // a slow link or a loaded host still connects (tests/store/store_test.cc,
  // tests/rpc/grpc_transport_test.cc). Calls are bounded by their own deadlines.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  // Also gRPC's TCP_USER_TIMEOUT: unacknowledged data breaks the
  // connection after this long.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(silence_timeout), 1000,
                                                   3600 * 1000)));
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  ApplyBulkTuning([&args](const char* key, int value) { args.SetInt(key, value); });
  // Each channel gets its own connection, even to the same address.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

void ApplyBatonServerArguments(grpc::ServerBuilder& builder, int64_t max_message_bytes) {
  builder.SetMaxReceiveMessageSize(Limit(max_message_bytes));
  builder.SetMaxSendMessageSize(Limit(max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  ApplyBulkTuning(
      [&builder](const char* key, int value) { builder.AddChannelArgument(key, value); });
}

std::shared_ptr<grpc::ServerCredentials> BatonServerCredentials(const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = tls.ca_pem;
  o.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> BatonChannelCredentials(const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls.ca_pem;
  o.pem_private_key = tls.key_pem;
  o.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(o);
}

}  // namespace baton
