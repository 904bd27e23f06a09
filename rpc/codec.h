// Codecs: how typed values become a Payload and back.
//
// Contract:
// - Codec<T> exists for torch::Tensor (every dtype, any shape; a view or a
//   non-contiguous tensor sends only the elements it views; CPU and CUDA
//   tensors, a CUDA one arriving on the device the agent's device map names
//   for it, see docs/cuda.md; sparse COO tensors on the CPU, as their
//   indices and values, a coalesced one arriving coalesced; a received
//   sparse tensor's indices are checked against its sizes), bool, every
//   integer type, float, double, std::string, std::vector, std::map and
//   std::unordered_map with string keys, std::optional, std::pair,
//   std::tuple and std::monostate (void).
// - Users add their own types by specializing baton::rpc::Codec<T> with
//     static std::string Name();
//     static void Encode(const T& value, Encoder& enc);
//     static absl::Status Decode(Decoder& dec, T* out);
//   built from the codecs of the members, or, for a plain struct, by
//   listing its fields with BATON_CODEC_FIELDS (below): the struct then
//   travels as its fields in order, its Name() spells every field's type,
//   and a field that fails to decode is named in the error. Protocol
//   buffers travel by rpc/proto_codec.h.
// - Name() spells the type ("vector<Tensor>"); function signatures are made
//   of these names, and the callee rejects a call whose signature differs
//   from its own (argument type mismatch).
// - Decoding never trusts the input: truncated or corrupt bytes give
//   DATA_LOSS naming what was being read, never a crash. A declared length
//   is checked against the bytes left before anything is allocated for it,
//   and containers nest at most kMaxNesting deep (a recursive user type
//   would otherwise let a peer exhaust the stack); the encoder refuses
//   deeper values with INVALID_ARGUMENT.
// - Containers decode their elements in place, so the tensor addresses
//   listed in CodecContext::received_tensors are those of the tensors in the
//   decoded value.
// - Tensor bytes are not copied on the sending side; on the receiving side a
//   tensor uses the received buffer directly when it is contiguous and
//   aligned, else it is copied once into a new tensor.
//
// Thread-safety: Encoder and Decoder are confined to one thread; codecs are
// stateless.
#ifndef BATON_RPC_CODEC_H_
#define BATON_RPC_CODEC_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "rpc/payload.h"

namespace baton::rpc {

class Runtime;

class Encoder;
class Decoder;

// Moves CUDA tensors between processes of one host without the host: the
// sender exports its memory, the receiver copies from it on the GPU and
// releases it (rpc/cuda/ipc_channel.h, CUDA builds; docs/cuda.md).
class CudaTensorChannel {
 public:
  virtual ~CudaTensorChannel() = default;
  // Whether a tensor of `bytes` should take this channel (else the host).
  virtual bool Wants(size_t bytes) const = 0;
  // Writes what `peer` needs to copy `tensor` (contiguous, on a CUDA device)
  // and keeps its memory alive until `peer` releases it or dies.
  virtual absl::Status Export(const at::Tensor& tensor, int peer, Encoder& enc) = 0;
  // Reads what Export wrote (sent by `peer`) and returns a tensor of `sizes`
  // and `dtype` in memory of its own on cuda:`device`, its values copied on
  // the GPU; the sender's memory is released.
  virtual absl::StatusOr<at::Tensor> Import(Decoder& dec, int peer, int device,
                                            const std::vector<int64_t>& sizes,
                                            c10::ScalarType dtype) = 0;
};

// The host in a device map and in DeviceRouter's answers, beside the CUDA
// indices 0, 1, ... (AgentOptions::devices.maps).
inline constexpr int kCpuDevice = -1;

// Where a tensor sent to a peer arrives: the agent answers from
// AgentOptions::devices.maps (Runtime::DeviceOnPeer), and which channel
// carries it. An interface so that the codec calls it without linking the
// agent.
class DeviceRouter {
 public:
  // The device on `peer` where a tensor on this worker's `device` arrives;
  // either may be kCpuDevice. `answers`: the tensor answers tensors the
  // peer sent (CodecContext::answers). A CPU tensor that no map names stays
  // on the CPU; INVALID_ARGUMENT for a CUDA tensor that no map names.
  virtual absl::StatusOr<int> DeviceOnPeer(int peer, int device, bool answers) const = 0;
  // The channel that moves CUDA tensors to and from `peer` without the host,
  // or null (the host carries them).
  virtual CudaTensorChannel* CudaChannelFor(int peer) const = 0;

