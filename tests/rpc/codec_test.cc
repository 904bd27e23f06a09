// Round trips of every supported type through the codecs.
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_sparse_coo_tensor_unsafe.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/quantize_per_tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sparse_coo_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "absl/strings/match.h"
#include "proto/rref.pb.h"
#include "rpc/codec.h"
#include "rpc/function.h"
#include "rpc/proto_codec.h"

namespace app {
// A user type with its own codec.
struct Point {
  double x = 0;
  double y = 0;
  std::string label;
  at::Tensor features;
};
// A recursive user type: its nesting depth is up to the sender.
struct Tree {
  std::vector<Tree> children;
};
}  // namespace app

namespace baton::rpc {
template <>
struct Codec<app::Point> {
  static std::string Name() { return "Point"; }
  static void Encode(const app::Point& p, Encoder& enc) {
    EncodeValue(p.x, enc);
    EncodeValue(p.y, enc);
    EncodeValue(p.label, enc);
    EncodeValue(p.features, enc);
  }
  static absl::Status Decode(Decoder& dec, app::Point* p) {
    for (absl::Status s : {DecodeValue(dec, &p->x), DecodeValue(dec, &p->y),
                           DecodeValue(dec, &p->label), DecodeValue(dec, &p->features)}) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
};

template <>
struct Codec<app::Tree> {
  static std::string Name() { return "Tree"; }
  static void Encode(const app::Tree& t, Encoder& enc) { EncodeValue(t.children, enc); }
  static absl::Status Decode(Decoder& dec, app::Tree* t) { return DecodeValue(dec, &t->children); }
};

namespace {

template <typename T>
T RoundTrip(const T& v) {
  absl::StatusOr<Payload> p = EncodeMessage(v);
  EXPECT_TRUE(p.ok()) << p.status();
  T out{};
  absl::Status s = DecodeMessage(*p, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Simulates the receive side: blobs are split into pieces at odd offsets and
// copied into buffers that do not belong to the sender.
Payload AsReceived(const Payload& sent, size_t piece) {
  Payload r;
  r.bytes = sent.bytes;
  auto storage = std::make_shared<std::vector<std::string>>();
  for (const auto& b : sent.blobs) {
    std::string all(b.size(), '\0');
    b.CopyTo(all.data());
    Blob nb;
    for (size_t off = 0; off < all.size(); off += piece) {
      storage->push_back("x" + all.substr(off, piece));  // misaligned by one byte
    }
    for (auto& s : *storage) {
      if (nb.size() < all.size()) nb.pieces.emplace_back(s.data() + 1, s.size() - 1);
    }
    nb.owner = storage;
    r.blobs.push_back(std::move(nb));
    storage = std::make_shared<std::vector<std::string>>();
  }
  return r;
}

TEST(Codec, Scalars) {
  EXPECT_EQ(RoundTrip(true), true);
  EXPECT_EQ(RoundTrip(false), false);
  EXPECT_EQ(RoundTrip(int8_t{-5}), -5);
  EXPECT_EQ(RoundTrip(uint8_t{250}), 250);
  EXPECT_EQ(RoundTrip(int16_t{-30000}), -30000);
  EXPECT_EQ(RoundTrip(int32_t{-2000000000}), -2000000000);
  EXPECT_EQ(RoundTrip(uint32_t{4000000000u}), 4000000000u);
  EXPECT_EQ(RoundTrip(int64_t{-(int64_t{1} << 62)}), -(int64_t{1} << 62));
  EXPECT_EQ(RoundTrip(uint64_t{~0ull}), ~0ull);
  EXPECT_EQ(RoundTrip(3.25f), 3.25f);
  EXPECT_EQ(RoundTrip(-1e300), -1e300);
  EXPECT_EQ(RoundTrip(std::string("hello\0world", 11)), std::string("hello\0world", 11));
  EXPECT_EQ(RoundTrip(std::string()), "");
}

TEST(Codec, Containers) {
  std::vector<int64_t> v = {1, -2, 3};
  EXPECT_EQ(RoundTrip(v), v);
  std::vector<bool> vb = {true, false, true};
  EXPECT_EQ(RoundTrip(vb), vb);
  std::vector<std::vector<std::string>> nested = {{"a", "b"}, {}, {"c"}};
  EXPECT_EQ(RoundTrip(nested), nested);
  std::map<std::string, double> m = {{"lr", 0.1}, {"momentum", 0.9}};
  EXPECT_EQ(RoundTrip(m), m);
  std::unordered_map<std::string, std::vector<int32_t>> um = {{"x", {1, 2}}, {"y", {}}};
  EXPECT_EQ(RoundTrip(um), um);
  std::optional<std::string> some = "v", none;
  EXPECT_EQ(RoundTrip(some), some);
  EXPECT_EQ(RoundTrip(none), none);
  auto t = std::make_tuple(int64_t{1}, std::string("two"), 3.0, std::vector<bool>{true});
  EXPECT_EQ(RoundTrip(t), t);
  std::pair<std::string, int32_t> p = {"k", 9};
  EXPECT_EQ(RoundTrip(p), p);
}

TEST(Codec, EveryDtype) {
  const std::vector<at::ScalarType> dtypes = {
      at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kByte,         at::kChar,
      at::kShort, at::kInt,    at::kLong, at::kBool,     at::kComplexFloat, at::kComplexDouble};
  for (auto dt : dtypes) {
    at::Tensor t = at::randn({3, 4, 5}, at::kDouble).mul(10).to(dt);
    at::Tensor back = RoundTrip(t);
    EXPECT_EQ(back.scalar_type(), dt) << c10::toString(dt);
    EXPECT_EQ(back.sizes(), t.sizes());
    EXPECT_TRUE(back.equal(t)) << c10::toString(dt);
  }
}

TEST(Codec, TensorShapes) {
  EXPECT_TRUE(RoundTrip(at::scalar_tensor(3.5)).equal(at::scalar_tensor(3.5)));
  at::Tensor empty = at::empty({0, 7});
  at::Tensor back = RoundTrip(empty);
  EXPECT_EQ(back.sizes(), empty.sizes());
  EXPECT_FALSE(RoundTrip(at::Tensor()).defined());
  at::Tensor grad = at::ones({2});
  grad.set_requires_grad(true);
  EXPECT_TRUE(RoundTrip(grad).requires_grad());
}

TEST(Codec, ViewsSendOnlyTheirBytes) {
  at::Tensor base = at::arange(10000, at::kFloat).reshape({100, 100});
  // Non-contiguous: a transposed block and a strided slice.
  for (at::Tensor view : {base.t().slice(0, 10, 20), base.slice(1, 0, 100, 3), base.select(1, 7),
                          base.slice(0, 50, 52)}) {
    auto p = EncodeMessage(view);
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(p->blobs.size(), 1u);
    EXPECT_EQ(p->blobs[0].size(), static_cast<size_t>(view.numel()) * 4);
    at::Tensor back;
    ASSERT_TRUE(DecodeMessage(*p, &back).ok());
    EXPECT_TRUE(back.is_contiguous());
    EXPECT_TRUE(back.equal(view));
  }
  // A contiguous view is not copied: the blob points into the base storage.
  at::Tensor rows = base.slice(0, 50, 52);
  auto p = EncodeMessage(rows);
  EXPECT_EQ(p->blobs[0].contiguous(), static_cast<const char*>(rows.data_ptr()));
}

// Tensors as the Python layer sends them (ViewLayout::kKeep), decoded with
// `views`.
absl::StatusOr<std::vector<at::Tensor>> KeepViewsRoundTrip(const std::vector<at::Tensor>& sent,
                                                           ViewLayout views, size_t piece = 0,
                                                           size_t* blob_bytes = nullptr) {
  Encoder enc;
  EncodeTensors(sent, enc, ViewLayout::kKeep);
  absl::StatusOr<Payload> p = std::move(enc).Finish();
  if (!p.ok()) return p.status();
  if (blob_bytes != nullptr) {
    *blob_bytes = 0;
    for (const Blob& b : p->blobs) *blob_bytes += b.size();
  }
  const Payload received = piece == 0 ? *std::move(p) : AsReceived(*p, piece);
  Decoder dec(received);
  std::vector<at::Tensor> out;
  absl::Status s = DecodeTensors(dec, &out, views);
  if (s.ok()) s = dec.ExpectEnd();
  if (!s.ok()) return s;
  return out;
}

TEST(Codec, PythonViewsKeepTheirStridesUnlessMostlyNotTheirOwn) {
  at::Tensor small = at::arange(25, at::kFloat).reshape({5, 5}).narrow(1, 2, 2);
  at::Tensor base = at::arange(10000, at::kFloat).reshape({100, 100});
  at::Tensor transposed = base.t();                                   // spans only its own bytes
  at::Tensor expanded = at::arange(3, at::kFloat).expand({1000, 3});  // stride 0
  at::Tensor column = base.select(1, 7);  // 400 bytes spread over 39,604
  const std::vector<at::Tensor> kept = {small, transposed, expanded};
  for (size_t piece : {size_t{0}, size_t{7}}) {  // aliased, then copied
    size_t blob_bytes = 0;
    auto back = KeepViewsRoundTrip({small, transposed, expanded, column}, ViewLayout::kKeep, piece,
                                   &blob_bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->size(), 4u);
    for (int i = 0; i < 3; ++i) {
      const at::Tensor& sent = kept[i];
      EXPECT_FALSE((*back)[i].is_contiguous()) << i;
      EXPECT_EQ((*back)[i].strides(), sent.strides()) << i;
      EXPECT_TRUE((*back)[i].equal(sent)) << i;
    }
    EXPECT_TRUE((*back)[3].is_contiguous());
    EXPECT_TRUE((*back)[3].equal(column));
    // Spans, not storages: 5x5's narrow spans 22 of its 25 elements; the
    // expanded row is sent once; the column only by its own 100 elements.
    EXPECT_EQ(blob_bytes, (22 + 10000 + 3 + 100) * sizeof(float));
  }
  // A C++ function's decoder gets every one of them contiguous.
  auto compact = KeepViewsRoundTrip(kept, ViewLayout::kCompact);
  ASSERT_TRUE(compact.ok()) << compact.status();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE((*compact)[i].is_contiguous()) << i;
    EXPECT_TRUE((*compact)[i].equal(kept[i])) << i;
  }
}

TEST(Codec, AViewWhoseSpanOverflowsOrDisagreesWithItsBlobIsDataLoss) {
  at::Tensor small = at::arange(25, at::kFloat).reshape({5, 5}).narrow(1, 2, 2);
  Encoder enc;
  EncodeTensors({small}, enc, ViewLayout::kKeep);
  absl::StatusOr<Payload> p = std::move(enc).Finish();
  ASSERT_TRUE(p.ok());
  // bytes: vector length, tag 4, dtype, requires_grad, rank 2, sizes 5 2,
  // strides 5 1, blob index.
  ASSERT_EQ(p->bytes.size(), 10u);
  ASSERT_EQ(p->bytes[1], 4);
  Payload huge = *p;
  huge.bytes = std::string(p->bytes.substr(0, 7)) +
               std::string("\x80\x80\x80\x80\x80\x80\x80\x01", 8) +
               std::string(p->bytes.substr(8));  // stride 2^49 on a dimension of size 5
  Decoder dec(huge);
  std::vector<at::Tensor> out;
  absl::Status s = DecodeTensors(dec, &out, ViewLayout::kKeep);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "stride")) << s;
  Payload wider = *p;
  wider.bytes[7] = 6;  // a stride of 6 spans 26 elements; the blob holds 22
  Decoder dec2(wider);
  s = DecodeTensors(dec2, &out, ViewLayout::kKeep);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

// An expanded view travels as its few bytes; a C++ function's decoder would
// make it contiguous, so a tiny message could ask for any amount of memory
// (the fuzzer found 20 GB): past 256 MiB it is refused, naming the sizes.
// Python's decoder keeps the view and allocates nothing.
TEST(Codec, AnOverlappingViewTooLargeToMakeContiguousIsRefused) {
  at::Tensor huge = at::arange(4, at::kFloat).expand({int64_t{1} << 25, 4});  // 512 MiB dense
  Encoder enc;
  EncodeTensors({huge}, enc, ViewLayout::kKeep);
  absl::StatusOr<Payload> p = std::move(enc).Finish();
  ASSERT_TRUE(p.ok()) << p.status();
  {
    Decoder dec(*p);
    std::vector<at::Tensor> out;
    absl::Status s = DecodeTensors(dec, &out, ViewLayout::kCompact);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "536870912 bytes to make contiguous")) << s;
  }
  Decoder dec(*p);
  std::vector<at::Tensor> out;
  ASSERT_TRUE(DecodeTensors(dec, &out, ViewLayout::kKeep).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].strides(), huge.strides());
}

