// Calls from Python to functions registered in C++ (rpc/function.h), by
// name and signature: Python values are encoded by the codec rules of the
// signature's types (rpc/codec.h) and the typed result is decoded back into
// Python values, so a C++ worker serves Python callers unchanged.
//
// Types (the names Codec<T>::Name() spells): Tensor, bool, int8..int64,
// uint8..uint64, float, double, string, void, vector<T>, map<string,T>,
// unordered_map<string,T>, optional<T>, pair<A,B>, tuple<...>.
// Python values: tensors; bool; int; float; str; list or tuple for vector,
// pair and tuple; dict with str keys for maps; None for an empty optional.
// A result comes back as the same kinds (vector -> list, pair/tuple ->
// tuple, map -> dict, void -> None).
//
// Contract: INVALID_ARGUMENT naming the argument (and the path inside it)
// for a signature that does not parse, a type baton cannot call from
// Python (RRef<...>, user types), or a Python value that does not fit its
// type (an int out of range included); DATA_LOSS for a reply that does not
// decode as the result type.
//
// Thread-safety: Signature is immutable once parsed; Encode needs the GIL,
// Decode does not, ToPython does.
#ifndef BATON_PYTHON_SRC_CPP_CALL_H_
#define BATON_PYTHON_SRC_CPP_CALL_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "absl/status/statusor.h"
#include "rpc/agent.h"

namespace baton::python {

struct TypeNode {
  std::string name;  // "Tensor", "vector", ...
  std::vector<TypeNode> args;
  std::string Spell() const;  // back to the Codec name
};

struct Signature {
  std::vector<TypeNode> args;
  TypeNode result;
  std::string text;  // canonical: what Function<R(Args...)>::signature() gives
  static absl::StatusOr<Signature> Parse(const std::string& text);
};

// A decoded value before it becomes Python (tensors live in a deque so that
// call hooks may replace them in place).
struct DynValue {
  enum class Kind { kNone, kBool, kInt, kUInt, kFloat, kString, kTensor, kList, kTuple, kDict };
  Kind kind = Kind::kNone;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;  // string, or the tensor's index in the deque
  size_t tensor = 0;
  std::vector<DynValue> items;
  std::vector<std::string> keys;  // kDict
};

// Encodes the call's arguments (a Python sequence) for `peer`, running the
// registry's send hooks (distributed autograd). REQUIRES: the GIL.
absl::StatusOr<rpc::Payload> EncodeCall(rpc::Runtime& agent, int peer, const std::string& function,
                                        const Signature& sig, pybind11::handle args);

// Decodes a reply from `peer` as the result type, running the receive hooks.
absl::Status DecodeResult(rpc::Runtime& agent, int peer, const std::string& function,
                          const Signature& sig, const rpc::Payload& reply, DynValue* out,
                          std::deque<at::Tensor>* tensors);

// REQUIRES: the GIL.
pybind11::object ToPython(const DynValue& v, const std::deque<at::Tensor>& tensors);

}  // namespace baton::python

#endif  // BATON_PYTHON_SRC_CPP_CALL_H_
