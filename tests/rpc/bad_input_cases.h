// The bad-input test's attack cases (tests/rpc/bad_input_test.cc): each builds,
// for stream i of a case, the packets to send and what the server must
// answer. Test-only; see the test's header comment for the list.
//
// Thread-safety: call from the attacker's thread only (one shared RNG).
#ifndef BATON_TESTS_BAD_INPUT_CASES_H_
#define BATON_TESTS_BAD_INPUT_CASES_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/rpc.pb.h"
#include "tests/rpc/bad_input_stream.h"

namespace baton::rpc::bad_input {

// Every worker's AgentOptions::transport.max_message_bytes. GrpcTransport lets gRPC
// receive up to this + 1 MiB (rpc/transport/grpc/grpc_transport.cc).
constexpr int64_t kMaxMessageBytes = int64_t{8} << 20;
constexpr int64_t kServerReceiveLimit = kMaxMessageBytes + (1 << 20);

inline std::mt19937_64& Rng() {
  static std::mt19937_64 rng(20240611);
  return rng;
}

inline std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = Rng()();
    std::memcpy(s.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return s;
}

inline Attack ControlCase(int i) {
  Attack a{"valid echo (positive control)", {}, {}};
  a.spec.packets = {ValidEchoFrame(1000 + i)};
  a.spec.expected_replies = 1;
  a.expect.kind = Expect::kEchoOk;
  return a;
}

// 1. Random bytes, several sizes; every other run of ten starts with a
// length prefix that fits the packet, so the header parser sees garbage.
inline Attack RandomCase(int i) {
  static const size_t kSizes[] = {1, 3, 4, 7, 64, 1000, 4096, 65536, 1 << 20, 4 << 20};
  const size_t n = kSizes[i % 10];
  const bool plausible = (i / 10) % 2 == 1 && n > 8;
  std::string bytes = RandomBytes(n);
  if (plausible) {
    const uint32_t len = static_cast<uint32_t>(Rng()() % (n - 4));
    std::memcpy(bytes.data(), &len, 4);
  }
  Attack a{
      absl::StrCat("random ", n, " bytes", plausible ? ", length prefix within the packet" : ""),
      {},
      {}};
  a.spec.packets = {std::move(bytes)};
  a.expect.kind = Expect::kClosedByServer;
  a.expect.allow_error_replies = true;
  return a;
}

// 2. A valid frame on a stream with a wrong token, no token, on a method
// the server does not serve, or with the right token and no worker identity,
// another worker's identity (w1's, with a forged proof) or a malformed one.
inline Attack TokenCase(int i) {
  Attack a;
  a.spec.packets = {ValidEchoFrame(i)};
  a.expect.kind = Expect::kStatus;
  switch (i % 8) {
    case 5:
      a.variant = "no worker identity";
      a.spec.identity = "";
      a.expect.code = absl::StatusCode::kPermissionDenied;
      a.expect.needles = {"worker 'w0' refuses a stream without a worker identity",
                          "x-baton-identity"};
      break;
    case 6:
      a.variant = "another worker's identity, forged";
      a.spec.identity = absl::StrCat("1/1/", std::string(64, "0123456789abcdef"[i % 16]));
      a.expect.code = absl::StatusCode::kPermissionDenied;
      a.expect.needles = {"refuses a stream claiming to come from worker id 1 (incarnation 1)",
                          "proof does not match"};
      break;
    case 7:
      a.variant = "malformed worker identity";
      a.spec.identity = absl::StrCat(kAttackerId, "/1/not-hex-", i);
      a.expect.code = absl::StatusCode::kPermissionDenied;
      a.expect.needles = {"malformed worker identity", "<rank>/<incarnation>/<64 hex digits>"};
      break;
    case 0:
    case 1:
      a.variant = "wrong token";
      a.spec.token = absl::StrCat("not-the-token-", i);
      a.expect.code = absl::StatusCode::kUnauthenticated;
      a.expect.needles = {"wrong job token"};
      break;
    case 2:
    case 3:
      a.variant = "no token";
      a.spec.token = std::nullopt;
      a.expect.code = absl::StatusCode::kUnauthenticated;
      a.expect.needles = {"without a job token", "x-baton-token"};
      break;
    default:
      a.variant = "right token, other method";
      a.spec.method = "/baton.Rpc/Other";
      a.expect.code = absl::StatusCode::kUnimplemented;
      a.expect.needles = {"baton serves only /baton.Rpc/Stream"};
      break;
  }
  return a;
}

// 3. Valid frames calling an unknown function (1-3 per packet), claiming
// another caller id than the stream proved, or with the wrong signature.
inline Attack UnknownFunctionCase(int i) {
  Attack a;
  a.expect.kind = Expect::kErrorReplies;
  const std::string args = TensorArg(at::kFloat, {4}, 0);
  const std::string blob = FloatBytes({1, 2, 3, 4});
  switch (i % 4) {
    case 0:
    case 1: {
      const int k = 1 + (i / 4) % 3;
      a.variant = absl::StrCat("unknown function, ", k, " frame(s) in one packet");
      std::string packet;
      for (int j = 0; j < k; ++j) {
        const uint64_t id = static_cast<uint64_t>(i) * 10 + j;
        const std::string name = absl::StrCat("no_such_function_", i, "_", j);
        packet += WellFormedFrame(Request(id, name, EchoSignature()), args, {blob});
        a.expect.needles_by_id[id] = {absl::StrCat("unknown function '", name, "'")};
      }
      a.spec.packets = {std::move(packet)};
      a.expect.code = absl::StatusCode::kNotFound;
      a.expect.needles = {"not registered on worker 'w0'"};
      a.expect.replies = k;
      break;
    }
    case 2: {
      // W2: the stream is bound to the attacker's proven id before any
      // frame is read; a request claiming another worker's (or no
      // worker's) id ends it.
      const int claimed = (i / 4) % 2 == 0 ? 1 : 99;
      a.variant = claimed == 1 ? "a request claiming w1's caller id" : "unknown caller id";
      proto::FrameHeader h = Request(i, "echo", EchoSignature());
      h.set_caller_id(claimed);
      a.spec.packets = {WellFormedFrame(h, args, {blob})};
      a.expect.kind = Expect::kStatus;
      a.expect.code = absl::StatusCode::kPermissionDenied;
      a.expect.needles = {absl::StrCat("a request claims caller id ", claimed,
                                       " on a stream bound to caller id ", kAttackerId)};
      break;
    }
    default: {
      a.variant = "wrong signature";
      a.spec.packets = {WellFormedFrame(Request(i, "echo", "(int64)->int64"), args, {blob})};
      a.expect.code = absl::StatusCode::kInvalidArgument;
      a.expect.needles_by_id[i] = {"argument type mismatch", "(int64)->int64", EchoSignature()};
      a.expect.replies = 1;
      break;
    }
  }
  a.spec.expected_replies = a.expect.replies;
  return a;
}

// 4. A tensor whose header claims 1 TiB: 2^38 floats.
inline Attack TerabyteTensorCase(int i) {
  constexpr uint64_t kTebiFloats = uint64_t{1} << 38;
  Attack a;
  const std::string blob = FloatBytes({1, 2, 3, 4});
  switch (i % 4) {
    case 0:
      a.variant = "1 TiB tensor, 16-byte blob";
      a.spec.packets = {WellFormedFrame(Request(i, "echo", EchoSignature()),
                                        TensorArg(at::kFloat, {kTebiFloats}, 0), {blob})};
      a.expect.kind = Expect::kErrorReplies;
      a.expect.code = absl::StatusCode::kDataLoss;
      a.expect.needles_by_id[i] = {"undecodable arguments",
                                   "needs 1099511627776 bytes but its blob has 16"};
      a.expect.replies = 1;
      break;
    case 1: {
      a.variant = "1 TiB tensor, header declares a 1 TiB blob";
      const std::string payload = TensorArg(at::kFloat, {kTebiFloats}, 0);
      proto::FrameHeader h = Request(i, "echo", EchoSignature());
      h.set_payload_size(payload.size());
      h.add_blob_sizes(uint64_t{1} << 40);
      a.spec.packets = {RawFrame(h, payload + blob)};
      a.expect.kind = Expect::kClosedByServer;
      break;
    }
    case 2:
      a.variant = "tensor shape 2^20 x 2^20 x 2^20";
      a.spec.packets = {WellFormedFrame(Request(i, "echo", EchoSignature()),
                                        TensorArg(at::kFloat, {1 << 20, 1 << 20, 1 << 20}, 0),
                                        {blob})};
      a.expect.kind = Expect::kErrorReplies;
      a.expect.code = absl::StatusCode::kDataLoss;
      a.expect.needles_by_id[i] = {"undecodable arguments", "tensor shape overflows"};
      a.expect.replies = 1;
      break;
    default:
      a.variant = "1 TiB tensor, no blob at all";
      a.spec.packets = {WellFormedFrame(Request(i, "echo", EchoSignature()),
                                        TensorArg(at::kFloat, {kTebiFloats}, 0), {})};
      a.expect.kind = Expect::kErrorReplies;
      a.expect.code = absl::StatusCode::kDataLoss;
      a.expect.needles_by_id[i] = {"undecodable arguments", "refers to blob 0"};
      a.expect.replies = 1;
      break;
  }
  a.spec.expected_replies = a.expect.replies;
  return a;
}

// 5. Truncated frames.
inline Attack TruncatedCase(int i) {
  Attack a;
  a.expect.kind = Expect::kClosedByServer;
  const std::string args = TensorArg(at::kFloat, {4}, 0);
  const std::string blob = FloatBytes({1, 2, 3, 4});
  switch (i % 7) {
    case 0: {
      a.variant = "payload_size 1000, 10 bytes follow";
      proto::FrameHeader h = Request(i, "echo", EchoSignature());
      h.set_payload_size(1000);
      a.spec.packets = {RawFrame(h, RandomBytes(10))};
      break;
    }
    case 1: {
      a.variant = "header cut in half";
      const std::string full = ValidEchoFrame(i);
      uint32_t header_len = 0;
      std::memcpy(&header_len, full.data(), 4);
      a.spec.packets = {full.substr(0, 4 + header_len / 2)};
      break;
    }
    case 2:
      a.variant = "2 bytes of a length";
      a.spec.packets = {std::string("\x10\x00", 2)};
      break;
    case 3: {
      // Cut inside the tensor's blob index: the payload still has room to
      // name its one blob (5 bytes), so the framing stays consistent.
      a.variant = "codec bytes cut (framing consistent)";
      a.spec.packets = {WellFormedFrame(Request(i, "echo", EchoSignature()),
                                        args.substr(0, args.size() - 1), {blob})};
      a.expect.kind = Expect::kErrorReplies;
      a.expect.code = absl::StatusCode::kDataLoss;
      a.expect.needles_by_id[i] = {"undecodable arguments", "truncated payload reading"};
      a.expect.replies = 1;
      break;
    }
    case 4: {
      a.variant = "blob declares 256 bytes, 100 follow";
      proto::FrameHeader h = Request(i, "echo", EchoSignature());
      h.set_payload_size(args.size());
      h.add_blob_sizes(256);
      a.spec.packets = {RawFrame(h, args + RandomBytes(100))};
      break;
    }
    case 5: {
      a.variant = "valid frame, then a truncated one, in one packet";
      proto::FrameHeader h = Request(i * 10 + 1, "echo", EchoSignature());
      h.set_payload_size(1000);
      a.spec.packets = {ValidEchoFrame(i * 10) + RawFrame(h, "short")};
      break;
    }
    default: {
      a.variant = "one frame split over two packets";
      const std::string full = ValidEchoFrame(i);
      a.spec.packets = {full.substr(0, full.size() / 2), full.substr(full.size() / 2)};
      break;
    }
  }
  a.spec.expected_replies = a.expect.replies;
  return a;
}

// 6. Oversized headers.
inline Attack OversizedCase(int i) {
  Attack a;
  a.expect.kind = Expect::kClosedByServer;
  switch (i % 5) {
    case 0:
      a.variant = "header length 0xFFFFFFFF, 64 bytes follow";
      a.spec.packets = {Le32(0xFFFFFFFFu) + RandomBytes(64)};
      break;
    case 1:
      a.variant = "header length 2^31, a valid frame's bytes follow";
      a.spec.packets = {Le32(0x80000000u) + ValidEchoFrame(i).substr(4)};
      break;
    case 2: {
      // gRPC itself refuses a message over the server's receive limit.
      a.variant = "packet just over the server's receive limit (9 MiB)";
      const std::string payload(kServerReceiveLimit, 'p');
      proto::FrameHeader h = Request(i, "echo", EchoSignature());
      a.spec.packets = {WellFormedFrame(h, payload, {})};
      a.expect.kind = Expect::kStatus;
      a.expect.code = absl::StatusCode::kResourceExhausted;
      a.expect.needles = {"larger than max"};
      break;
    }
    case 3: {
      a.variant = "6 MiB header (function name), within the limit";
      const std::string name(6 << 20, 'f');
      a.spec.packets = {WellFormedFrame(Request(i, name, EchoSignature()), "", {})};
      a.expect.kind = Expect::kErrorReplies;
      a.expect.code = absl::StatusCode::kNotFound;
      a.expect.needles_by_id[i] = {"unknown function 'fff"};
      a.expect.replies = 1;
      break;
    }
    default: {
      // The request fits the limit; the error reply that names the function
      // would not. Today gRPC refuses to send that reply and ends the stream
      // with RESOURCE_EXHAUSTED; an error reply that does not repeat the
      // whole name would do as well.
      a.variant = "header just under the receive limit (reply would exceed it)";
      const std::string name(kServerReceiveLimit - 64, 'g');
      a.spec.packets = {WellFormedFrame(Request(i, name, EchoSignature()), "", {})};
      a.expect.kind = Expect::kErrorRepliesOrStreamError;
      a.expect.code = absl::StatusCode::kNotFound;
      a.expect.needles_by_id[i] = {"unknown function"};
      a.expect.replies = 1;
      a.expect.needles = {"larger than max"};
      break;
    }
  }
  a.spec.expected_replies = a.expect.replies;
  return a;
}

// 7. Declared sizes whose sum wraps around 2^64. ParsePacket at HEAD
// (commit of rpc/internal/wire.cc before its overflow check) added
// payload_size and blob_sizes in a uint64 unchecked: payload_size 2^63 plus
// a blob of 2^63 declared 0 bytes, passed the check, and
// `payload.bytes.resize(2^63)` threw std::length_error out of
// ServerStream::OnReadDone: std::terminate, the worker died (SIGABRT).
// Not sent: payload_size 2^40 with a blob of 2^64 - 2^40, which on such a
// build would try to allocate and zero 1 TiB instead.
inline Attack SizeOverflowCase(int i) {
  Attack a;
  a.expect.kind = Expect::kClosedByServer;
  const std::string payload = TensorArg(at::kFloat, {4}, 0);
  const std::string blob = FloatBytes({1, 2, 3, 4});
  proto::FrameHeader h = Request(i, "echo", EchoSignature());
  if (i % 2 == 0) {
    a.variant = "payload_size 2^63 + blob 2^63 (sum wraps to 0)";
    h.set_payload_size(uint64_t{1} << 63);
    h.add_blob_sizes(uint64_t{1} << 63);
  } else {
    a.variant = "payload_size right, blobs 2^63 + 2^63 + 16 (sum wraps)";
    h.set_payload_size(payload.size());
    h.add_blob_sizes(uint64_t{1} << 63);
    h.add_blob_sizes(uint64_t{1} << 63);
    h.add_blob_sizes(blob.size());
  }
  a.spec.packets = {RawFrame(h, payload + blob)};
  return a;
}

// 8. One header that lists about 8 million blob sizes (8 MiB of packed
// zeros) for a call with one small tensor argument. Before the header's
// lists were checked against the frame's bytes, w0 parsed it (64 MiB of
// sizes) and made a blob for each entry (320 MiB) before the codec found
// the tensor's blob empty: +430 MiB of RSS for 8 MiB received. The peak
// this case may add is bounded (kAmplificationPeakBound, RunAttacker).
inline Attack HeaderAmplificationCase(int i) {
  Attack a;
  a.variant = "8 MiB header listing 8M blob sizes, one small tensor argument";
  const std::string args = TensorArg(at::kFloat, {4}, 0);
  proto::FrameHeader h = Request(i, "echo", EchoSignature());
  h.set_payload_size(args.size());
  std::string head = h.SerializeAsString();
  constexpr size_t kEntries = size_t{8} << 20;
  head.push_back(static_cast<char>((10 << 3) | 2));  // blob_sizes, packed
  PutVarint(&head, kEntries);
  head.append(kEntries, '\0');
  a.spec.packets = {Le32(static_cast<uint32_t>(head.size())) + head + args};
  a.expect.kind = Expect::kStatus;
  a.expect.code = absl::StatusCode::kDataLoss;
  a.expect.needles = {"frame header lists 8388608 blobs", "can name at most"};
  return a;
}

}  // namespace baton::rpc::bad_input

#endif  // BATON_TESTS_BAD_INPUT_CASES_H_
