// Raw gRPC streams for the bad-input test (tests/rpc/bad_input_test.cc): frames
// crafted byte by byte (valid or not), a client stream that sends them with
// or without the job token and records how the server answered, and the
// expectations each case checks. Test-only.
//
// Thread-safety: RawStream is driven by gRPC's callback threads and read
// after it finished; the helpers are stateless.
#ifndef BATON_TESTS_BAD_INPUT_STREAM_H_
#define BATON_TESTS_BAD_INPUT_STREAM_H_

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/grpc_options.h"
#include "proto/rpc.pb.h"
#include "rpc/function.h"
#include "rpc/internal/wire.h"
#include "rpc/transport/grpc/grpc_transport.h"

namespace baton::rpc::bad_input {

inline constexpr char kToken[] = "bad-input-test-job-token";
// The attacker's rank: its frames claim to come from it.
inline constexpr int kAttackerId = 2;
// A stream still open at this deadline counts as "never ended".
inline constexpr absl::Duration kStreamDeadline = absl::Seconds(20);

// ---- Crafting frames ----
inline void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

inline std::string Le32(uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);  // the wire is little-endian, like this machine
  return std::string(b, 4);
}

// A frame as it travels: u32 header length | header | rest (nothing is
// checked or filled in).
inline std::string RawFrame(const proto::FrameHeader& h, const std::string& rest) {
  const std::string hb = h.SerializeAsString();
  return Le32(static_cast<uint32_t>(hb.size())) + hb + rest;
}

// A well-formed frame: sizes filled in from what follows.
inline std::string WellFormedFrame(proto::FrameHeader h, const std::string& payload,
                                   const std::vector<std::string>& blobs) {
  h.set_payload_size(payload.size());
  h.clear_blob_sizes();
  std::string rest = payload;
  for (const auto& b : blobs) {
    h.add_blob_sizes(b.size());
    rest += b;
  }
  return RawFrame(h, rest);
}

inline proto::FrameHeader Request(uint64_t id, const std::string& function,
                                  const std::string& signature = "") {
  proto::FrameHeader h;
  h.set_kind(proto::FrameHeader::REQUEST);
  h.set_id(id);
  h.set_function(function);
  h.set_signature(signature);
  h.set_timeout_us(10'000'000);
  h.set_caller_id(kAttackerId);
  return h;
}

inline const std::string& EchoSignature() {
  static const std::string s = Function<at::Tensor(at::Tensor)>::signature();
  return s;
}

// The codec's encoding of one dense tensor argument (rpc/codec.cc).
inline std::string TensorArg(at::ScalarType dtype, const std::vector<uint64_t>& sizes,
                             uint64_t blob_index) {
  std::string s;
  s.push_back(1);  // dense
  s.push_back(static_cast<char>(static_cast<int8_t>(dtype)));
  s.push_back(0);  // requires_grad
  PutVarint(&s, sizes.size());
  for (uint64_t d : sizes) PutVarint(&s, d);
  PutVarint(&s, blob_index);
  return s;
}

inline std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A valid call of echo with a float tensor {1, 2, 3, 4}.
inline std::string ValidEchoFrame(uint64_t id) {
  return WellFormedFrame(Request(id, "echo", EchoSignature()), TensorArg(at::kFloat, {4}, 0),
                         {FloatBytes({1, 2, 3, 4})});
}

// ---- A raw stream ----
struct Spec {
  std::string method = internal::kStreamMethod;
  std::optional<std::string> token = std::string(kToken);  // nullopt: none sent
  // The worker identity presented (x-baton-identity): nullopt, the
  // attacker's own (the Attacker fills it in); "", none.
  std::optional<std::string> identity;
  std::vector<std::string> packets;  // one gRPC message each
  // > 0: half-close once this many reply frames arrived; 0: never half-close
  // (the server must end the stream itself).
  int expected_replies = 0;
};

struct Outcome {
  bool finished = false;
  grpc::Status status;
  std::vector<Frame> replies;
  std::string reply_parse_error;
  bool half_closed = false;
  absl::Duration elapsed;
};

struct StreamResult {
  absl::Mutex mu;
  bool finished ABSL_GUARDED_BY(mu) = false;
  Outcome outcome ABSL_GUARDED_BY(mu);
};

