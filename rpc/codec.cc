#include "rpc/codec.h"

#include <ATen/Functions.h>
#include <c10/core/ScalarType.h>
#include <torch/cuda.h>

#include "base/status_macros.h"

namespace baton::rpc {
namespace {

constexpr uint8_t kUndefinedTensor = 0;
constexpr uint8_t kDenseTensor = 1;
// A CUDA tensor (docs/cuda.md): the dense layout, then the destination's
// device index, then how its bytes travel: kHostStaged, a host copy in the
// blob; kCudaIpc, what the CudaTensorChannel exported (same host).
constexpr uint8_t kCudaTensor = 2;
// A sparse COO tensor (CPU): dtype, requires_grad, sizes, the number of
// sparse dimensions and whether the sender's tensor was coalesced, then its
// indices and its values as two dense tensors.
constexpr uint8_t kSparseCooTensor = 3;
// A non-contiguous view of a CPU tensor (ViewLayout::kKeep): the dense
// header, then one stride per dimension, then the blob of the storage range
// the view spans (from its first element to its last, in storage order).
constexpr uint8_t kDenseView = 4;
// The largest contiguous copy of an overlapping view a kCompact decoder
// makes (DecodeStrided).
constexpr uint64_t kMaxExpandedBytes = uint64_t{256} << 20;
constexpr uint8_t kHostStaged = 0;
constexpr uint8_t kCudaIpc = 1;
constexpr uint64_t kMaxDims = 64;
// Bounds the product of a tensor's nonzero sizes (and thus its element
// count and strides): 2^48 elements.
constexpr uint64_t kMaxExtent = uint64_t{1} << 48;
// Received tensors alias the receive buffer only when it is this aligned.
constexpr uintptr_t kZeroCopyAlignment = 16;

bool IsSupportedDtype(int code) {
  if (code < 0 || code >= static_cast<int>(c10::ScalarType::NumOptions)) {
    return false;
  }
  const auto st = static_cast<c10::ScalarType>(code);
  return !c10::isQIntType(st) && st != c10::ScalarType::Undefined &&
         st != c10::ScalarType::ComplexHalf;
}

}  // namespace

void Encoder::WriteVarint(uint64_t v) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  bytes_.append(buf, n);
}

Encoder::Nested::Nested(Encoder& enc, absl::string_view what)
    : enc_(enc), ok_(++enc.depth_ <= kMaxNesting) {
  if (!ok_) {
    enc.Fail(absl::InvalidArgumentError(
        absl::StrCat("cannot send a value nested ", enc.depth_, " containers deep (at a ", what,
                     "): a receiver accepts at most ", kMaxNesting)));
  }
}

Decoder::Nested::Nested(Decoder& dec, absl::string_view what) : dec_(dec) {
  if (++dec.depth_ > kMaxNesting) {
    status_ = absl::DataLossError(
        absl::StrCat("nesting depth ", dec.depth_, " exceeds ", kMaxNesting, " reading ", what));
  }
}

namespace internal {
std::string CodecFieldName(const char* names, size_t index) {
  absl::string_view rest(names);
  for (size_t i = 0;; ++i) {
    const size_t comma = rest.find(',');
    absl::string_view name = rest.substr(0, comma);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (i == index) return std::string(name);
    if (comma == absl::string_view::npos) return absl::StrCat("field ", index);
    rest.remove_prefix(comma + 1);
  }
}
}  // namespace internal

absl::StatusOr<Payload> Encoder::Finish() && {
  Payload p;
  p.undo_if_undelivered = std::move(undo_);
  if (!status_.ok()) {
    p.Undeliverable();  // the message will not be sent
    return status_;
  }
  p.bytes = std::move(bytes_);
  p.blobs = std::move(blobs_);
  return p;
}

absl::Status Decoder::ReadBytes(void* out, size_t n, absl::string_view what) {
  if (remaining() < n) {
    return absl::DataLossError(absl::StrCat("truncated payload reading ", what, ": need ", n,
                                            " bytes, ", remaining(), " left"));
  }
  if (n > 0) std::memcpy(out, payload_.bytes.data() + pos_, n);
  pos_ += n;
  return absl::OkStatus();
}

