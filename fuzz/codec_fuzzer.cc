// libFuzzer target: decoding of every built-in codec (rpc/codec.h,
// rpc/codec.cc) through the registry's receive path
// (FunctionRegistry::DecodeReceived, rpc/function.h), nested containers and a
// recursive user type included.
//
// Input: u8 type (which of the message types in fuzz/codec_types.h), u8 flags
// (bit 0: split each blob in two pieces; bit 1: misalign the blobs by one
// byte; bit 2: decode with a receive hook registered), u8 number of blobs
// (at most 4), each blob as a u16 length and its bytes, then the payload
// bytes.
//
// Checks, besides the sanitizers: decoding fails with DATA_LOSS or succeeds;
// with a hook, the tensor addresses the hook received are exactly those of
// the tensors in the decoded value (hooks attach autograd history through
// them); a decoded value encodes and decodes again to the same bytes.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fuzz/codec_types.h"
#include "fuzz/fuzz_input.h"
#include "rpc/codec.h"
#include "rpc/function.h"

namespace baton::fuzz {
namespace {

using rpc::Blob;
using rpc::Payload;

// ---- The tensors of a decoded value, wherever they sit ----
void Collect(app::Tree& t, std::vector<at::Tensor*>* out);
template <typename T>
void Collect(std::vector<T>& v, std::vector<at::Tensor*>* out);
template <typename T>
void Collect(std::optional<T>& v, std::vector<at::Tensor*>* out);
template <typename A, typename B>
void Collect(std::pair<A, B>& v, std::vector<at::Tensor*>* out);
template <typename V>
void Collect(std::map<std::string, V>& m, std::vector<at::Tensor*>* out);
template <typename V>
void Collect(std::unordered_map<std::string, V>& m, std::vector<at::Tensor*>* out);
template <typename... Ts>
void Collect(std::tuple<Ts...>& t, std::vector<at::Tensor*>* out);

void Collect(at::Tensor& t, std::vector<at::Tensor*>* out) { out->push_back(&t); }
template <typename T>
std::enable_if_t<std::is_arithmetic_v<T>> Collect(T&, std::vector<at::Tensor*>*) {}
void Collect(std::string&, std::vector<at::Tensor*>*) {}
void Collect(std::vector<bool>&, std::vector<at::Tensor*>*) {}
void Collect(app::Point& p, std::vector<at::Tensor*>* out) { Collect(p.features, out); }
template <typename T>
void Collect(std::vector<T>& v, std::vector<at::Tensor*>* out) {
  for (auto& e : v) Collect(e, out);
}
template <typename T>
void Collect(std::optional<T>& v, std::vector<at::Tensor*>* out) {
  if (v.has_value()) Collect(*v, out);
}
template <typename A, typename B>
void Collect(std::pair<A, B>& v, std::vector<at::Tensor*>* out) {
  Collect(v.first, out);
  Collect(v.second, out);
}
template <typename V>
void Collect(std::map<std::string, V>& m, std::vector<at::Tensor*>* out) {
  for (auto& [k, v] : m) Collect(v, out);
}
template <typename V>
void Collect(std::unordered_map<std::string, V>& m, std::vector<at::Tensor*>* out) {
  for (auto& [k, v] : m) Collect(v, out);
}
template <typename... Ts>
void Collect(std::tuple<Ts...>& t, std::vector<at::Tensor*>* out) {
  std::apply([out](auto&... e) { (Collect(e, out), ...); }, t);
}
void Collect(app::Tree& t, std::vector<at::Tensor*>* out) { Collect(t.children, out); }

// Records the tensor addresses it is given and touches every tensor, as the
// distributed autograd hook does.
class RecordingHook : public rpc::CallHook {
 public:
  absl::Status OnSend(const rpc::MessageInfo&, const std::vector<at::Tensor>&,
                      std::map<std::string, std::string>&) override {
    return absl::OkStatus();
  }
  absl::Status OnReceive(const rpc::MessageInfo&, const std::vector<at::Tensor*>& tensors,
                         const std::map<std::string, std::string>&) override {
    seen = tensors;
    for (at::Tensor* t : tensors) {
      if (t->defined() && t->numel() > 0) {
        (void)*static_cast<const volatile char*>(t->data_ptr());
      }
    }
    return absl::OkStatus();
  }
  std::vector<at::Tensor*> seen;
};

std::string Contents(const Blob& b) {
  std::string out(b.size(), '\0');
  b.CopyTo(out.data());
  return out;
}

template <typename T>
void Run(const Payload& payload, bool with_hook, bool canonical) {
  // Without hooks the registry decodes straight into the value.
  rpc::FunctionRegistry registry;
  auto recorder = std::make_shared<RecordingHook>();
  if (with_hook) registry.AddCallHook(recorder);
  const rpc::MessageInfo message{nullptr, /*is_request=*/true, /*peer=*/1, "fuzz"};
  T value{};
  absl::Status s = registry.DecodeReceived(payload, &value, message);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kDataLoss);
    return;
  }
  if (with_hook) {
    std::vector<at::Tensor*> present;
    Collect(value, &present);
    std::vector<at::Tensor*> seen = recorder->seen;
    std::sort(present.begin(), present.end());
    std::sort(seen.begin(), seen.end());
    FUZZ_CHECK(present == seen);
  }
  absl::StatusOr<Payload> first = rpc::EncodeMessage(value);
  FUZZ_CHECK(first.ok());
  T again{};
  FUZZ_CHECK(rpc::DecodeMessage(*first, &again).ok());
  absl::StatusOr<Payload> second = rpc::EncodeMessage(again);
  FUZZ_CHECK(second.ok());
  FUZZ_CHECK(first->blobs.size() == second->blobs.size());
  FUZZ_CHECK(first->bytes.size() == second->bytes.size());
  if (canonical) {
    FUZZ_CHECK(first->bytes == second->bytes);
    for (size_t i = 0; i < first->blobs.size(); ++i) {
      FUZZ_CHECK(Contents(first->blobs[i]) == Contents(second->blobs[i]));
    }
  }
}