// Writes the spec's packets in order, reads replies, half-closes when told;
// deletes itself when the stream is done. The spec must outlive it.
class RawStream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static std::shared_ptr<StreamResult> Start(grpc::GenericStub* stub, const Spec& spec) {
    auto result = std::make_shared<StreamResult>();
    auto* s = new RawStream(spec, result);
    s->start_ = absl::Now();
    if (spec.token.has_value()) s->ctx_.AddMetadata(kTokenMetadataKey, *spec.token);
    if (spec.identity.has_value() && !spec.identity->empty()) {
      s->ctx_.AddMetadata(internal::kIdentityMetadataKey, *spec.identity);
    }
    s->ctx_.set_deadline(absl::ToChronoTime(s->start_ + kStreamDeadline));
    stub->PrepareBidiStreamingCall(&s->ctx_, spec.method, grpc::StubOptions(), s);
    s->StartRead(&s->in_);
    s->WriteNext();
    s->StartCall();  // `s` may be gone from here on
    return result;
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the stream is ending; no more writes
    WriteNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    std::vector<Frame> frames;
    absl::Status s = internal::ParsePacket(&in_, internal::PacketSource::kGrpc, &frames);
    in_.Clear();
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok()) outcome_.reply_parse_error = s.ToString();
      for (auto& f : frames) outcome_.replies.push_back(std::move(f));
    }
    MaybeHalfClose();
    StartRead(&in_);
  }

  // Deletes the stream (its ClientContext holds the channel) before the
  // result says it finished: a test that then drops the channel must not
  // leave its last release to this reaction thread (gRPC 1.51 would delete
  // its process-wide callback queue under it; see grpc_transport.h).
  void OnDone(const grpc::Status& status) override {
    const std::shared_ptr<StreamResult> result = result_;
    Outcome outcome;
    {
      absl::MutexLock lock(&mu_);
      outcome_.finished = true;
      outcome_.status = status;
      outcome_.elapsed = absl::Now() - start_;
      outcome = std::move(outcome_);
    }
    delete this;
    absl::MutexLock lock(&result->mu);
    result->outcome = std::move(outcome);
    result->finished = true;
  }

 private:
  RawStream(const Spec& spec, std::shared_ptr<StreamResult> result)
      : spec_(spec), result_(std::move(result)) {}

  // Runs before StartCall() and then only in OnWriteDone (one at a time).
  void WriteNext() {
    if (next_ < spec_.packets.size()) {
      grpc::Slice slice(spec_.packets[next_++]);
      out_ = grpc::ByteBuffer(&slice, 1);
      StartWrite(&out_);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      writes_finished_ = true;
    }
    MaybeHalfClose();
  }

  void MaybeHalfClose() {
    {
      absl::MutexLock lock(&mu_);
      if (outcome_.half_closed || spec_.expected_replies == 0 || !writes_finished_ ||
          static_cast<int>(outcome_.replies.size()) < spec_.expected_replies) {
        return;
      }
      outcome_.half_closed = true;
    }
    StartWritesDone();
  }

  const Spec& spec_;
  const std::shared_ptr<StreamResult> result_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
  size_t next_ = 0;
  absl::Time start_;
  absl::Mutex mu_;
  bool writes_finished_ ABSL_GUARDED_BY(mu_) = false;
  Outcome outcome_ ABSL_GUARDED_BY(mu_);
};

// ---- Expectations ----
struct Expect {
  enum Kind {
    // The server ends the stream by itself (we never half-close), with no
    // successful reply. `allow_error_replies`: error replies may come first
    // (random bytes may happen to parse as a request).
    kClosedByServer,
    // Exactly `replies` reply frames, each an error `code` whose message
    // contains the needles given for its id; then, after our half-close,
    // the stream ends OK.
    kErrorReplies,
    // The stream ends with status `code` (needles in its message), no reply.
    kStatus,
    // A successful echo of {1, 2, 3, 4} (the crafting's positive control).
    kEchoOk,
    // Either kErrorReplies, or the stream ends with an error status
    // (`needles` in it) and no reply.
    kErrorRepliesOrStreamError,
  };
  Kind kind = kClosedByServer;
  absl::StatusCode code = absl::StatusCode::kOk;
  int replies = 0;
  std::map<uint64_t, std::vector<std::string>> needles_by_id;
  std::vector<std::string> needles;
  bool allow_error_replies = false;
};

struct Attack {
  std::string variant;
  Spec spec;
  Expect expect;
};

inline std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

inline std::string Shorten(const std::string& s, size_t n = 200) {
  if (s.size() <= n) return s;
  return absl::StrCat(s.substr(0, n), "... (", s.size(), " chars)");
}