TEST(Codec, SplitAndMisalignedReceiveBuffersAreCopiedCorrectly) {
  at::Tensor t = at::randn({33, 17}, at::kDouble);
  auto p = EncodeMessage(t);
  for (size_t piece : {7u, 64u, 100000u}) {
    Payload received = AsReceived(*p, piece);
    at::Tensor back;
    ASSERT_TRUE(DecodeMessage(received, &back).ok());
    EXPECT_TRUE(back.equal(t));
  }
}

TEST(Codec, ZeroCopyReceiveAliasesAlignedBuffer) {
  at::Tensor t = at::randn({64});
  auto p = EncodeMessage(t);
  at::Tensor back;
  ASSERT_TRUE(DecodeMessage(*p, &back).ok());
  EXPECT_EQ(back.data_ptr(), t.data_ptr());  // aligned, single piece: aliased
}

TEST(Codec, UserType) {
  app::Point pt{1.5, -2, "corner", at::arange(4)};
  app::Point back = RoundTrip(pt);
  EXPECT_EQ(back.x, 1.5);
  EXPECT_EQ(back.label, "corner");
  EXPECT_TRUE(back.features.equal(pt.features));
  EXPECT_EQ((TypeName<std::vector<app::Point>>()), "vector<Point>");
}

TEST(Codec, TypeNames) {
  EXPECT_EQ(TypeName<at::Tensor>(), "Tensor");
  EXPECT_EQ(TypeName<int64_t>(), "int64");
  EXPECT_EQ(TypeName<uint8_t>(), "uint8");
  EXPECT_EQ((TypeName<std::map<std::string, std::optional<double>>>()),
            "map<string,optional<double>>");
  EXPECT_EQ((TypeName<std::tuple<bool, std::string>>()), "tuple<bool,string>");
}

