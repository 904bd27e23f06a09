// libFuzzer target: the decode path of distributed autograd's control data
// (dist_autograd/): the "dist_autograd" extension of received messages
// (proto::AutogradTag, read by the call hook, which attaches a recv function
// to the tensors it names), the payload of "__dist_autograd.release"
// (proto::ReleaseContext, through the registered handler), the tag of a
// request when its reply is sent, and the ambient context a request sets.
// Each input runs on a fresh registry with dist_autograd installed; no agent
// is needed for these paths.
//
// Input: up to 16 operations, each a u8 opcode and its fields (see Step). A
// received message is u8 message type, u8 peer, the tag (u8 mode: 0 as
// sent, else structured: u8 context, u8 message id, u8 count of u8 tensor
// indices), then a codec payload as in codec_fuzzer (u8 number of blobs, each
// a u16 length and bytes, then a u16 length and the payload bytes).
//
// Checks, besides the sanitizers: a message the hook accepts has a recv
// function on exactly the tensors its tag names.
#include <torch/csrc/autograd/variable.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "dist_autograd/dist_autograd.h"
#include "dist_autograd/internal/container.h"
#include "fuzz/fuzz_input.h"
#include "proto/dist_autograd.pb.h"
#include "rpc/codec.h"
#include "rpc/function.h"

namespace baton::dist_autograd {
namespace {

using rpc::Blob;
using rpc::Payload;

Payload ReadPayload(fuzz::FuzzReader& in) {
  Payload p;
  const int blobs = in.U8() % 4;
  auto storage = std::make_shared<std::vector<std::string>>();
  storage->reserve(blobs);
  for (int i = 0; i < blobs; ++i) {
    storage->push_back(in.Chunk());
    Blob b;
    if (!storage->back().empty()) {
      b.pieces.emplace_back(storage->back().data(), storage->back().size());
    }
    b.owner = storage;
    p.blobs.push_back(std::move(b));
  }
  p.bytes = in.Chunk();
  return p;
}

std::string ReadTag(fuzz::FuzzReader& in) {
  if (in.U8() % 2 == 0) return in.Chunk();
  proto::AutogradTag tag;
  tag.set_context_id((int64_t{1} << 48) | (in.U8() % 4));
  tag.set_message_id(in.U8());
  for (int n = in.U8() % 4; n > 0; --n) tag.add_grad_indices(in.U8() % 6);
  return tag.SerializeAsString();
}

void Tensors(at::Tensor& t, std::vector<at::Tensor*>* out) { out->push_back(&t); }
void Tensors(int64_t&, std::vector<at::Tensor*>*) {}
void Tensors(std::vector<at::Tensor>& v, std::vector<at::Tensor*>* out) {
  for (auto& t : v) out->push_back(&t);
}
void Tensors(std::map<std::string, at::Tensor>& m, std::vector<at::Tensor*>* out) {
  for (auto& [k, t] : m) out->push_back(&t);
}
template <typename... Ts>
void Tensors(std::tuple<Ts...>& t, std::vector<at::Tensor*>* out) {
  std::apply([out](auto&... e) { (Tensors(e, out), ...); }, t);
}

bool HasRecvFunction(const at::Tensor& t) {
  if (!t.defined()) return false;
  // By type, not by name(): the name is torch's, chosen for compatibility.
  const auto& fn = torch::autograd::impl::gradient_edge(t).function;
  return dynamic_cast<internal::RecvRpcBackward*>(fn.get()) != nullptr;
}

// `ordered`: the value's tensors can be listed in codec order (not so for a
// map, whose wire order is the sender's).
template <typename T>
void Receive(rpc::FunctionRegistry& registry, const Payload& payload, bool is_request, int peer,
             bool ordered = true) {
  const rpc::MessageInfo m{nullptr, is_request, peer, "fuzz"};
  T value{};
  absl::Status s = registry.DecodeReceived(payload, &value, m);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kDataLoss ||
               s.code() == absl::StatusCode::kFailedPrecondition);
    return;
  }
  auto it = payload.extensions.find(internal::kExtension);
  if (it == payload.extensions.end()) return;
  proto::AutogradTag tag;
  FUZZ_CHECK(tag.ParseFromString(it->second));
  std::set<uint32_t> named(tag.grad_indices().begin(), tag.grad_indices().end());
  std::vector<at::Tensor*> tensors;  // in codec order, as the hook counts them
  Tensors(value, &tensors);
  size_t with_recv = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    with_recv += HasRecvFunction(*tensors[i]);
    if (ordered) {
      FUZZ_CHECK(HasRecvFunction(*tensors[i]) == (named.count(static_cast<uint32_t>(i)) > 0));
    }
  }
  FUZZ_CHECK(with_recv == named.size());
  if (is_request) {
    rpc::CallContext call;
    call.registry = &registry;
    call.extensions = payload.extensions;
    auto scopes = registry.EnterCall(call);
  }
}

void Step(rpc::FunctionRegistry& registry, fuzz::FuzzReader& in) {
  switch (in.U8() % 3) {
    case 0: {  // a message arrives
      const uint8_t type = in.U8();
      const bool is_request = (type & 0x80) != 0;
      const int peer = in.U8() % 4;
      const std::string tag = ReadTag(in);
      Payload p = ReadPayload(in);
      p.extensions[internal::kExtension] = tag;
      switch (type % 4) {
        case 0:
          Receive<std::tuple<int64_t, int64_t, std::vector<at::Tensor>>>(registry, p, is_request,
                                                                         peer);
          break;
        case 1: Receive<std::vector<at::Tensor>>(registry, p, is_request, peer); break;
        case 2: Receive<at::Tensor>(registry, p, is_request, peer); break;
        case 3:
          Receive<std::map<std::string, at::Tensor>>(registry, p, is_request, peer,
                                                     /*ordered=*/false);
          break;
      }
      break;
    }
    case 1: {  // "__dist_autograd.release" from a peer
      auto entry = registry.Find(internal::kReleaseFn);
      FUZZ_CHECK(entry != nullptr);
      rpc::WorkerInfo caller;
      caller.id = in.U8() % 4;
      rpc::CallContext call;
      call.registry = &registry;
      call.caller = &caller;
      call.function = internal::kReleaseFn;
      Payload p;
      p.bytes = in.Chunk();
      entry->handler(call, std::move(p), [](absl::StatusOr<Payload> r) {
        FUZZ_CHECK(r.ok() || r.status().code() == absl::StatusCode::kDataLoss);
      });
      break;
    }
    case 2: {  // the reply to a request that carried a tag
      std::map<std::string, std::string> request_extensions;
      request_extensions[internal::kExtension] = ReadTag(in);
      rpc::MessageInfo m{nullptr, /*is_request=*/false, in.U8() % 4, "fuzz"};
      m.request_extensions = &request_extensions;
      at::Tensor leaf = at::ones({2});
      leaf.set_requires_grad(true);
      std::vector<at::Tensor> reply = {leaf * 2, at::ones({1})};
      absl::StatusOr<Payload> p = registry.EncodeForSend(reply, m);
      FUZZ_CHECK(p.ok() || p.status().code() == absl::StatusCode::kDataLoss ||
                 p.status().code() == absl::StatusCode::kFailedPrecondition);
      break;
    }
  }
}

}  // namespace
}  // namespace baton::dist_autograd

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::dist_autograd;
  baton::fuzz::FuzzReader in(data, size);
  baton::rpc::FunctionRegistry registry;
  FUZZ_CHECK(Install(registry).ok());
  for (int n = 0; n < 16 && !in.empty(); ++n) Step(registry, in);
  return 0;
}