absl::Status Decoder::ReadVarint(uint64_t* out, absl::string_view what) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos_ >= payload_.bytes.size()) {
      return absl::DataLossError(absl::StrCat("truncated payload reading ", what));
    }
    const uint8_t b = static_cast<uint8_t>(payload_.bytes[pos_++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return absl::OkStatus();
    }
  }
  return absl::DataLossError(absl::StrCat("malformed varint reading ", what));
}

absl::Status Decoder::ReadLength(uint64_t* out, size_t min_element_bytes, absl::string_view what) {
  RETURN_IF_ERROR(ReadVarint(out, what));
  // Elements of zero encoded bytes (e.g. void) are bounded by a generous cap.
  const uint64_t cap = min_element_bytes == 0 ? std::max<uint64_t>(remaining(), 1) * 64 + (1 << 20)
                                              : remaining() / min_element_bytes;
  if (*out > cap) {
    return absl::DataLossError(absl::StrCat(what, " ", *out, " is larger than the payload allows"));
  }
  return absl::OkStatus();
}

absl::Status Decoder::ReadString(std::string* out, absl::string_view what) {
  uint64_t n = 0;
  RETURN_IF_ERROR(ReadLength(&n, 1, what));
  out->assign(payload_.bytes.data() + pos_, n);
  pos_ += n;
  return absl::OkStatus();
}

absl::StatusOr<const Blob*> Decoder::GetBlob(uint64_t index, absl::string_view what) {
  if (index >= payload_.blobs.size()) {
    return absl::DataLossError(absl::StrCat(what, " refers to blob ", index,
                                            " but the message has ", payload_.blobs.size()));
  }
  return &payload_.blobs[index];
}

absl::Status Decoder::ExpectEnd() const {
  if (remaining() != 0) {
    return absl::DataLossError(absl::StrCat(remaining(), " unexpected trailing bytes in payload"));
  }
  return absl::OkStatus();
}

namespace {

void EncodeStrided(const at::Tensor& tensor, Encoder& enc, ViewLayout views, bool follow_map);
void EncodeSparseCoo(const at::Tensor& tensor, Encoder& enc);
absl::Status DecodeStrided(Decoder& dec, uint8_t tag, ViewLayout views, at::Tensor* out);
absl::Status DecodeSparseCoo(Decoder& dec, at::Tensor* out);

// What every tensor layout writes after its tag: dtype, requires_grad and
// the sizes.
struct TensorHeader {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool requires_grad = false;
  std::vector<int64_t> sizes;
  uint64_t numel = 1;
};

void WriteTensorHeader(c10::ScalarType dtype, bool requires_grad, c10::IntArrayRef sizes,
                       Encoder& enc) {
  enc.WritePod<int8_t>(static_cast<int8_t>(dtype));
  enc.WritePod<uint8_t>(requires_grad ? 1 : 0);
  enc.WriteVarint(sizes.size());
  for (int64_t d : sizes) enc.WriteVarint(static_cast<uint64_t>(d));
}

absl::Status ReadTensorHeader(Decoder& dec, TensorHeader* h) {
  absl::Status s;
  int8_t dtype = 0;
  uint8_t requires_grad = 0;
  uint64_t ndim = 0;
  if (!(s = dec.ReadPod(&dtype, "tensor dtype")).ok()) return s;
  if (!IsSupportedDtype(dtype)) {
    return absl::DataLossError(absl::StrCat("bad tensor dtype code ", int{dtype}));
  }
  if (!(s = dec.ReadPod(&requires_grad, "tensor requires_grad")).ok()) return s;
  if (!(s = dec.ReadVarint(&ndim, "tensor rank")).ok()) return s;
  if (ndim > kMaxDims) {
    return absl::DataLossError(absl::StrCat("tensor rank ", ndim, " exceeds ", kMaxDims));
  }
  h->dtype = static_cast<c10::ScalarType>(dtype);
  // Only floating-point and complex tensors can require grad.
  h->requires_grad =
      requires_grad != 0 && (c10::isFloatingType(h->dtype) || c10::isComplexType(h->dtype));
  h->sizes.resize(ndim);
  h->numel = 1;
  // The product of the nonzero sizes, which also bounds the strides of a
  // tensor with no elements.
  uint64_t extent = 1;
  for (uint64_t i = 0; i < ndim; ++i) {
    uint64_t d = 0;
    if (!(s = dec.ReadVarint(&d, "tensor size")).ok()) return s;
    if (d > kMaxExtent || (d > 1 && extent > kMaxExtent / d)) {
      return absl::DataLossError(absl::StrCat("tensor shape overflows: size ", d, " of dimension ",
                                              i, " takes it past 2^48 elements"));
    }
    h->sizes[i] = static_cast<int64_t>(d);
    h->numel *= d;
    extent *= std::max<uint64_t>(d, 1);
  }
  return absl::OkStatus();
}

}  // namespace

