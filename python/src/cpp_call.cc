#include "python/src/cpp_call.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace baton::python {
namespace {

namespace py = pybind11;

const char* const kScalars[] = {"Tensor", "bool",   "int8",   "int16", "int32",  "int64",  "uint8",
                                "uint16", "uint32", "uint64", "float", "double", "string", "void"};

bool IsScalar(const std::string& n) {
  return std::find(std::begin(kScalars), std::end(kScalars), n) != std::end(kScalars);
}

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  absl::StatusOr<TypeNode> Type() {
    TypeNode node;
    while (pos_ < s_.size() &&
           (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) {
      node.name.push_back(s_[pos_++]);
    }
    if (node.name.empty()) return Error("a type name");
    if (pos_ < s_.size() && s_[pos_] == '<') {
      ++pos_;
      for (;;) {
        ASSIGN_OR_RETURN(auto arg, Type());
        node.args.push_back(std::move(arg));
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '>') {
          ++pos_;
          break;
        }
        return Error("',' or '>'");
      }
    }
    RETURN_IF_ERROR(Check(node));
    return node;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool AtEnd() const { return pos_ == s_.size(); }
  absl::Status Error(const std::string& wanted) const {
    return absl::InvalidArgumentError(
        absl::StrCat("signature '", s_, "': expected ", wanted, " at position ", pos_));
  }

 private:
  absl::Status Check(const TypeNode& n) const {
    auto want = [&](size_t k) -> absl::Status {
      if (n.args.size() == k) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat("signature '", s_, "': ", n.name, " takes ", k, " type argument(s)"));
    };
    if (IsScalar(n.name)) return want(0);
    if (n.name == "vector" || n.name == "optional") return want(1);
    if (n.name == "pair") return want(2);
    if (n.name == "tuple") return absl::OkStatus();
    if (n.name == "map" || n.name == "unordered_map") {
      absl::Status s = want(2);
      if (s.ok() && n.args[0].name != "string") {
        s = absl::InvalidArgumentError(absl::StrCat("signature '", s_, "': map keys are strings"));
      }
      return s;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "signature '", s_, "': type '", n.name,
        "' cannot be called from Python (RRefs and user types are sent by C++ callers)"));
  }
  const std::string& s_;
  size_t pos_ = 0;
};

size_t MinBytes(const TypeNode& n) {
  if (n.name == "bool" || n.name == "int8" || n.name == "uint8") return 1;
  if (n.name == "int16" || n.name == "uint16") return 2;
  if (n.name == "int32" || n.name == "uint32" || n.name == "float") return 4;
  if (n.name == "int64" || n.name == "uint64" || n.name == "double") return 8;
  if (n.name == "void") return 0;
  if (n.name == "pair" || n.name == "tuple") {
    size_t total = 0;
    for (const TypeNode& a : n.args) total += MinBytes(a);
    return total;
  }
  return 1;  // Tensor tag, string length, container length, optional flag
}

std::string Path(const std::string& path, const std::string& step) {
  return path.empty() ? step : absl::StrCat(path, step);
}

template <typename I>
bool FitInt(py::handle h, I* out) {
  if (!py::isinstance<py::int_>(h) || py::isinstance<py::bool_>(h)) return false;
  if constexpr (std::is_signed_v<I>) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
    if (overflow != 0 || v < std::numeric_limits<I>::min() || v > std::numeric_limits<I>::max()) {
      return false;
    }
    *out = static_cast<I>(v);
  } else {
    if (PyObject_RichCompareBool(h.ptr(), py::int_(0).ptr(), Py_LT) == 1) return false;
    const unsigned long long v = PyLong_AsUnsignedLongLong(h.ptr());
    if (PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      return false;
    }
    if (v > std::numeric_limits<I>::max()) return false;
    *out = static_cast<I>(v);
  }
  return true;
}

absl::Status Mismatch(const TypeNode& t, py::handle h, const std::string& path) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": a ", std::string(py::str(py::type::handle_of(h).attr("__name__"))),
                   " (", std::string(py::repr(h)).substr(0, 60), ") is not a ", t.Spell()));
}

