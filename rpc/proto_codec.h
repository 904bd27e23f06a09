// Codec<T> for protocol buffer messages: a message travels as its serialized
// bytes, so a protocol layer can describe an evolving record (counters,
// options) in proto/ and still pass it as an ordinary function argument or
// result, next to tensors.
//
// Contract:
// - Name() is the message's full proto name ("baton.proto.ShardStats"), so
//   calls whose message types differ are refused as a signature mismatch,
//   while fields added to the same message are read by older peers as
//   unknown fields, as protobuf promises.
// - Bytes that do not parse decode to DATA_LOSS naming the message.
//
// Thread-safety: stateless.
#ifndef BATON_RPC_PROTO_CODEC_H_
#define BATON_RPC_PROTO_CODEC_H_

#include <string>
#include <type_traits>

#include <google/protobuf/message_lite.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rpc/codec.h"

namespace baton::rpc {

template <typename T>
struct Codec<T, std::enable_if_t<std::is_base_of_v<google::protobuf::MessageLite, T>>> {
  static std::string Name() { return T().GetTypeName(); }
  static void Encode(const T& v, Encoder& enc) { enc.WriteString(v.SerializeAsString()); }
  static absl::Status Decode(Decoder& dec, T* out) {
    std::string bytes;
    RETURN_IF_ERROR(dec.ReadString(&bytes, Name()));
    if (!out->ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat("bad ", Name(), " (", bytes.size(), " bytes)"));
    }
    return absl::OkStatus();
  }
};

}  // namespace baton::rpc

#endif  // BATON_RPC_PROTO_CODEC_H_