void EncodeTensor(const at::Tensor& tensor, Encoder& enc, ViewLayout views) {
  const CodecContext* context = enc.context();
  if (context != nullptr && context->sent_tensors != nullptr) {
    context->sent_tensors->push_back(tensor);
  }
  if (!tensor.defined()) {
    enc.WritePod<uint8_t>(kUndefinedTensor);
    return;
  }
  if (tensor.layout() == c10::kSparse) {
    EncodeSparseCoo(tensor, enc);
  } else {
    EncodeStrided(tensor, enc, views, /*follow_map=*/true);
  }
}

absl::Status DecodeTensor(Decoder& dec, at::Tensor* out, ViewLayout views) {
  if (const CodecContext* c = dec.context(); c != nullptr && c->received_tensors != nullptr) {
    c->received_tensors->push_back(out);
  }
  uint8_t tag = 0;
  RETURN_IF_ERROR(dec.ReadPod(&tag, "tensor tag"));
  switch (tag) {
    case kUndefinedTensor: *out = at::Tensor(); return absl::OkStatus();
    case kDenseTensor:
    case kCudaTensor:
    case kDenseView: return DecodeStrided(dec, tag, views, out);
    case kSparseCooTensor: return DecodeSparseCoo(dec, out);
    default: return absl::DataLossError(absl::StrCat("bad tensor tag ", int{tag}));
  }
}

void EncodeTensors(const std::vector<at::Tensor>& v, Encoder& enc, ViewLayout views) {
  Codec<std::vector<at::Tensor>>::EncodeWith(
      v, enc, [views](const at::Tensor& t, Encoder& e) { EncodeTensor(t, e, views); });
}

absl::Status DecodeTensors(Decoder& dec, std::vector<at::Tensor>* out, ViewLayout views) {
  return Codec<std::vector<at::Tensor>>::DecodeWith(
      dec, out, [views](Decoder& d, at::Tensor* t) { return DecodeTensor(d, t, views); });
}

namespace {

// The elements of storage a view with these sizes and (nonnegative)
// strides spans, from its first element to its last; 0 without elements.
uint64_t SpannedElements(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  uint64_t last = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return 0;
    last += static_cast<uint64_t>(sizes[i] - 1) * static_cast<uint64_t>(strides[i]);
  }
  return last + 1;
}

// Whether a non-contiguous CPU view travels as a view (ViewLayout::kKeep):
// unless the range it spans is both large and mostly not its own.
bool KeepsView(const at::Tensor& t) {
  for (int64_t s : t.strides()) {
    if (s < 0) return false;
  }
  const size_t spanned = SpannedElements(t.sizes(), t.strides()) * t.element_size();
  const size_t own = static_cast<size_t>(t.numel()) * t.element_size();
  return spanned < kKeepViewMaxWaste || spanned < 2 * own;
}