TEST(Codec, CorruptInputIsDataLossNeverCrash) {
  auto p = EncodeMessage(
      std::make_tuple(std::string("abc"), at::ones({4}), std::vector<int64_t>{1, 2, 3}));
  ASSERT_TRUE(p.ok());
  using T = std::tuple<std::string, at::Tensor, std::vector<int64_t>>;
  // Every truncation fails cleanly.
  for (size_t n = 0; n < p->bytes.size(); ++n) {
    Payload cut = *p;
    cut.bytes.resize(n);
    T out;
    EXPECT_EQ(DecodeMessage(cut, &out).code(), absl::StatusCode::kDataLoss) << n;
  }
  // Every single-byte corruption either decodes or fails with DATA_LOSS.
  for (size_t i = 0; i < p->bytes.size(); ++i) {
    for (int v : {0x00, 0x7f, 0x80, 0xff}) {
      Payload bad = *p;
      bad.bytes[i] = static_cast<char>(v);
      T out;
      absl::Status s = DecodeMessage(bad, &out);
      EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kDataLoss) << s;
    }
  }
  // A huge declared length does not allocate.
  Payload huge;
  huge.bytes = "\xff\xff\xff\xff\xff\xff\xff\x7f";
  std::vector<int64_t> v;
  absl::Status s = DecodeMessage(huge, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "larger than the payload")) << s;
  // Trailing bytes are rejected.
  Payload extra = *EncodeMessage(int32_t{1});
  extra.bytes += "z";
  int32_t x;
  EXPECT_EQ(DecodeMessage(extra, &x).code(), absl::StatusCode::kDataLoss);
  // Blob size mismatch.
  Payload wrong = *EncodeMessage(at::ones({4}));
  wrong.blobs[0].pieces[0] = absl::Span<const char>(wrong.blobs[0].pieces[0].data(), 8);
  at::Tensor t;
  EXPECT_EQ(DecodeMessage(wrong, &t).code(), absl::StatusCode::kDataLoss);
}

