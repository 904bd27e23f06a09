// User types of the codec fuzz target (fuzz/codec_fuzzer.cc), shared with
// the seed generator (fuzz/make_seeds.cc): a recursive type, whose nesting
// depth is up to the sender, and a type that holds a tensor, each with its
// codec built from the codecs of its members (rpc/codec.h).
#ifndef BATON_FUZZ_CODEC_TYPES_H_
#define BATON_FUZZ_CODEC_TYPES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rpc/codec.h"

namespace app {
// A recursive user type: how deep it nests is up to the sender.
struct Tree {
  int32_t value = 0;
  std::vector<Tree> children;
};
// A user type that holds a tensor.
struct Point {
  double x = 0;
  std::string label;
  at::Tensor features;
};
}  // namespace app

namespace baton::rpc {
template <>
struct Codec<app::Tree> {
  static std::string Name() { return "Tree"; }
  static void Encode(const app::Tree& t, Encoder& enc) {
    EncodeValue(t.value, enc);
    EncodeValue(t.children, enc);
  }
  static absl::Status Decode(Decoder& dec, app::Tree* t) {
    absl::Status s = DecodeValue(dec, &t->value);
    if (!s.ok()) return s;
    return DecodeValue(dec, &t->children);
  }
};

template <>
struct Codec<app::Point> {
  static std::string Name() { return "Point"; }
  static void Encode(const app::Point& p, Encoder& enc) {
    EncodeValue(p.x, enc);
    EncodeValue(p.label, enc);
    EncodeValue(p.features, enc);
  }
  static absl::Status Decode(Decoder& dec, app::Point* p) {
    for (absl::Status s :
         {DecodeValue(dec, &p->x), DecodeValue(dec, &p->label), DecodeValue(dec, &p->features)}) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
};
}  // namespace baton::rpc

namespace baton::fuzz {
// The message types codec_fuzzer decodes, by the input's first byte.
enum CodecCase : uint8_t {
  kTensor = 0,          // at::Tensor
  kTensorVector,        // vector<Tensor>
  kPropagateArgs,       // tuple<int64, int64, vector<Tensor>> (dist_autograd)
  kOptionalTensorMap,   // map<string, optional<Tensor>>
  kNestedUnorderedMap,  // unordered_map<string, vector<pair<string, Tensor>>>
  kIntCube,             // vector<vector<vector<int32>>>
  kBoolVector,          // vector<bool>
  kOptionalStrings,     // optional<vector<string>>
  kScalars,             // tuple<bool, uint8, int16, uint32, float, double, string>
  kTree,                // app::Tree
  kPoints,              // vector<app::Point>
  kMixed,               // pair<map<string, Tree>, vector<optional<Point>>>
  kNumCodecCases,
};
}  // namespace baton::fuzz

#endif  // BATON_FUZZ_CODEC_TYPES_H_