 protected:
  ~DeviceRouter() = default;
};

// What a codec may know about the message it encodes or decodes: the agent
// and the other end (the destination when encoding, the sender when
// decoding). Protocol layers use it, e.g. an RRef registers a fork for the
// destination. Plain values ignore it. Null outside an RPC.
struct CodecContext {
  CodecContext() = default;
  // Sets `devices` to the runtime's DeviceRouter (defined beside
  // rpc/runtime.h, so that the codec itself knows only the DeviceRouter).
  CodecContext(Runtime* runtime, int peer, std::vector<at::Tensor>* sent_tensors = nullptr,
               std::vector<at::Tensor*>* received_tensors = nullptr);

  // For the protocol layers' codecs (rref, dist_autograd, ...).
  Runtime* runtime = nullptr;
  // For the tensor codec: where a tensor goes, and through what.
  const DeviceRouter* devices = nullptr;
  int peer = -1;
  // The message answers one the peer sent: a reply, or distributed
  // autograd's gradients for the tensors a call brought. Its tensors follow
  // the inverse of the peer's device map for this worker, as torch's
  // replies do; a request's follow this worker's own map for the peer.
  bool answers = false;
  // When set, the tensor codec lists every tensor it encodes (as given) or
  // decodes (the decoded object, which call hooks may replace).
  std::vector<at::Tensor>* sent_tensors = nullptr;
  std::vector<at::Tensor*>* received_tensors = nullptr;
};

// Containers nest at most this deep in one message.
inline constexpr int kMaxNesting = 64;

class Encoder {
 public:
  explicit Encoder(const CodecContext* context = nullptr) : context_(context) {}
  const CodecContext* context() const { return context_; }
  void WriteBytes(const void* data, size_t n) { bytes_.append(static_cast<const char*>(data), n); }
  template <typename T>
  void WritePod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    WriteBytes(&v, sizeof(v));
  }
  void WriteVarint(uint64_t v);
  void WriteString(absl::string_view s) {
    WriteVarint(s.size());
    WriteBytes(s.data(), s.size());
  }
  // Adds a blob and returns its index.
  uint32_t AddBlob(Blob blob) {
    blobs_.push_back(std::move(blob));
    return static_cast<uint32_t>(blobs_.size() - 1);
  }
  // Registers what to undo if the message never reaches its destination's
  // decoder (Payload::undo_if_undelivered); run at once if encoding fails.
  void UndoIfUndelivered(std::function<void()> undo) { undo_.push_back(std::move(undo)); }
  // Records an encoding error (the first one wins); Finish() returns it.
  void Fail(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
  }
  absl::StatusOr<Payload> Finish() &&;

  // One level of container nesting, for as long as it lives. ok() is false
  // (and the encoder failed with INVALID_ARGUMENT) past kMaxNesting; the
  // container then writes nothing more.
  class Nested {
   public:
    Nested(Encoder& enc, absl::string_view what);
    ~Nested() { --enc_.depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;
    bool ok() const { return ok_; }

   private:
    Encoder& enc_;
    bool ok_;
  };

 private:
  const CodecContext* context_;
  std::string bytes_;
  std::vector<Blob> blobs_;
  std::vector<std::function<void()>> undo_;
  absl::Status status_;
  int depth_ = 0;
};

class Decoder {
 public:
  explicit Decoder(const Payload& payload, const CodecContext* context = nullptr)
      : payload_(payload), context_(context) {}
  const CodecContext* context() const { return context_; }