// The example of torch's RPC suites: duplicate coordinates, not coalesced.
at::Tensor SparseExample() {
  const at::Tensor indices = at::tensor(std::vector<int64_t>{0, 1, 1, 2, 0, 2}).view({2, 3});
  return at::sparse_coo_tensor(indices, at::tensor(std::vector<float>{3.2f, 4.1f, 5.3f}), {3, 3});
}

TEST(Codec, SparseCooTensorsArriveWithTheirLayoutValuesAndFlags) {
  const at::Tensor uncoalesced = SparseExample();
  at::Tensor got = RoundTrip(uncoalesced);
  ASSERT_TRUE(got.is_sparse());
  EXPECT_FALSE(got.is_coalesced());
  EXPECT_EQ(got._nnz(), 3);
  EXPECT_TRUE(got._indices().equal(uncoalesced._indices()));
  EXPECT_TRUE(got.to_dense().equal(uncoalesced.to_dense()));

  const at::Tensor coalesced = SparseExample().coalesce().requires_grad_(true);
  got = RoundTrip(coalesced);
  EXPECT_TRUE(got.is_coalesced());
  EXPECT_TRUE(got.requires_grad());
  EXPECT_TRUE(got.is_leaf());
  EXPECT_TRUE(got._values().equal(coalesced._values().detach()));

  // Hybrid: one sparse dimension over rows of a dense one.
  const at::Tensor hybrid = at::arange(12, at::kDouble).view({4, 3}).to_sparse(1);
  got = RoundTrip(hybrid);
  EXPECT_EQ(got.sparse_dim(), 1);
  EXPECT_EQ(got.dense_dim(), 1);
  EXPECT_EQ(got.scalar_type(), at::kDouble);
  EXPECT_TRUE(got.to_dense().equal(hybrid.to_dense()));

  const at::Tensor empty = at::zeros({5, 7}, at::kLong).to_sparse();
  got = RoundTrip(empty);
  EXPECT_EQ(got._nnz(), 0);
  EXPECT_EQ(got.sizes(), empty.sizes());
}