// The device a strided tensor arrives on (kCpuDevice or a CUDA index), or
// nullopt after enc.Fail. The agent (CodecContext::devices, a virtual call,
// no link to it) answers within a call; a CPU tensor outside one, or with
// `follow_map` false (the parts of a sparse tensor), stays on the CPU.
std::optional<int> Destination(const at::Tensor& tensor, Encoder& enc, bool follow_map) {
  const CodecContext* context = enc.context();
  const bool in_call = context != nullptr && context->devices != nullptr && context->peer >= 0;
  if (tensor.device().is_cuda()) {
    if (!in_call) {
      enc.Fail(absl::InvalidArgumentError(absl::StrCat(
          "cannot send a tensor on device ", tensor.device().str(),
          " outside a call: its destination's device comes from the agent's device map")));
      return std::nullopt;
    }
  } else if (!tensor.device().is_cpu()) {
    enc.Fail(absl::InvalidArgumentError(
        absl::StrCat("cannot send a tensor on device ", tensor.device().str(),
                     ": baton sends CPU and CUDA tensors only (move it with .cpu())")));
    return std::nullopt;
  } else if (!in_call || !follow_map) {
    return kCpuDevice;
  }
  const int device = tensor.device().is_cuda() ? tensor.device().index() : kCpuDevice;
  absl::StatusOr<int> there =
      context->devices->DeviceOnPeer(context->peer, device, context->answers);
  if (!there.ok()) {
    enc.Fail(there.status());
    return std::nullopt;
  }
  return *there;
}

// The dense layout (and CUDA tensors), after the tag's caller checked that
// `tensor` is defined. A tensor bound for a GPU (its device map says so)
// travels as kCudaTensor, from a GPU or from the host; one bound for the
// host leaves a GPU as a host copy. `follow_map` false keeps a CPU tensor
// on the CPU whatever the map says (the parts of a sparse tensor).
void EncodeStrided(const at::Tensor& tensor, Encoder& enc, ViewLayout views, bool follow_map) {
  const std::optional<int> destination = Destination(tensor, enc, follow_map);
  if (!destination.has_value()) return;
  const int destination_device = *destination;
  if (tensor.layout() != c10::kStrided) {
    enc.Fail(absl::InvalidArgumentError(
        absl::StrCat("cannot send a tensor of layout ", c10::toString(tensor.layout()),
                     ": baton sends strided and sparse COO tensors (convert it with "
                     ".to_dense() or .to_sparse())")));
    return;
  }
  if (!IsSupportedDtype(static_cast<int>(tensor.scalar_type()))) {
    enc.Fail(absl::InvalidArgumentError(
        absl::StrCat("cannot send a tensor of dtype ", c10::toString(tensor.scalar_type()))));
    return;
  }
  if (views == ViewLayout::kKeep && destination_device == kCpuDevice && tensor.is_cpu() &&
      !tensor.is_contiguous() && KeepsView(tensor)) {
    const at::Tensor v = tensor.detach();
    enc.WritePod<uint8_t>(kDenseView);
    WriteTensorHeader(v.scalar_type(), tensor.requires_grad(), v.sizes(), enc);
    for (int64_t s : v.strides()) enc.WriteVarint(static_cast<uint64_t>(s));
    Blob blob;
    const size_t nbytes = SpannedElements(v.sizes(), v.strides()) * v.element_size();
    if (nbytes > 0) {
      blob.pieces.emplace_back(static_cast<const char*>(v.data_ptr()), nbytes);
      blob.owner = std::make_shared<at::Tensor>(v);
    }
    enc.WriteVarint(enc.AddBlob(std::move(blob)));
    return;
  }
  // Only the viewed elements travel: a non-contiguous view is compacted; a
  // contiguous view sends its own range of the storage. A CUDA tensor is
  // copied to the host on the current stream (after the work queued on it)
  // unless CUDA IPC takes it.
  at::Tensor c = tensor.detach();
  if (!c.is_contiguous()) c = c.contiguous();
  enc.WritePod<uint8_t>(destination_device >= 0 ? kCudaTensor : kDenseTensor);
  WriteTensorHeader(c.scalar_type(), tensor.requires_grad(), c.sizes(), enc);
  if (destination_device >= 0) {
    // Only the agent sends a tensor to a GPU (Destination), so in a call.
    const CodecContext* context = enc.context();
    CudaTensorChannel* channel = context->devices->CudaChannelFor(context->peer);
    enc.WriteVarint(static_cast<uint64_t>(destination_device));
    const size_t bytes = static_cast<size_t>(c.numel()) * c.element_size();
    if (c.is_cuda() && channel != nullptr && bytes > 0 && channel->Wants(bytes)) {
      enc.WritePod<uint8_t>(kCudaIpc);
      if (absl::Status s = channel->Export(c, context->peer, enc); !s.ok()) enc.Fail(s);
      return;
    }
    enc.WritePod<uint8_t>(kHostStaged);
  }
  if (c.is_cuda()) c = c.to(at::kCPU);
  Blob blob;
  const size_t nbytes = static_cast<size_t>(c.numel()) * c.element_size();
  if (nbytes > 0) {
    blob.pieces.emplace_back(static_cast<const char*>(c.data_ptr()), nbytes);
    blob.owner = std::make_shared<at::Tensor>(std::move(c));
  }
  enc.WriteVarint(enc.AddBlob(std::move(blob)));
}