// Digits become '#', so that outcomes differing only in ids group together.
inline std::string Normalize(const std::string& s) {
  std::string out;
  for (char c : Shorten(s, 160)) {
    if (c >= '0' && c <= '9') {
      if (out.empty() || out.back() != '#') out.push_back('#');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

inline std::string Summarize(const Outcome& o) {
  std::string out = absl::StrCat("stream ", CodeName(o.status.error_code()));
  if (!o.status.error_message().empty()) {
    absl::StrAppend(&out, " \"", Normalize(o.status.error_message()), "\"");
  }
  if (!o.replies.empty()) {
    std::map<std::string, int> replies;
    for (const auto& f : o.replies) {
      ++replies[absl::StrCat(CodeName(f.header.status_code()), " \"",
                             Normalize(f.header.error_message()), "\"")];
    }
    absl::StrAppend(&out, "; replies:");
    for (const auto& [k, n] : replies) absl::StrAppend(&out, " ", n, "x ", k);
  }
  if (!o.reply_parse_error.empty()) {
    absl::StrAppend(&out, "; unparsable reply: ", o.reply_parse_error);
  }
  return out;
}

inline bool ContainsAll(const std::string& s, const std::vector<std::string>& needles,
                        std::string* missing) {
  for (const auto& n : needles) {
    if (!absl::StrContains(s, n)) {
      *missing = n;
      return false;
    }
  }
  return true;
}

// Empty if the outcome is what `e` expects, else why not.
inline std::string Check(const Expect& e, const Outcome& o) {
  const int code = o.status.error_code();
  if (code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::StrCat("stream never ended: still open after ",
                        absl::FormatDuration(kStreamDeadline), " (", Summarize(o), ")");
  }
  if (!o.reply_parse_error.empty()) return "the server sent an unparsable reply";
  std::string missing;
  switch (e.kind) {
    case Expect::kClosedByServer:
      if (o.half_closed) return "internal: half-closed a stream the server should end";
      // The server ends such a stream itself, with an error that says why;
      // UNAVAILABLE would mean the connection or the server went away.
      if (code == grpc::StatusCode::UNAVAILABLE) {
        return absl::StrCat("the server went away: ", Summarize(o));
      }
      if (code == grpc::StatusCode::OK) {
        return absl::StrCat("the server closed the stream without saying why: ", Summarize(o));
      }
      if (o.status.error_message().empty()) {
        return absl::StrCat("the stream ended with an error without a message: ", Summarize(o));
      }
      for (const auto& f : o.replies) {
        if (f.header.status_code() == 0) return "a bad stream got a successful reply";
        if (!e.allow_error_replies) return "a reply came where the stream should just end";
        if (f.header.error_message().empty()) return "an error reply without a message";
      }
      return "";
    case Expect::kErrorReplies: {
      if (static_cast<int>(o.replies.size()) != e.replies) {
        return absl::StrCat("expected ", e.replies, " replies, got ", o.replies.size());
      }
      std::set<uint64_t> seen;
      for (const auto& f : o.replies) {
        if (f.header.kind() != proto::FrameHeader::RESPONSE) return "a reply that is no RESPONSE";
        if (f.header.status_code() != static_cast<int>(e.code)) {
          return absl::StrCat("reply code ", CodeName(f.header.status_code()), ", expected ",
                              CodeName(static_cast<int>(e.code)));
        }
        auto it = e.needles_by_id.find(f.header.id());
        if (it == e.needles_by_id.end() || !seen.insert(f.header.id()).second) {
          return absl::StrCat("reply with unexpected id ", f.header.id());
        }
        if (!ContainsAll(f.header.error_message(), it->second, &missing) ||
            !ContainsAll(f.header.error_message(), e.needles, &missing)) {
          return absl::StrCat("reply message \"", Shorten(f.header.error_message()), "\" lacks \"",
                              Shorten(missing), "\"");
        }
      }
      if (!o.status.ok()) return absl::StrCat("stream ended with ", Summarize(o));
      return "";
    }
    case Expect::kStatus:
      if (code != static_cast<int>(e.code)) {
        return absl::StrCat("expected the stream to end with ", CodeName(static_cast<int>(e.code)),
                            ", got ", Summarize(o));
      }
      if (!ContainsAll(o.status.error_message(), e.needles, &missing)) {
        return absl::StrCat("status message lacks \"", missing, "\": ", Summarize(o));
      }
      if (!o.replies.empty()) return "a rejected stream got replies";
      return "";
    case Expect::kErrorRepliesOrStreamError: {
      if (!o.replies.empty() || o.status.ok()) {
        Expect replies = e;
        replies.kind = Expect::kErrorReplies;
        replies.needles.clear();
        return Check(replies, o);
      }
      if (!ContainsAll(o.status.error_message(), e.needles, &missing)) {
        return absl::StrCat("status message lacks \"", missing, "\": ", Summarize(o));
      }
      return "";
    }
    case Expect::kEchoOk: {
      if (o.replies.size() != 1 || o.replies[0].header.status_code() != 0) {
        return absl::StrCat("positive control failed: ", Summarize(o));
      }
      at::Tensor t;
      absl::Status s = DecodeMessage(o.replies[0].payload, &t);
      if (!s.ok() || !t.equal(at::tensor({1.f, 2.f, 3.f, 4.f}))) {
        return absl::StrCat("positive control: wrong echo (", s.ToString(), ")");
      }
      if (!o.status.ok()) return absl::StrCat("positive control ended with ", Summarize(o));
      return "";
    }
  }
  return "unknown expectation";
}

}  // namespace baton::rpc::bad_input

#endif  // BATON_TESTS_BAD_INPUT_STREAM_H_