TEST(Codec, SparseIndicesOutsideTheirSizesAreDataLoss) {
  for (int64_t bad : {3, -1}) {
    const at::Tensor indices = at::tensor(std::vector<int64_t>{0, bad, 1, 2}).view({2, 2});
    // The sender does not check (it trusts its own tensors); the receiver does.
    const at::Tensor t =
        at::_sparse_coo_tensor_unsafe(indices, at::ones({2}), {3, 3}, at::TensorOptions());
    auto p = EncodeMessage(t);
    ASSERT_TRUE(p.ok()) << p.status();
    at::Tensor out;
    absl::Status s = DecodeMessage(*p, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), "outside its size 3")) << s;
  }
  // Every truncation and every single-byte corruption of a sparse tensor's
  // message decodes or fails with DATA_LOSS.
  auto p = EncodeMessage(SparseExample());
  ASSERT_TRUE(p.ok());
  for (size_t n = 0; n < p->bytes.size(); ++n) {
    Payload cut = *p;
    cut.bytes.resize(n);
    at::Tensor out;
    EXPECT_EQ(DecodeMessage(cut, &out).code(), absl::StatusCode::kDataLoss) << n;
  }
  for (size_t i = 0; i < p->bytes.size(); ++i) {
    for (int v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
      Payload bad = *p;
      bad.bytes[i] = static_cast<char>(v);
      at::Tensor out;
      absl::Status s = DecodeMessage(bad, &out);
      EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kDataLoss) << i << ": " << s;
    }
  }
}

TEST(Codec, UnsendableTensorsAreInvalidArgument) {
  auto csr = EncodeMessage(at::ones({2, 2}).to_sparse_csr());
  EXPECT_EQ(csr.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(csr.status().message(), "layout")) << csr.status();
  auto q = EncodeMessage(at::quantize_per_tensor(at::ones({2}), 0.1, 0, at::kQInt8));
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
}

// Regression (fuzz/codec_fuzzer, fuzz/dist_autograd_fuzzer): a tensor inside
// a vector, a map value or an optional was decoded into a temporary and then
// moved, so the address handed to receive hooks (CodecContext::
// received_tensors) pointed at a dead object. Distributed autograd attaches
// the recv function through it: a tensor requiring grad inside a container
// did not get it (and the hook read freed stack memory).
template <typename T>
void ExpectHookSeesDecodedTensors(const T& value, std::vector<at::Tensor*> (*in)(T&)) {
  auto p = EncodeMessage(value);
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<at::Tensor*> received;
  CodecContext cc;
  cc.received_tensors = &received;
  T out{};
  ASSERT_TRUE(DecodeMessage(*p, &out, &cc).ok());
  EXPECT_EQ(received, in(out));
  for (at::Tensor* t : received) EXPECT_TRUE(t->defined());
}

TEST(Codec, ReceivedTensorAddressesAreThoseOfTheDecodedValue) {
  std::vector<at::Tensor> many;
  for (int i = 0; i < 40; ++i) many.push_back(at::full({2}, i));
  ExpectHookSeesDecodedTensors<std::vector<at::Tensor>>(many, [](std::vector<at::Tensor>& v) {
    std::vector<at::Tensor*> out;
    for (auto& t : v) out.push_back(&t);
    return out;
  });
  using M = std::map<std::string, std::optional<at::Tensor>>;
  ExpectHookSeesDecodedTensors<M>({{"a", at::ones({1})}, {"b", at::zeros({3})}}, [](M& m) {
    return std::vector<at::Tensor*>{&*m["a"], &*m["b"]};
  });
  // A user type has no known minimum size: its vector grows while decoding,
  // and the addresses move with the elements.
  std::vector<app::Point> points(100);
  for (size_t i = 0; i < points.size(); ++i) points[i].features = at::full({1}, int64_t(i));
  ExpectHookSeesDecodedTensors<std::vector<app::Point>>(points, [](std::vector<app::Point>& v) {
    std::vector<at::Tensor*> out;
    for (auto& pt : v) out.push_back(&pt.features);
    return out;
  });
}