absl::Status DecodeStrided(Decoder& dec, uint8_t tag, ViewLayout views, at::Tensor* out) {
  TensorHeader header;
  absl::Status s = ReadTensorHeader(dec, &header);
  if (!s.ok()) return s;
  const c10::ScalarType st = header.dtype;
  const std::vector<int64_t>& sizes = header.sizes;
  // The elements the blob holds: the tensor's own, or a view's span.
  uint64_t numel = header.numel;
  std::vector<int64_t> strides;
  if (tag == kDenseView) {
    strides.resize(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      uint64_t stride = 0;
      if (!(s = dec.ReadVarint(&stride, "tensor stride")).ok()) return s;
      // Each step (size - 1) * stride at most 2^48, so the span, a sum of
      // at most 64 of them, stays far within 64 bits.
      const uint64_t steps = sizes[i] > 0 ? static_cast<uint64_t>(sizes[i] - 1) : 0;
      if (stride > kMaxExtent || (steps > 0 && stride > kMaxExtent / steps)) {
        return absl::DataLossError(absl::StrCat("tensor view's stride ", stride, " of dimension ",
                                                i, " takes its span past 2^48 elements"));
      }
      strides[i] = static_cast<int64_t>(stride);
    }
    numel = SpannedElements(sizes, strides);
    if (numel > kMaxExtent) {
      return absl::DataLossError(
          absl::StrCat("a tensor view spans ", numel, " elements, past 2^48"));
    }
  }
  int64_t cuda_device = -1;
  if (tag == kCudaTensor) {
    uint64_t device = 0;
    uint8_t path = 0;
    if (!(s = dec.ReadVarint(&device, "tensor device")).ok()) return s;
    if (!(s = dec.ReadPod(&path, "tensor path")).ok()) return s;
    if (path != kHostStaged && path != kCudaIpc) {
      return absl::DataLossError(absl::StrCat("bad CUDA tensor path ", int{path}));
    }
    const uint64_t devices = torch::cuda::device_count();
    if (device >= devices) {
      return absl::DataLossError(
          absl::StrCat("a CUDA tensor arrived for cuda:", device, ", but this worker has ", devices,
                       " CUDA device(s) (the sender checked its device map against the ones this "
                       "worker published, so the message is corrupt or from another job)"));
    }
    cuda_device = static_cast<int64_t>(device);
    if (path == kCudaIpc) {
      const CodecContext* context = dec.context();
      CudaTensorChannel* channel = nullptr;
      if (context != nullptr && context->devices != nullptr) {
        channel = context->devices->CudaChannelFor(context->peer);
      }
      if (channel == nullptr) {
        return absl::DataLossError(
            "a CUDA tensor arrived through CUDA IPC, but this worker has no CUDA IPC channel "
            "for its sender (AgentCollaborators::cuda_channel), and said so in its "
            "registration");
      }
      ASSIGN_OR_RETURN(auto imported,
                       channel->Import(dec, context->peer, static_cast<int>(device), sizes, st));
      *out = std::move(imported);
      if (header.requires_grad) out->set_requires_grad(true);
      return absl::OkStatus();
    }
  }
  uint64_t blob_index = 0;
  if (!(s = dec.ReadVarint(&blob_index, "tensor blob index")).ok()) return s;
  ASSIGN_OR_RETURN(auto blob, dec.GetBlob(blob_index, "tensor"));
  const size_t nbytes = numel * c10::elementSize(st);
  if ((blob)->size() != nbytes) {
    return absl::DataLossError(absl::StrCat("tensor of shape with ", numel, " elements of ",
                                            c10::toString(st), " needs ", nbytes,
                                            " bytes but its blob has ", (blob)->size()));
  }
  const auto options = at::TensorOptions().dtype(st);
  const char* data = (blob)->contiguous();
  if (tag == kDenseView) {
    // The view over its span, aliasing the receive buffer when it can.
    if (nbytes == 0) {
      *out = at::empty(sizes, options);
    } else if (data != nullptr && reinterpret_cast<uintptr_t>(data) % kZeroCopyAlignment == 0) {
      std::shared_ptr<const void> owner = (blob)->owner;
      *out = at::from_blob(
          const_cast<char*>(data), sizes, strides, [owner](void*) mutable { owner.reset(); },
          options);
    } else {
      *out = at::empty_strided(sizes, strides, options);
      (blob)->CopyTo(out->data_ptr());
    }
    if (views == ViewLayout::kCompact) {
      // A view whose elements overlap (stride 0: expand()) is larger dense
      // than the span that travelled: bounded, or a small message could ask
      // for any amount of memory.
      const uint64_t dense = header.numel * c10::elementSize(st);
      if (dense > nbytes && dense > kMaxExpandedBytes) {
        *out = at::Tensor();
        return absl::DataLossError(
            absl::StrCat("a tensor view of ", nbytes,
                         " bytes whose elements overlap (e.g. expand()) would take ", dense,
                         " bytes to make contiguous, past the ", kMaxExpandedBytes,
                         " bytes a C++ function accepts; send it contiguous"));
      }
      *out = out->contiguous();
    }
  } else if (nbytes == 0) {
    *out = at::empty(sizes, options);
  } else if (data != nullptr && reinterpret_cast<uintptr_t>(data) % kZeroCopyAlignment == 0) {
    std::shared_ptr<const void> owner = (blob)->owner;
    *out = at::from_blob(
        const_cast<char*>(data), sizes, [owner](void*) mutable { owner.reset(); }, options);
  } else {
    *out = at::empty(sizes, options);
    (blob)->CopyTo(out->data_ptr());
  }
  if (cuda_device >= 0) {
    // Onto the mapped device, on this thread's current stream; the host
    // waits for the copy, so the received bytes may be released after.
    *out = out->to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)));
  }
  if (header.requires_grad) out->set_requires_grad(true);
  return absl::OkStatus();
}