  absl::Status ReadBytes(void* out, size_t n, absl::string_view what);
  template <typename T>
  absl::Status ReadPod(T* out, absl::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    return ReadBytes(out, sizeof(T), what);
  }
  absl::Status ReadVarint(uint64_t* out, absl::string_view what);
  absl::Status ReadString(std::string* out, absl::string_view what);
  // A length prefix for `what`, checked against the bytes left (each element
  // takes at least `min_element_bytes`), so corrupt lengths cannot make the
  // decoder allocate without bound.
  absl::Status ReadLength(uint64_t* out, size_t min_element_bytes, absl::string_view what);
  absl::StatusOr<const Blob*> GetBlob(uint64_t index, absl::string_view what);
  // DATA_LOSS unless every byte was consumed.
  absl::Status ExpectEnd() const;
  size_t remaining() const { return payload_.bytes.size() - pos_; }

  // One level of container nesting, for as long as it lives; status() is
  // DATA_LOSS past kMaxNesting. A recursive user codec that does not go
  // through a container should hold one too.
  class Nested {
   public:
    Nested(Decoder& dec, absl::string_view what);
    ~Nested() { --dec_.depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;
    const absl::Status& status() const { return status_; }

   private:
    Decoder& dec_;
    absl::Status status_;
  };