// The same through the registry, as a hook sees it.
TEST(Codec, ReceiveHookCanUseTensorsInsideContainers) {
  struct Hook : CallHook {
    absl::Status OnSend(const MessageInfo&, const std::vector<at::Tensor>&,
                        std::map<std::string, std::string>&) override {
      return absl::OkStatus();
    }
    absl::Status OnReceive(const MessageInfo&, const std::vector<at::Tensor*>& tensors,
                           const std::map<std::string, std::string>&) override {
      for (at::Tensor* t : tensors) *t = t->add(1);  // hooks may replace them
      return absl::OkStatus();
    }
  };
  FunctionRegistry registry;
  registry.AddCallHook(std::make_shared<Hook>());
  using T = std::tuple<std::vector<at::Tensor>, std::optional<at::Tensor>>;
  auto p = EncodeMessage(T{{at::zeros({2}), at::ones({2})}, at::full({1}, 5)});
  ASSERT_TRUE(p.ok());
  T out;
  ASSERT_TRUE(registry.DecodeReceived(*p, &out, MessageInfo{}).ok());
  EXPECT_TRUE(std::get<0>(out)[0].equal(at::ones({2})));
  EXPECT_TRUE(std::get<0>(out)[1].equal(at::full({2}, 2)));
  EXPECT_TRUE(std::get<1>(out)->equal(at::full({1}, 6)));
}

// A chain of `depth` trees, each the only child of the one before.
std::string TreeChainBytes(int depth) {
  std::string bytes(depth, '\x01');  // each tree: one child
  bytes += '\x00';                   // the last has none
  return bytes;
}

// Regression: a recursive user type decoded as deep as the bytes said, so a
// peer could exhaust the receiver's stack with a few hundred kilobytes.
TEST(Codec, NestingDepthIsBounded) {
  Payload ok;
  ok.bytes = TreeChainBytes(kMaxNesting - 1);  // kMaxNesting vectors
  app::Tree tree;
  EXPECT_TRUE(DecodeMessage(ok, &tree).ok());
  Payload deep;
  deep.bytes = TreeChainBytes(1 << 20);
  absl::Status s = DecodeMessage(deep, &tree);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "nesting depth 65 exceeds 64")) << s;
  // The sender refuses what the receiver would.
  app::Tree chain;
  for (int i = 0; i < kMaxNesting; ++i) {
    app::Tree parent;
    parent.children.push_back(std::move(chain));
    chain = std::move(parent);
  }
  auto encoded = EncodeMessage(chain);
  EXPECT_EQ(encoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(encoded.status().message(), "at most 64")) << encoded.status();
  auto nested = EncodeMessage(std::vector<std::vector<std::optional<int32_t>>>{{1, std::nullopt}});
  ASSERT_TRUE(nested.ok());
}

// CUDA tensors (docs/cuda.md): without a GPU, one that arrives is refused
// naming the device count, and an IPC descriptor needs a channel; a CUDA
// tensor cannot be encoded outside a call (no device map applies there).
TEST(Codec, CudaTensorsForMissingDevicesOrWithoutAChannelAreRefused) {
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "skipped: this machine has a GPU";
  for (uint8_t path : {0, 1}) {
    Encoder enc;
    enc.WritePod<uint8_t>(2);  // CUDA
    enc.WritePod<int8_t>(static_cast<int8_t>(at::kFloat));
    enc.WritePod<uint8_t>(0);
    enc.WriteVarint(1);
    enc.WriteVarint(1);           // one element
    enc.WriteVarint(0);           // for cuda:0
    enc.WritePod<uint8_t>(path);  // host / IPC
    enc.WriteVarint(enc.AddBlob(Blob()));
    at::Tensor t;
    const absl::Status s = DecodeMessage(*std::move(enc).Finish(), &t);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_TRUE(absl::StrContains(s.message(),
                                  "a CUDA tensor arrived for cuda:0, but this worker has 0 CUDA "
                                  "device(s)"))
        << s;
  }
  Encoder bad_path;
  bad_path.WritePod<uint8_t>(2);
  bad_path.WritePod<int8_t>(static_cast<int8_t>(at::kFloat));
  bad_path.WritePod<uint8_t>(0);
  bad_path.WriteVarint(0);
  bad_path.WriteVarint(0);
  bad_path.WritePod<uint8_t>(7);
  at::Tensor t;
  const absl::Status s = DecodeMessage(*std::move(bad_path).Finish(), &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "bad CUDA tensor path 7")) << s;
}