void EncodeSparseCoo(const at::Tensor& tensor, Encoder& enc) {
  if (!tensor.device().is_cpu()) {
    enc.Fail(absl::InvalidArgumentError(
        absl::StrCat("cannot send a sparse tensor on device ", tensor.device().str(),
                     ": baton sends sparse tensors from the CPU only (move it with .cpu())")));
    return;
  }
  if (!IsSupportedDtype(static_cast<int>(tensor.scalar_type()))) {
    enc.Fail(absl::InvalidArgumentError(
        absl::StrCat("cannot send a tensor of dtype ", c10::toString(tensor.scalar_type()))));
    return;
  }
  enc.WritePod<uint8_t>(kSparseCooTensor);
  WriteTensorHeader(tensor.scalar_type(), tensor.requires_grad(), tensor.sizes(), enc);
  enc.WriteVarint(static_cast<uint64_t>(tensor.sparse_dim()));
  enc.WritePod<uint8_t>(tensor.is_coalesced() ? 1 : 0);
  // Their own entries in the message, not in CodecContext::sent_tensors:
  // autograd sees the sparse tensor, not its parts.
  // The parts stay on the CPU: a sparse tensor arrives there whatever the
  // device map says of the host.
  EncodeStrided(tensor._indices().detach(), enc, ViewLayout::kCompact, /*follow_map=*/false);
  EncodeStrided(tensor._values().detach(), enc, ViewLayout::kCompact, /*follow_map=*/false);
}