// The payload's blobs as a receiver may hold them: split into pieces and at
// addresses of any alignment.
Payload MakePayload(FuzzReader& in, uint8_t flags) {
  Payload p;
  auto storage = std::make_shared<std::vector<std::string>>();
  const int blobs = in.U8() % 5;
  std::vector<std::string> contents;
  for (int i = 0; i < blobs; ++i) contents.push_back(in.Chunk());
  p.bytes = in.Rest();
  const size_t skew = (flags & 2) != 0 ? 1 : 0;
  storage->reserve(2 * contents.size());
  for (const std::string& c : contents) {
    Blob b;
    const size_t cut = (flags & 1) != 0 ? c.size() / 2 : c.size();
    for (auto [off, len] : {std::pair<size_t, size_t>{0, cut}, {cut, c.size() - cut}}) {
      if (len == 0) continue;
      storage->push_back(std::string(skew, 'x') + c.substr(off, len));
      b.pieces.emplace_back(storage->back().data() + skew, len);
    }
    b.owner = storage;
    p.blobs.push_back(std::move(b));
  }
  return p;
}

}  // namespace
}  // namespace baton::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::fuzz;
  using Tensor = at::Tensor;
  FuzzReader in(data, size);
  const uint8_t type = in.U8();
  const uint8_t flags = in.U8();
  const baton::rpc::Payload p = MakePayload(in, flags);
  const bool hook = (flags & 4) != 0;
  switch (type % kNumCodecCases) {
    case kTensor: Run<Tensor>(p, hook, true); break;
    case kTensorVector: Run<std::vector<Tensor>>(p, hook, true); break;
    case kPropagateArgs:
      Run<std::tuple<int64_t, int64_t, std::vector<Tensor>>>(p, hook, true);
      break;
    case kOptionalTensorMap:
      Run<std::map<std::string, std::optional<Tensor>>>(p, hook, true);
      break;
    case kNestedUnorderedMap:  // its iteration order is not canonical
      Run<std::unordered_map<std::string, std::vector<std::pair<std::string, Tensor>>>>(
          p, hook, /*canonical=*/false);
      break;
    case kIntCube: Run<std::vector<std::vector<std::vector<int32_t>>>>(p, hook, true); break;
    case kBoolVector: Run<std::vector<bool>>(p, hook, true); break;
    case kOptionalStrings: Run<std::optional<std::vector<std::string>>>(p, hook, true); break;
    case kScalars:
      Run<std::tuple<bool, uint8_t, int16_t, uint32_t, float, double, std::string>>(p, hook, true);
      break;
    case kTree: Run<app::Tree>(p, hook, true); break;
    case kPoints: Run<std::vector<app::Point>>(p, hook, true); break;
    case kMixed:
      Run<std::pair<std::map<std::string, app::Tree>, std::vector<std::optional<app::Point>>>>(
          p, hook, true);
      break;
  }
  return 0;
}