// A device map that puts the host's tensors on the peer's cuda:0 (torch's
// set_device_map(peer, {"cpu": 0})) and leaves CUDA tensors where they are.
class HostToGpuRouter final : public DeviceRouter {
 public:
  absl::StatusOr<int> DeviceOnPeer(int, int device, bool) const override {
    return device == kCpuDevice ? 0 : device;
  }
  CudaTensorChannel* CudaChannelFor(int) const override { return nullptr; }
};

// A CPU tensor that a device map sends to a GPU travels as a CUDA tensor
// (here, without a GPU, its arrival is refused naming cuda:0; on a GPU it
// arrives there), views included; a sparse tensor's parts stay on the host
// whatever the map says, so it arrives on the CPU; outside a call (no
// router) nothing moves.
TEST(Codec, ADeviceMapFromTheHostSendsCpuTensorsToTheMappedGpu) {
  HostToGpuRouter router;
  CodecContext cc;
  cc.devices = &router;
  cc.peer = 1;
  const at::Tensor dense = at::arange(12.0).view({3, 4});
  for (const at::Tensor& sent : {dense, dense.t()}) {  // contiguous, and a view
    auto p = EncodeMessage(sent, &cc);
    ASSERT_TRUE(p.ok()) << p.status();
    at::Tensor got;
    const absl::Status s = DecodeMessage(*p, &got);
    if (torch::cuda::device_count() == 0) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_TRUE(absl::StrContains(s.message(), "a CUDA tensor arrived for cuda:0")) << s;
    } else {
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(got.device(), at::Device(at::kCUDA, 0));
      EXPECT_TRUE(got.cpu().equal(sent));
    }
  }
  const at::Tensor sparse = SparseExample().coalesce();
  auto p = EncodeMessage(sparse, &cc);
  ASSERT_TRUE(p.ok()) << p.status();
  at::Tensor got;
  ASSERT_TRUE(DecodeMessage(*p, &got).ok());
  EXPECT_TRUE(got.is_sparse());
  EXPECT_TRUE(got.device().is_cpu());
  EXPECT_TRUE(got.to_dense().equal(sparse.to_dense()));
  EXPECT_TRUE(RoundTrip(dense).device().is_cpu());
}

TEST(Codec, DeclaredSizesAreCheckedBeforeAllocating) {
  // A tensor header that claims 2^40 floats (4 TiB) with no bytes behind it.
  Encoder enc;
  enc.WritePod<uint8_t>(1);                               // dense
  enc.WritePod<int8_t>(static_cast<int8_t>(at::kFloat));  // dtype
  enc.WritePod<uint8_t>(0);                               // requires_grad
  enc.WriteVarint(2);                                     // rank
  enc.WriteVarint(uint64_t{1} << 20);
  enc.WriteVarint(uint64_t{1} << 20);
  enc.WriteVarint(enc.AddBlob(Blob()));
  Payload huge = *std::move(enc).Finish();
  at::Tensor t;
  absl::Status s = DecodeMessage(huge, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "needs 4398046511104 bytes")) << s;
  // An empty tensor whose strides would overflow int64 in LibTorch.
  Encoder empty;
  empty.WritePod<uint8_t>(1);
  empty.WritePod<int8_t>(static_cast<int8_t>(at::kFloat));
  empty.WritePod<uint8_t>(0);
  empty.WriteVarint(3);
  for (uint64_t d : {uint64_t{0}, uint64_t{1} << 40, uint64_t{1} << 40}) empty.WriteVarint(d);
  empty.WriteVarint(empty.AddBlob(Blob()));
  s = DecodeMessage(*std::move(empty).Finish(), &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "tensor shape overflows")) << s;
  // A million strings claimed by a few bytes: each needs at least one byte.
  Payload strings;
  strings.bytes =
      "\x80\x89\x7a"
      "abc";
  std::vector<std::string> v;
  s = DecodeMessage(strings, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "larger than the payload allows")) << s;
  // A map of tensors: each entry needs a key byte and a tensor tag.
  Payload tensors;
  tensors.bytes = "\x02\x00\x00";
  std::map<std::string, at::Tensor> m;
  EXPECT_EQ(DecodeMessage(tensors, &m).code(), absl::StatusCode::kDataLoss);
}