// One part of a sparse tensor: a CPU dense tensor of the given dtype and rank.
absl::Status DecodeSparsePart(Decoder& dec, absl::string_view what, c10::ScalarType dtype,
                              size_t rank, at::Tensor* out) {
  uint8_t tag = 0;
  absl::Status s = dec.ReadPod(&tag, what);
  if (!s.ok()) return s;
  if (tag != kDenseTensor) {
    return absl::DataLossError(
        absl::StrCat("sparse tensor's ", what, " has tag ", int{tag}, ", not a CPU dense tensor"));
  }
  if (!(s = DecodeStrided(dec, tag, ViewLayout::kCompact, out)).ok()) return s;
  if (out->requires_grad()) out->set_requires_grad(false);  // the sparse tensor carries the flag
  if (out->scalar_type() != dtype || static_cast<size_t>(out->dim()) != rank) {
    return absl::DataLossError(absl::StrCat(
        "sparse tensor's ", what, " is ", c10::toString(out->scalar_type()), " of rank ",
        out->dim(), ", expected ", c10::toString(dtype), " of rank ", rank));
  }
  return absl::OkStatus();
}

absl::Status DecodeSparseCoo(Decoder& dec, at::Tensor* out) {
  TensorHeader header;
  absl::Status s = ReadTensorHeader(dec, &header);
  if (!s.ok()) return s;
  uint64_t sparse_dim = 0;
  uint8_t coalesced = 0;
  if (!(s = dec.ReadVarint(&sparse_dim, "sparse tensor's sparse_dim")).ok()) return s;
  if (sparse_dim > header.sizes.size()) {
    return absl::DataLossError(absl::StrCat("sparse tensor has ", sparse_dim,
                                            " sparse dimensions but rank ", header.sizes.size()));
  }
  if (!(s = dec.ReadPod(&coalesced, "sparse tensor's coalesced flag")).ok()) return s;
  at::Tensor indices, values;
  const size_t dense_dim = header.sizes.size() - sparse_dim;
  if (!(s = DecodeSparsePart(dec, "indices", at::kLong, 2, &indices)).ok()) return s;
  if (!(s = DecodeSparsePart(dec, "values", header.dtype, 1 + dense_dim, &values)).ok()) return s;
  const int64_t nnz = values.size(0);
  if (indices.size(0) != static_cast<int64_t>(sparse_dim) || indices.size(1) != nnz) {
    return absl::DataLossError(absl::StrCat("sparse tensor's indices are ", indices.size(0), "x",
                                            indices.size(1), ", expected ", sparse_dim, "x", nnz));
  }
  for (size_t d = 0; d < dense_dim; ++d) {
    if (values.size(1 + d) != header.sizes[sparse_dim + d]) {
      return absl::DataLossError(absl::StrCat(
          "sparse tensor's values have size ", values.size(1 + d), " in dense dimension ", d,
          ", but the tensor's size there is ", header.sizes[sparse_dim + d]));
    }
  }
  // Every index within its dimension: kernels index memory with them.
  if (nnz > 0) {
    const at::Tensor lowest = std::get<0>(indices.min(1));
    const at::Tensor highest = std::get<0>(indices.max(1));
    const int64_t* lo = lowest.data_ptr<int64_t>();
    const int64_t* hi = highest.data_ptr<int64_t>();
    for (uint64_t d = 0; d < sparse_dim; ++d) {
      if (lo[d] < 0 || hi[d] >= header.sizes[d]) {
        return absl::DataLossError(absl::StrCat("sparse tensor's indices in dimension ", d,
                                                " span [", lo[d], ", ", hi[d],
                                                "], outside its size ", header.sizes[d]));
      }
    }
  }
  *out = at::_sparse_coo_tensor_unsafe(indices, values, header.sizes);
  // The sender's flag is not trusted (kernels rely on coalesced tensors
  // having no duplicates): a tensor sent coalesced is coalesced again here,
  // which keeps it coalesced and checks it.
  if (coalesced != 0) *out = out->coalesce();
  if (header.requires_grad) out->set_requires_grad(true);
  return absl::OkStatus();
}

}  // namespace

}  // namespace baton::rpc