absl::Status Encode(const TypeNode& t, py::handle h, rpc::Encoder& enc, const std::string& path) {
  const std::string& n = t.name;
  if (n == "Tensor") {
    if (!THPVariable_Check(h.ptr())) return Mismatch(t, h, path);
    rpc::EncodeTensor(h.cast<at::Tensor>(), enc);
    return absl::OkStatus();
  }
  if (n == "bool") {
    if (!py::isinstance<py::bool_>(h)) return Mismatch(t, h, path);
    enc.WritePod<uint8_t>(h.cast<bool>() ? 1 : 0);
    return absl::OkStatus();
  }
#define BATON_INT(NAME, TYPE)                              \
  if (n == NAME) {                                         \
    TYPE v{};                                              \
    if (!FitInt<TYPE>(h, &v)) return Mismatch(t, h, path); \
    enc.WritePod<TYPE>(v);                                 \
    return absl::OkStatus();                               \
  }
  BATON_INT("int8", int8_t)
  BATON_INT("int16", int16_t)
  BATON_INT("int32", int32_t)
  BATON_INT("int64", int64_t)
  BATON_INT("uint8", uint8_t)
  BATON_INT("uint16", uint16_t)
  BATON_INT("uint32", uint32_t)
  BATON_INT("uint64", uint64_t)
#undef BATON_INT
  if (n == "float" || n == "double") {
    if (!(py::isinstance<py::float_>(h) || py::isinstance<py::int_>(h)) ||
        py::isinstance<py::bool_>(h)) {
      return Mismatch(t, h, path);
    }
    const double v = h.cast<double>();
    if (n == "float") {
      enc.WritePod<float>(static_cast<float>(v));
    } else {
      enc.WritePod<double>(v);
    }
    return absl::OkStatus();
  }
  if (n == "string") {
    if (py::isinstance<py::str>(h) || py::isinstance<py::bytes>(h)) {
      enc.WriteString(h.cast<std::string>());
      return absl::OkStatus();
    }
    return Mismatch(t, h, path);
  }
  if (n == "void") {
    if (!h.is_none()) return Mismatch(t, h, path);
    return absl::OkStatus();
  }
  auto sequence = [&](size_t expected) -> absl::StatusOr<py::sequence> {
    if (py::isinstance<py::str>(h) || py::isinstance<py::bytes>(h) ||
        !(py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h))) {
      return Mismatch(t, h, path);
    }
    py::sequence seq = py::reinterpret_borrow<py::sequence>(h);
    if (expected != SIZE_MAX && seq.size() != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", t.Spell(), " needs ", expected, " elements, got ", seq.size()));
    }
    return seq;
  };
  if (n == "vector") {
    ASSIGN_OR_RETURN(auto seq, sequence(SIZE_MAX));
    rpc::Encoder::Nested nested(enc, "vector");
    if (!nested.ok()) return absl::OkStatus();  // the encoder failed already
    enc.WriteVarint(seq.size());
    for (size_t i = 0; i < seq.size(); ++i) {
      absl::Status s = Encode(t.args[0], (seq)[i], enc, Path(path, absl::StrCat("[", i, "]")));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (n == "pair" || n == "tuple") {
    ASSIGN_OR_RETURN(auto seq, sequence(t.args.size()));
    for (size_t i = 0; i < t.args.size(); ++i) {
      absl::Status s = Encode(t.args[i], (seq)[i], enc, Path(path, absl::StrCat("[", i, "]")));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (n == "optional") {
    rpc::Encoder::Nested nested(enc, "optional");
    if (!nested.ok()) return absl::OkStatus();
    enc.WritePod<uint8_t>(h.is_none() ? 0 : 1);
    return h.is_none() ? absl::OkStatus() : Encode(t.args[0], h, enc, path);
  }
  if (n == "map" || n == "unordered_map") {
    if (!py::isinstance<py::dict>(h)) return Mismatch(t, h, path);
    py::dict d = py::reinterpret_borrow<py::dict>(h);
    std::vector<std::pair<std::string, py::handle>> items;
    for (auto item : d) {
      if (!py::isinstance<py::str>(item.first)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": map keys must be str, not ", std::string(py::repr(item.first))));
      }
      items.emplace_back(item.first.cast<std::string>(), item.second);
    }
    std::sort(items.begin(), items.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    rpc::Encoder::Nested nested(enc, "map");
    if (!nested.ok()) return absl::OkStatus();
    enc.WriteVarint(items.size());
    for (const auto& [k, v] : items) {
      enc.WriteString(k);
      RETURN_IF_ERROR(Encode(t.args[1], v, enc, Path(path, absl::StrCat("['", k, "']"))));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported type ", t.Spell()));
}

absl::Status Decode(const TypeNode& t, rpc::Decoder& dec, DynValue* out,
                    std::deque<at::Tensor>* tensors) {
  using Kind = DynValue::Kind;
  const std::string& n = t.name;
  if (n == "Tensor") {
    tensors->emplace_back();
    out->kind = Kind::kTensor;
    out->tensor = tensors->size() - 1;
    return rpc::DecodeTensor(dec, &tensors->back());
  }
  if (n == "bool") {
    bool b = false;
    absl::Status s = rpc::Codec<bool>::Decode(dec, &b);
    out->kind = Kind::kBool;
    out->i = b;
    return s;
  }
#define BATON_INT(NAME, TYPE, KIND, FIELD)  \
  if (n == NAME) {                          \
    TYPE v{};                               \
    absl::Status s = dec.ReadPod(&v, NAME); \
    out->kind = KIND;                       \
    out->FIELD = v;                         \
    return s;                               \
  }
  BATON_INT("int8", int8_t, Kind::kInt, i)
  BATON_INT("int16", int16_t, Kind::kInt, i)
  BATON_INT("int32", int32_t, Kind::kInt, i)
  BATON_INT("int64", int64_t, Kind::kInt, i)
  BATON_INT("uint8", uint8_t, Kind::kUInt, u)
  BATON_INT("uint16", uint16_t, Kind::kUInt, u)
  BATON_INT("uint32", uint32_t, Kind::kUInt, u)
  BATON_INT("uint64", uint64_t, Kind::kUInt, u)
  BATON_INT("float", float, Kind::kFloat, f)
  BATON_INT("double", double, Kind::kFloat, f)
#undef BATON_INT
  if (n == "string") {
    out->kind = Kind::kString;
    return dec.ReadString(&out->s, "string");
  }
  if (n == "void") {
    out->kind = Kind::kNone;
    return absl::OkStatus();
  }
  if (n == "vector") {
    rpc::Decoder::Nested nested(dec, "vector");
    if (!nested.status().ok()) return nested.status();
    uint64_t count = 0;
    absl::Status s = dec.ReadLength(&count, MinBytes(t.args[0]), "vector length");
    if (!s.ok()) return s;
    out->kind = Kind::kList;
    out->items.resize(count);
    for (auto& item : out->items) {
      s = Decode(t.args[0], dec, &item, tensors);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (n == "pair" || n == "tuple") {
    out->kind = Kind::kTuple;
    out->items.resize(t.args.size());
    for (size_t i = 0; i < t.args.size(); ++i) {
      RETURN_IF_ERROR(Decode(t.args[i], dec, &out->items[i], tensors));
    }
    return absl::OkStatus();
  }
  if (n == "optional") {
    rpc::Decoder::Nested nested(dec, "optional");
    if (!nested.status().ok()) return nested.status();
    bool has = false;
    absl::Status s = rpc::Codec<bool>::Decode(dec, &has);
    if (!s.ok() || !has) {
      out->kind = Kind::kNone;
      return s;
    }
    return Decode(t.args[0], dec, out, tensors);
  }
  if (n == "map" || n == "unordered_map") {
    rpc::Decoder::Nested nested(dec, "map");
    if (!nested.status().ok()) return nested.status();
    uint64_t count = 0;
    absl::Status s = dec.ReadLength(&count, 1 + MinBytes(t.args[1]), "map size");
    if (!s.ok()) return s;
    out->kind = Kind::kDict;
    out->items.resize(count);
    out->keys.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      s = dec.ReadString(&out->keys[i], "map key");
      if (s.ok()) s = Decode(t.args[1], dec, &out->items[i], tensors);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat("cannot decode type ", t.Spell()));
}

}  // namespace

std::string TypeNode::Spell() const {
  if (args.empty()) return name == "tuple" ? "tuple<>" : name;
  std::vector<std::string> parts;
  for (const TypeNode& a : args) parts.push_back(a.Spell());
  return absl::StrCat(name, "<", absl::StrJoin(parts, ","), ">");
}

absl::StatusOr<Signature> Signature::Parse(const std::string& text) {
  std::string compact;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) compact.push_back(c);
  }
  Parser p(compact);
  Signature sig;
  if (!p.Eat('(')) return p.Error("'('");
  if (!p.Eat(')')) {
    for (;;) {
      ASSIGN_OR_RETURN(auto t, p.Type());
      if (t.name == "void") return p.Error("an argument type other than void");
      sig.args.push_back(std::move(t));
      if (p.Eat(',')) continue;
      if (p.Eat(')')) break;
      return p.Error("',' or ')'");
    }
  }
  if (!p.Eat('-') || !p.Eat('>')) return p.Error("'->'");
  ASSIGN_OR_RETURN(auto r, p.Type());
  sig.result = std::move(r);
  if (!p.AtEnd()) return p.Error("the end");
  std::vector<std::string> parts;
  for (const TypeNode& a : sig.args) parts.push_back(a.Spell());
  sig.text = absl::StrCat("(", absl::StrJoin(parts, ","), ")->", sig.result.Spell());
  return sig;
}

absl::StatusOr<rpc::Payload> EncodeCall(rpc::Runtime& agent, int peer, const std::string& function,
                                        const Signature& sig, py::handle args) {
  py::sequence seq = py::reinterpret_borrow<py::sequence>(args);
  if (seq.size() != sig.args.size()) {
    return absl::InvalidArgumentError(absl::StrCat(function, sig.text, " takes ", sig.args.size(),
                                                   " argument(s), got ", seq.size()));
  }
  std::vector<at::Tensor> sent;
  const bool hooks = agent.registry().has_call_hooks();
  const rpc::CodecContext cc{&agent, peer, hooks ? &sent : nullptr, nullptr};
  rpc::Encoder enc(&cc);
  for (size_t i = 0; i < sig.args.size(); ++i) {
    absl::Status s = Encode(sig.args[i], seq[i], enc, absl::StrCat("argument ", i));
    if (!s.ok()) {
      enc.Fail(absl::InvalidArgumentError(
          absl::StrCat("call of ", function, sig.text, ": ", s.message())));
      break;
    }
  }
  absl::StatusOr<rpc::Payload> payload = std::move(enc).Finish();
  if (!payload.ok() || !hooks) return payload;
  RETURN_IF_ERROR(agent.registry().RunSendHooks(
      rpc::MessageInfo{&agent, /*is_request=*/true, peer, function}, sent, payload->extensions));
  return payload;
}

absl::Status DecodeResult(rpc::Runtime& agent, int peer, const std::string& function,
                          const Signature& sig, const rpc::Payload& reply, DynValue* out,
                          std::deque<at::Tensor>* tensors) {
  rpc::Decoder dec(reply);
  absl::Status s = Decode(sig.result, dec, out, tensors);
  if (s.ok()) s = dec.ExpectEnd();
  if (!s.ok()) {
    return absl::DataLossError(
        absl::StrCat("result of ", function, sig.text, " does not decode: ", s.message()));
  }
  if (!agent.registry().has_call_hooks()) return absl::OkStatus();
  std::vector<at::Tensor*> received;
  for (at::Tensor& t : *tensors) received.push_back(&t);
  return agent.registry().RunReceiveHooks(
      rpc::MessageInfo{&agent, /*is_request=*/false, peer, function}, received, reply.extensions);
}

py::object ToPython(const DynValue& v, const std::deque<at::Tensor>& tensors) {
  using Kind = DynValue::Kind;
  switch (v.kind) {
    case Kind::kNone: return py::none();
    case Kind::kBool: return py::bool_(v.i != 0);
    case Kind::kInt: return py::int_(v.i);
    case Kind::kUInt: return py::int_(v.u);
    case Kind::kFloat: return py::float_(v.f);
    case Kind::kString: return py::str(v.s);
    case Kind::kTensor: return py::cast(tensors[v.tensor]);
    case Kind::kList: {
      py::list l;
      for (const DynValue& e : v.items) l.append(ToPython(e, tensors));
      return py::object(std::move(l));
    }
    case Kind::kTuple: {
      py::tuple t(v.items.size());
      for (size_t i = 0; i < v.items.size(); ++i) t[i] = ToPython(v.items[i], tensors);
      return py::object(std::move(t));
    }
    case Kind::kDict: {
      py::dict d;
      for (size_t i = 0; i < v.items.size(); ++i)
        d[py::str(v.keys[i])] = ToPython(v.items[i], tensors);
      return py::object(std::move(d));
    }
  }
  return py::none();
}

}  // namespace baton::python