TEST(Codec, DuplicateMapKeysAreDataLoss) {
  Encoder enc;
  enc.WriteVarint(2);
  for (int i = 0; i < 2; ++i) {
    enc.WriteString("k");
    EncodeValue(int32_t{i}, enc);
  }
  std::map<std::string, int32_t> m;
  absl::Status s = DecodeMessage(*std::move(enc).Finish(), &m);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "duplicate map key 'k'")) << s;
}

struct Inner {
  std::string name;
  std::vector<at::Tensor> values;
  BATON_CODEC_FIELDS(Inner, name, values);
};

struct Outer {
  int32_t trainer = 0;
  bool last = false;
  std::vector<Inner> parts;
  std::optional<int64_t> clock;
  BATON_CODEC_FIELDS(Outer, trainer, last, parts, clock);
};

TEST(Codec, StructsTravelAsTheirListedFields) {
  EXPECT_EQ(TypeName<Inner>(), "Inner{string,vector<Tensor>}");
  EXPECT_EQ(TypeName<Outer>(),
            "Outer{int32,bool,vector<Inner{string,vector<Tensor>}>,optional<int64>}");
  Outer in;
  in.trainer = 7;
  in.last = true;
  in.parts.push_back(Inner{"w", {at::arange(6).view({2, 3}), at::ones({2})}});
  in.parts.push_back(Inner{"b", {}});
  in.clock = 42;
  absl::StatusOr<Payload> p = EncodeMessage(in);
  ASSERT_TRUE(p.ok()) << p.status();
  Outer out;
  ASSERT_TRUE(DecodeMessage(*p, &out).ok());
  EXPECT_EQ(out.trainer, 7);
  EXPECT_TRUE(out.last);
  ASSERT_EQ(out.parts.size(), 2u);
  EXPECT_EQ(out.parts[0].name, "w");
  ASSERT_EQ(out.parts[0].values.size(), 2u);
  EXPECT_TRUE(out.parts[0].values[0].equal(at::arange(6).view({2, 3})));
  EXPECT_TRUE(out.parts[1].values.empty());
  EXPECT_EQ(out.clock, 42);
}

TEST(Codec, AStructFieldThatFailsToDecodeIsNamed) {
  Encoder enc;
  EncodeValue(int32_t{1}, enc);
  enc.WritePod<uint8_t>(9);  // not a bool
  Outer out;
  absl::Status s = DecodeMessage(*std::move(enc).Finish(), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "Outer.last: bad bool byte 9")) << s;
  // Truncated inside a nested struct.
  Encoder enc2;
  EncodeValue(int32_t{1}, enc2);
  EncodeValue(false, enc2);
  enc2.WriteVarint(1);  // one Inner, then nothing
  s = DecodeMessage(*std::move(enc2).Finish(), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "Outer.parts: ")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "Inner.name: ")) << s;
}

TEST(Codec, ProtocolBuffersTravelAsTheirBytes) {
  EXPECT_EQ(TypeName<proto::RRefControl>(), "baton.proto.RRefControl");
  proto::RRefControl in;
  in.set_kind(proto::RRefControl::USER_DELETE);
  in.set_parent(3);
  in.mutable_rref()->set_local(99);
  using Msg = std::tuple<proto::RRefControl, at::Tensor>;
  absl::StatusOr<Payload> p = EncodeMessage(Msg{in, at::ones({3})});
  ASSERT_TRUE(p.ok()) << p.status();
  Msg out;
  ASSERT_TRUE(DecodeMessage(*p, &out).ok());
  EXPECT_EQ(std::get<0>(out).kind(), proto::RRefControl::USER_DELETE);
  EXPECT_EQ(std::get<0>(out).parent(), 3);
  EXPECT_EQ(std::get<0>(out).rref().local(), 99u);
  EXPECT_TRUE(std::get<1>(out).equal(at::ones({3})));
  // Bytes that do not parse.
  Encoder enc;
  enc.WriteString("\xff\xff\xff");
  proto::RRefControl bad;
  absl::Status s = DecodeMessage(*std::move(enc).Finish(), &bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(s.message(), "bad baton.proto.RRefControl")) << s;
}

}  // namespace
}  // namespace baton::rpc
