// libFuzzer target: the rendezvous store server's request handling
// (store/store_server.cc over store/memory_store.cc). The server runs in this
// process on a Unix-domain socket, so no network is involved; each request's
// bytes go to it unparsed (a generic stub), exactly as a client's would, and
// the server decodes and handles them against its in-memory store.
//
// Input: up to 16 requests, each u8 method (Set, Get, Add, CompareSet, Wait,
// Delete, NumKeys), u8 token mode (low bits 0: the job token, 1: none, 2:
// the bytes that follow, made printable; bit 7: the request is built from
// fields), then either the serialized request (u16 length and bytes) or its
// fields (see Build: keys are "k0".."k3", numbers u64, strings u16 length
// and bytes), then for token mode 2 the token (u16 length and bytes).
//
// Blocking calls wait at most 1 ms: a request that parses with a longer
// timeout_ms is sent with 1. Keys the input touched are deleted afterwards
// so that every input starts from an empty store.
//
// Checks, besides the sanitizers: every call completes with OK or one of the
// codes the server documents (UNAUTHENTICATED, INVALID_ARGUMENT,
// OUT_OF_RANGE, DEADLINE_EXCEEDED, and INTERNAL for bytes that do not parse).
#include <unistd.h>

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/grpc_options.h"
#include "fuzz/fuzz_input.h"
#include "proto/store.pb.h"
#include "store/store_server.h"

namespace baton::store {
namespace {

constexpr char kToken[] = "fuzz-token";

struct State {
  std::string socket;
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<grpc::GenericStub> stub;
};
State* state = nullptr;

void Stop() {
  if (state == nullptr) return;
  state->server->Shutdown(absl::ZeroDuration());
  unlink(state->socket.c_str());
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

// Parses `bytes` as a request of type R; if it parses, lets `edit` bound it
// and serializes it again, and reports the key(s) it names.
template <typename R, typename Edit>
void Inspect(std::string& bytes, std::set<std::string>* keys, Edit edit) {
  R req;
  if (!req.ParseFromString(bytes)) return;
  edit(req, keys);
  bytes = req.SerializeAsString();
}

// A request of `method` from fields, serialized.
std::string Build(int method, fuzz::FuzzReader& in) {
  const auto key = [&in] { return absl::StrCat("k", in.U8() % 4); };
  switch (method) {
    case 0: {
      proto::SetRequest r;
      r.set_key(key());
      r.set_value(in.Chunk());
      return r.SerializeAsString();
    }
    case 1: {
      proto::GetRequest r;
      r.set_key(key());
      r.set_timeout_ms(static_cast<int64_t>(in.U64()));
      return r.SerializeAsString();
    }
    case 2: {
      proto::AddRequest r;
      r.set_key(key());
      r.set_delta(static_cast<int64_t>(in.U64()));
      return r.SerializeAsString();
    }
    case 3: {
      proto::CompareSetRequest r;
      r.set_key(key());
      r.set_expected(in.Chunk());
      r.set_desired(in.Chunk());
      return r.SerializeAsString();
    }
    case 4: {
      proto::WaitRequest r;
      for (int i = in.U8() % 4; i > 0; --i) r.add_keys(key());
      r.set_timeout_ms(static_cast<int64_t>(in.U64()));
      return r.SerializeAsString();
    }
    case 5: {
      proto::DeleteRequest r;
      r.set_key(key());
      return r.SerializeAsString();
    }
    default: return std::string();
  }
}

}  // namespace
}  // namespace baton::store

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace baton::store;
  google::protobuf::SetLogHandler(nullptr);
  state = new State();
  state->socket = absl::StrCat("/tmp/baton-store-fuzz.", getpid(), ".sock");
  unlink(state->socket.c_str());
  StoreServerOptions options;
  options.address = absl::StrCat("unix:", state->socket);
  options.job_token = kToken;
  auto server = StoreServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "store_fuzzer: %s\n", server.status().ToString().c_str());
    std::abort();
  }
  state->server = *std::move(server);
  state->stub = std::make_unique<grpc::GenericStub>(grpc::CreateChannel(
      absl::StrCat("unix:", state->socket), grpc::InsecureChannelCredentials()));
  std::atexit(Stop);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::store;
  static const char* const kMethods[] = {"Set",  "Get",    "Add",    "CompareSet",
                                         "Wait", "Delete", "NumKeys"};
  baton::fuzz::FuzzReader in(data, size);
  std::set<std::string> keys;
  for (int n = 0; n < 16 && !in.empty(); ++n) {
    const int method = in.U8() % 7;
    const uint8_t mode = in.U8();
    const int token_mode = (mode & 0x7f) % 3;
    std::string bytes = (mode & 0x80) != 0 ? Build(method, in) : in.Chunk();
    std::string token = kToken;
    if (token_mode == 2) {
      token = in.Chunk();
      for (char& c : token) c = static_cast<char>(0x20 + static_cast<uint8_t>(c) % 0x5f);
    }
    const auto bound = [](auto& req, std::set<std::string>*) {
      if (req.timeout_ms() > 1) req.set_timeout_ms(1);
    };
    const auto key = [](auto& req, std::set<std::string>* k) { k->insert(req.key()); };
    switch (method) {
      case 0: Inspect<baton::proto::SetRequest>(bytes, &keys, key); break;
      case 1: Inspect<baton::proto::GetRequest>(bytes, &keys, bound); break;
      case 2: Inspect<baton::proto::AddRequest>(bytes, &keys, key); break;
      case 3: Inspect<baton::proto::CompareSetRequest>(bytes, &keys, key); break;
      case 4: Inspect<baton::proto::WaitRequest>(bytes, &keys, bound); break;
      default: break;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    if (token_mode != 1) ctx.AddMetadata(baton::kTokenMetadataKey, token);
    const grpc::ByteBuffer request = ToBuffer(bytes);
    grpc::ByteBuffer response;
    grpc::Status status;
    absl::Notification done;
    state->stub->UnaryCall(&ctx, absl::StrCat("/baton.proto.Store/", kMethods[method]),
                           grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
                             status = std::move(s);
                             done.Notify();
                           });
    done.WaitForNotification();
    switch (status.error_code()) {
      case grpc::StatusCode::OK:
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::OUT_OF_RANGE:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
      case grpc::StatusCode::INTERNAL: break;
      default:
        std::fprintf(stderr, "store_fuzzer: %s failed with code %d: %s\n", kMethods[method],
                     static_cast<int>(status.error_code()), status.error_message().c_str());
        std::abort();
    }
  }
  for (const std::string& k : keys) (void)state->server->store().Delete(k);
  return 0;
}
