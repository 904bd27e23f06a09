// libFuzzer target: the decode path of the RRef protocol's messages (rref/)
// and the bookkeeping they drive (rref/rref_context.cc), on one worker whose
// peers are hostile.
//
// What is fuzzed, all from the same input:
// - control messages ("__rref.control": proto::RRefControl), dispatched to
//   RRefContext as RRefService's handler does;
// - RRef call headers (TakeHeader, the prefix of "__rref.remote",
//   "__rref.fetch" and "__rref.method" payloads), followed by what the
//   remote and fetch handlers do with them;
// - RRefs inside a codec payload (Codec<RRef<T>>::Decode) and fork
//   descriptors adopted by RRefContext::Adopt;
// - the worker's own operations in between (create, fork, drop a
//   reference), so hostile messages meet every state;
// - peer failures (G7: RRefContext::OnPeerFailure) of any worker and
//   incarnation, between and after the messages of the dead.
// Handlers that need a running agent are not called; the parts of them that
// read the message are.
//
// Input: up to 64 operations, each a u8 opcode and its fields (see Step).
// Ids are drawn from a small range so that messages name live references.
//
// Checks: the sanitizers; a decode error is DATA_LOSS, INVALID_ARGUMENT or
// FAILED_PRECONDITION, never a crash.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "fuzz/fuzz_input.h"
#include "proto/rref.pb.h"
#include "rpc/codec.h"
#include "rref/rref.h"
#include "rref/rref_context.h"
#include "rref/rref_service.h"

namespace baton::rref {
namespace {

constexpr int kSelf = 0;

// Every message to a peer is answered at once.
class AnsweringSender : public ControlSender {
 public:
  rpc::Future<void> ForkRequest(int, RRefId, ForkId, int) override { return Answer(); }
  rpc::Future<void> ChildAccept(int, RRefId, ForkId) override { return Answer(); }
  rpc::Future<void> UserDelete(int, RRefId, ForkId) override { return Answer(); }

 private:
  static rpc::Future<void> Answer() { return rpc::MakeReadyFuture<void>(std::monostate()); }
};

GlobalId SmallId(fuzz::FuzzReader& in) {
  const uint8_t b = in.U8();
  return GlobalId{static_cast<int32_t>(b % 4) - 1, static_cast<uint64_t>(b >> 2) % 8};
}

// What RRefService's "__rref.control" handler does with its payload.
absl::Status HandleControl(RRefContext& ctx, const std::string& bytes, Holder from) {
  proto::RRefControl m;
  if (!m.ParseFromString(bytes)) return absl::DataLossError("malformed RRef control message");
  const RRefId rref = FromProto(m.rref());
  const ForkId fork = FromProto(m.fork());
  switch (m.kind()) {
    case proto::RRefControl::FORK_REQUEST: ctx.OnForkRequest(rref, fork, m.parent(), from); break;
    case proto::RRefControl::CHILD_ACCEPT: ctx.OnChildAccept(rref, fork); break;
    case proto::RRefControl::USER_DELETE: ctx.OnUserDelete(rref, fork); break;
    default: return absl::DataLossError("unknown RRef control message");
  }
  return absl::OkStatus();
}

void ExpectDecodeError(const absl::Status& s) {
  FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kDataLoss ||
             s.code() == absl::StatusCode::kInvalidArgument ||
             s.code() == absl::StatusCode::kFailedPrecondition);
}

struct World {
  AnsweringSender sender;
  std::shared_ptr<RRefContext> ctx = std::make_shared<RRefContext>(kSelf, &sender);
  std::vector<std::shared_ptr<RefHandle>> handles;
};

void Step(World& w, fuzz::FuzzReader& in) {
  RRefContext& ctx = *w.ctx;
  // The sender of a message: a worker and an incarnation.
  auto sender = [&in] { return Holder{in.U8() % 4, static_cast<int64_t>(in.U8() % 3)}; };
  switch (in.U8() % 11) {
    case 0: {  // a control message as sent
      const Holder from = sender();
      ExpectDecodeError(HandleControl(ctx, in.Chunk(), from));
      break;
    }
    case 1: {  // a control message about references that may exist here
      proto::RRefControl m;
      m.set_kind(static_cast<proto::RRefControl::Kind>(in.U8() % 4));
      ToProto(SmallId(in), m.mutable_rref());
      ToProto(SmallId(in), m.mutable_fork());
      m.set_parent(static_cast<int8_t>(in.U8()));
      const Holder from = sender();
      ExpectDecodeError(HandleControl(ctx, m.SerializeAsString(), from));
      break;
    }
    case 2: {  // an RRef call: header, then what "__rref.remote" and "__rref.fetch" do
      rpc::Payload p;
      p.bytes = in.Chunk();
      proto::RRefCall h;
      absl::Status s = TakeHeader(p, &h);
      ExpectDecodeError(s);
      if (!s.ok()) break;
      if (in.U8() % 2 == 0) {
        ctx.OnRemoteCreate(FromProto(h.rref()), FromProto(h.fork()), h.type(), sender());
        ctx.SetValue(FromProto(h.rref()), rpc::AnyValue::Of(std::make_shared<int64_t>(1)));
      } else {
        (void)ctx.OwnedValue(FromProto(h.rref()));
      }
      break;
    }
    case 3: {  // an RRef inside a message; outside an RPC it can only fail
      rpc::Payload p;
      p.bytes = in.Chunk();
      RRef<int64_t> r;
      ExpectDecodeError(rpc::DecodeMessage(p, &r));
      break;
    }
    case 4: {  // a fork descriptor received from a peer
      ForkDescriptor d;
      d.rref = SmallId(in);
      d.fork = SmallId(in);
      d.owner = static_cast<int8_t>(in.U8()) % 4;
      d.parent = static_cast<int8_t>(in.U8()) % 4;
      d.type = "l";
      w.handles.push_back(ctx.Adopt(d));
      break;
    }
    case 5: w.handles.push_back(ctx.CreateOwned("l")); break;
    case 6: w.handles.push_back(ctx.CreateUserForRemote(1 + in.U8() % 3, "l")); break;
    case 7: {  // this worker sends one of its references
      if (w.handles.empty()) break;
      const auto& h = w.handles[in.U8() % w.handles.size()];
      ForkDescriptor d = ctx.Fork(*h, in.U8() % 4);
      if (in.U8() % 2 == 0) w.handles.push_back(ctx.Adopt(d));  // sent to itself
      break;
    }
    case 8:
      if (!w.handles.empty()) w.handles.erase(w.handles.begin() + in.U8() % w.handles.size());
      break;
    case 9: ctx.SetValue(SmallId(in), rpc::AnyValue::Of(std::make_shared<int64_t>(2))); break;
    case 10: {  // the agent reports a peer incarnation dead
      const Holder dead = sender();
      (void)ctx.OnPeerFailure(dead.worker, dead.incarnation);
      break;
    }
  }
}

}  // namespace
}  // namespace baton::rref

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::rref;
  baton::fuzz::FuzzReader in(data, size);
  World w;
  for (int n = 0; n < 64 && !in.empty(); ++n) Step(w, in);
  (void)w.ctx->DebugState().ToString();
  (void)w.ctx->Settle(absl::Now());
  w.handles.clear();
  w.ctx->Clear();
  return 0;
}
