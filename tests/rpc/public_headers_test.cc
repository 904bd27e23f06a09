// The public headers of the RPC, RRef and distributed-autograd layers pull in
// no gRPC header (gRPC is an implementation detail of rpc/internal/ and
// store/): users compile against baton without gRPC's headers, and the
// transport can change without touching them.
#include "dist_autograd/dist_autograd.h"
#include "rpc/agent.h"
#include "rpc/transport.h"
#include "rref/rref.h"

#if defined(GRPCPP_GRPCPP_H) || defined(GRPC_GRPC_H) || defined(GRPCPP_SUPPORT_STATUS_H) || \
    defined(GRPCPP_SUPPORT_SLICE_H) || defined(GRPCPP_SUPPORT_BYTE_BUFFER_H) ||             \
    defined(GRPC_SUPPORT_PORT_PLATFORM_H)
#error "a public header of rpc/, rref/ or dist_autograd/ includes gRPC"
#endif

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(PublicHeaders, CompileWithoutGrpc) {
  // The check is the #if above; this only gives the binary a test to run.
  rpc::AgentOptions options;
  EXPECT_EQ(options.transport.local_transport, rpc::AgentOptions::LocalTransport::kShm);
}

}  // namespace
}  // namespace baton