 private:
  const Payload& payload_;
  const CodecContext* context_;
  size_t pos_ = 0;
  int depth_ = 0;
};

template <typename T, typename Enable = void>
struct Codec;  // Specialize for user types; see the contract above.

// Encodes/decodes one value with its codec.
template <typename T>
void EncodeValue(const T& v, Encoder& enc) {
  Codec<T>::Encode(v, enc);
}
template <typename T>
absl::Status DecodeValue(Decoder& dec, T* out) {
  return Codec<T>::Decode(dec, out);
}

// Encodes a whole message (a tuple of arguments or one result).
template <typename T>
absl::StatusOr<Payload> EncodeMessage(const T& v, const CodecContext* context = nullptr) {
  Encoder enc(context);
  Codec<T>::Encode(v, enc);
  return std::move(enc).Finish();
}
template <typename T>
absl::Status DecodeMessage(const Payload& payload, T* out, const CodecContext* context = nullptr) {
  Decoder dec(payload, context);
  RETURN_IF_ERROR(Codec<T>::Decode(dec, out));
  return dec.ExpectEnd();
}

template <typename T>
std::string TypeName() {
  return Codec<std::decay_t<T>>::Name();
}

namespace internal {

// The fewest payload bytes a value of T encodes to, so that a container's
// declared length can be checked against the bytes left before anything is
// allocated for it. 0 where unknown (user types).
template <typename T, typename Enable = void>
struct MinEncodedBytes : std::integral_constant<size_t, 0> {};

// Moves the elements of `v` into a buffer twice as large. Tensor addresses
// already listed in context->received_tensors that pointed into the old
// buffer are moved along: an element moves to the same offset in the new
// buffer, and what it owns on the heap does not move.
template <typename V>
void GrowKeepingTensorAddresses(V& v, const CodecContext* context) {
  V bigger;
  bigger.reserve(std::max<size_t>(8, 2 * v.capacity()));
  for (auto& e : v) bigger.push_back(std::move(e));
  if (context != nullptr && context->received_tensors != nullptr && !v.empty()) {
    const uintptr_t old_begin = reinterpret_cast<uintptr_t>(v.data());
    const uintptr_t old_end = reinterpret_cast<uintptr_t>(v.data() + v.size());
    const uintptr_t new_begin = reinterpret_cast<uintptr_t>(bigger.data());
    for (at::Tensor*& t : *context->received_tensors) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(t);
      if (a >= old_begin && a < old_end) {
        t = reinterpret_cast<at::Tensor*>(new_begin + (a - old_begin));
      }
    }
  }
  v.swap(bigger);
}

}  // namespace internal

// ---- Tensor ----
// How a dense CPU tensor that is a non-contiguous view travels.
// - kCompact (the C++ codec's, and so every typed function's): only the
//   viewed elements, and the tensor arrives contiguous.
// - kKeep (torch.distributed.rpc's rule, for the Python layer): the view
//   keeps its sizes and strides, with the range of its storage that it
//   spans, unless that range is at least kKeepViewMaxWaste bytes and twice
//   the view's own bytes; such a sparse view is compacted. A view received
//   by a kCompact decoder is made contiguous on arrival (one copy), so a
//   C++ function never sees one, whoever sent it.
enum class ViewLayout { kCompact, kKeep };
inline constexpr size_t kKeepViewMaxWaste = 8 << 10;

void EncodeTensor(const at::Tensor& t, Encoder& enc, ViewLayout views = ViewLayout::kCompact);
absl::Status DecodeTensor(Decoder& dec, at::Tensor* out, ViewLayout views = ViewLayout::kCompact);

template <>
struct Codec<at::Tensor> {
  static std::string Name() { return "Tensor"; }
  static void Encode(const at::Tensor& t, Encoder& enc) { EncodeTensor(t, enc); }
  static absl::Status Decode(Decoder& dec, at::Tensor* out) { return DecodeTensor(dec, out); }
};

// ---- Scalars ----
template <>
struct Codec<bool> {
  static std::string Name() { return "bool"; }
  static void Encode(bool v, Encoder& enc) { enc.WritePod<uint8_t>(v ? 1 : 0); }
  static absl::Status Decode(Decoder& dec, bool* out) {
    uint8_t b = 0;
    RETURN_IF_ERROR(dec.ReadPod(&b, "bool"));
    if (b > 1) return absl::DataLossError(absl::StrCat("bad bool byte ", b));
    *out = b == 1;
    return absl::OkStatus();
  }
};

namespace internal {
template <typename T>
std::string ArithmeticName() {
  if constexpr (std::is_same_v<T, float>) return "float";
  if constexpr (std::is_same_v<T, double>) return "double";
  if constexpr (std::is_integral_v<T>) {
    return absl::StrCat(std::is_signed_v<T> ? "int" : "uint", sizeof(T) * 8);
  }
  return "?";
}
}  // namespace internal

template <typename T>
struct Codec<T, std::enable_if_t<(std::is_integral_v<T> && !std::is_same_v<T, bool>) ||
                                 std::is_same_v<T, float> || std::is_same_v<T, double>>> {
  static std::string Name() { return internal::ArithmeticName<T>(); }
  static void Encode(T v, Encoder& enc) { enc.WritePod<T>(v); }
  static absl::Status Decode(Decoder& dec, T* out) {
    return dec.ReadPod(out, internal::ArithmeticName<T>());
  }
};

template <>
struct Codec<std::string> {
  static std::string Name() { return "string"; }
  static void Encode(const std::string& v, Encoder& enc) { enc.WriteString(v); }
  static absl::Status Decode(Decoder& dec, std::string* out) {
    return dec.ReadString(out, "string");
  }
};

template <>
struct Codec<std::monostate> {
  static std::string Name() { return "void"; }
  static void Encode(const std::monostate&, Encoder&) {}
  static absl::Status Decode(Decoder&, std::monostate*) { return absl::OkStatus(); }
};

// ---- Containers ----
namespace internal {
template <>
struct MinEncodedBytes<at::Tensor> : std::integral_constant<size_t, 1> {};  // its tag
template <typename T>
struct MinEncodedBytes<T, std::enable_if_t<std::is_arithmetic_v<T>>>
    : std::integral_constant<size_t, sizeof(T)> {};
template <>
struct MinEncodedBytes<std::string> : std::integral_constant<size_t, 1> {};
template <typename T, typename A>
struct MinEncodedBytes<std::vector<T, A>> : std::integral_constant<size_t, 1> {};
template <typename V, typename C, typename A>
struct MinEncodedBytes<std::map<std::string, V, C, A>> : std::integral_constant<size_t, 1> {};
template <typename V, typename H, typename E, typename A>
struct MinEncodedBytes<std::unordered_map<std::string, V, H, E, A>>
    : std::integral_constant<size_t, 1> {};
template <typename T>
struct MinEncodedBytes<std::optional<T>> : std::integral_constant<size_t, 1> {};
template <typename A, typename B>
struct MinEncodedBytes<std::pair<A, B>>
    : std::integral_constant<size_t, MinEncodedBytes<A>::value + MinEncodedBytes<B>::value> {};
template <typename... Ts>
struct MinEncodedBytes<std::tuple<Ts...>>
    : std::integral_constant<size_t, (size_t{0} + ... + MinEncodedBytes<Ts>::value)> {};
}  // namespace internal

template <typename T, typename A>
struct Codec<std::vector<T, A>> {
  static std::string Name() { return absl::StrCat("vector<", TypeName<T>(), ">"); }
  static void Encode(const std::vector<T, A>& v, Encoder& enc) {
    EncodeWith(v, enc, [](const T& e, Encoder& en) { Codec<T>::Encode(e, en); });
  }
  static absl::Status Decode(Decoder& dec, std::vector<T, A>* out) {
    return DecodeWith(dec, out, [](Decoder& de, T* e) { return Codec<T>::Decode(de, e); });
  }
  // The same encoding with another codec for the elements (one with an
  // option, such as EncodeTensors's).
  template <typename EncodeElement>
  static void EncodeWith(const std::vector<T, A>& v, Encoder& enc, EncodeElement encode) {
    Encoder::Nested nested(enc, "vector");
    if (!nested.ok()) return;
    enc.WriteVarint(v.size());
    for (const auto& e : v) encode(static_cast<const T&>(e), enc);
  }
  template <typename DecodeElement>
  static absl::Status DecodeWith(Decoder& dec, std::vector<T, A>* out, DecodeElement decode) {
    Decoder::Nested nested(dec, "vector");
    if (!nested.status().ok()) return nested.status();
    constexpr size_t kMinBytes = internal::MinEncodedBytes<T>::value;
    uint64_t n = 0;
    absl::Status s = dec.ReadLength(&n, kMinBytes, "vector length");
    if (!s.ok()) return s;
    out->clear();
    if constexpr (std::is_same_v<T, bool>) {
      for (uint64_t i = 0; i < n; ++i) {
        bool e = false;
        s = decode(dec, &e);
        if (!s.ok()) return s;
        out->push_back(e);
      }
    } else {
      // At most as much memory up front as there are bytes left; a longer
      // vector grows as its elements arrive (see GrowKeepingTensorAddresses).
      out->reserve(std::min<uint64_t>(n, dec.remaining() / sizeof(T) + 1));
      for (uint64_t i = 0; i < n; ++i) {
        if (out->size() == out->capacity()) {
          internal::GrowKeepingTensorAddresses(*out, dec.context());
        }
        out->emplace_back();
        s = decode(dec, &out->back());
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }
};

// vector<Tensor>'s encoding (the same bytes), with the view layout chosen.
void EncodeTensors(const std::vector<at::Tensor>& v, Encoder& enc, ViewLayout views);
absl::Status DecodeTensors(Decoder& dec, std::vector<at::Tensor>* out, ViewLayout views);

namespace internal {
template <typename M>
struct StringMapCodec {
  using V = typename M::mapped_type;
  static void Encode(const M& m, Encoder& enc) {
    Encoder::Nested nested(enc, "map");
    if (!nested.ok()) return;
    enc.WriteVarint(m.size());
    for (const auto& [k, v] : m) {
      enc.WriteString(k);
      Codec<V>::Encode(v, enc);
    }
  }
  static absl::Status Decode(Decoder& dec, M* out) {
    Decoder::Nested nested(dec, "map");
    if (!nested.status().ok()) return nested.status();
    uint64_t n = 0;
    absl::Status s = dec.ReadLength(&n, 1 + MinEncodedBytes<V>::value, "map size");
    if (!s.ok()) return s;
    out->clear();
    for (uint64_t i = 0; i < n; ++i) {
      std::string k;
      s = dec.ReadString(&k, "map key");
      if (!s.ok()) return s;
      // In place: map nodes do not move.
      auto [it, inserted] = out->try_emplace(std::move(k));
      if (!inserted) {
        return absl::DataLossError(absl::StrCat("duplicate map key '", it->first, "'"));
      }
      s = Codec<V>::Decode(dec, &it->second);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
};
}  // namespace internal

template <typename V, typename C, typename A>
struct Codec<std::map<std::string, V, C, A>>
    : internal::StringMapCodec<std::map<std::string, V, C, A>> {
  static std::string Name() { return absl::StrCat("map<string,", TypeName<V>(), ">"); }
};

template <typename V, typename H, typename E, typename A>
struct Codec<std::unordered_map<std::string, V, H, E, A>>
    : internal::StringMapCodec<std::unordered_map<std::string, V, H, E, A>> {
  static std::string Name() { return absl::StrCat("unordered_map<string,", TypeName<V>(), ">"); }
};

template <typename T>
struct Codec<std::optional<T>> {
  static std::string Name() { return absl::StrCat("optional<", TypeName<T>(), ">"); }
  static void Encode(const std::optional<T>& v, Encoder& enc) {
    Encoder::Nested nested(enc, "optional");
    if (!nested.ok()) return;
    enc.WritePod<uint8_t>(v.has_value() ? 1 : 0);
    if (v.has_value()) Codec<T>::Encode(*v, enc);
  }
  static absl::Status Decode(Decoder& dec, std::optional<T>* out) {
    Decoder::Nested nested(dec, "optional");
    if (!nested.status().ok()) return nested.status();
    bool has = false;
    absl::Status s = Codec<bool>::Decode(dec, &has);
    if (!s.ok()) return s;
    if (!has) {
      out->reset();
      return absl::OkStatus();
    }
    out->emplace();
    s = Codec<T>::Decode(dec, &**out);
    if (!s.ok()) out->reset();
    return s;
  }
};

template <typename A, typename B>
struct Codec<std::pair<A, B>> {
  static std::string Name() {
    return absl::StrCat("pair<", TypeName<A>(), ",", TypeName<B>(), ">");
  }
  static void Encode(const std::pair<A, B>& v, Encoder& enc) {
    Codec<A>::Encode(v.first, enc);
    Codec<B>::Encode(v.second, enc);
  }
  static absl::Status Decode(Decoder& dec, std::pair<A, B>* out) {
    RETURN_IF_ERROR(Codec<A>::Decode(dec, &out->first));
    return Codec<B>::Decode(dec, &out->second);
  }
};

template <typename... Ts>
struct Codec<std::tuple<Ts...>> {
  static std::string Name() {
    std::string out = "tuple<";
    ((out += TypeName<Ts>() + ","), ...);
    if (sizeof...(Ts) > 0) out.pop_back();
    return out + ">";
  }
  static void Encode(const std::tuple<Ts...>& v, Encoder& enc) {
    std::apply([&enc](const auto&... e) { (EncodeValue(e, enc), ...); }, v);
  }
  static absl::Status Decode(Decoder& dec, std::tuple<Ts...>* out) {
    return DecodeElements(dec, out, std::index_sequence_for<Ts...>());
  }

 private:
  template <size_t... I>
  static absl::Status DecodeElements(Decoder& dec, [[maybe_unused]] std::tuple<Ts...>* out,
                                     std::index_sequence<I...>) {
    absl::Status s;
    // Stops at the first error; names the element that failed.
    ((s.ok() ? (s = ElementStatus<I>(dec, out), 0) : 0), ...);
    return s;
  }
  template <size_t I>
  static absl::Status ElementStatus(Decoder& dec, std::tuple<Ts...>* out) {
    absl::Status s = DecodeValue(dec, &std::get<I>(*out));
    if (s.ok()) return s;
    return absl::Status(
        s.code(),
        absl::StrCat("element ", I, " (", TypeName<std::tuple_element_t<I, std::tuple<Ts...>>>(),
                     "): ", s.message()));
  }
};

// ---- Structs ----
// Inside a struct, lists the fields that travel, in wire order:
//   struct PullRequest {
//     int32_t trainer = 0;
//     std::vector<std::string> tables;
//     BATON_CODEC_FIELDS(PullRequest, trainer, tables);
//   };
// Name() is "PullRequest{int32,vector<string>}": a peer whose struct lists
// other field types is refused as an argument type mismatch. Adding a field
// changes the name, so both ends must be rebuilt together, as for any
// signature change.
#define BATON_CODEC_FIELDS(Type, ...)                           \
  static constexpr const char* kCodecName = #Type;              \
  static constexpr const char* kCodecFieldNames = #__VA_ARGS__; \
  auto CodecFields() { return std::tie(__VA_ARGS__); }          \
  auto CodecFields() const { return std::tie(__VA_ARGS__); }

namespace internal {
template <typename T, typename = void>
struct HasCodecFields : std::false_type {};
template <typename T>
struct HasCodecFields<T, std::void_t<decltype(std::declval<T&>().CodecFields())>> : std::true_type {
};
// The `index`-th name in a BATON_CODEC_FIELDS list ("a, b, c").
std::string CodecFieldName(const char* names, size_t index);
}  // namespace internal

template <typename T>
struct Codec<T, std::enable_if_t<internal::HasCodecFields<T>::value>> {
  using Fields = decltype(std::declval<T&>().CodecFields());
  static constexpr size_t kCount = std::tuple_size_v<Fields>;

  static std::string Name() { return NameOf(std::make_index_sequence<kCount>()); }
  static void Encode(const T& v, Encoder& enc) {
    std::apply([&enc](const auto&... f) { (EncodeValue(f, enc), ...); }, v.CodecFields());
  }
  static absl::Status Decode(Decoder& dec, T* out) {
    Fields fields = out->CodecFields();
    return DecodeFields(dec, fields, std::make_index_sequence<kCount>());
  }

 private:
  template <size_t I>
  using Field = std::decay_t<std::tuple_element_t<I, Fields>>;

  template <size_t... I>
  static std::string NameOf(std::index_sequence<I...>) {
    std::string out = absl::StrCat(T::kCodecName, "{");
    ((out += TypeName<Field<I>>() + ","), ...);
    if (sizeof...(I) > 0) out.pop_back();
    return out + "}";
  }
  template <size_t... I>
  static absl::Status DecodeFields(Decoder& dec, [[maybe_unused]] Fields& fields,
                                   std::index_sequence<I...>) {
    absl::Status s;
    ((s.ok() ? (s = FieldStatus<I>(dec, fields), 0) : 0), ...);
    return s;
  }
  template <size_t I>
  static absl::Status FieldStatus(Decoder& dec, Fields& fields) {
    absl::Status s = DecodeValue(dec, &std::get<I>(fields));
    if (s.ok()) return s;
    return absl::Status(
        s.code(), absl::StrCat(T::kCodecName, ".", internal::CodecFieldName(T::kCodecFieldNames, I),
                               ": ", s.message()));
  }
};

}  // namespace baton::rpc

#endif  // BATON_RPC_CODEC_H_
