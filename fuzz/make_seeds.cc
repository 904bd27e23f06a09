// Writes the seed corpora of the fuzz targets, fuzz/corpus/<target>/seed_*,
// from messages made by baton's own encoders (codecs, AppendFrame,
// ShmChannel::Export through the shm target, the RRef call header, the
// protobuf messages), so every seed is a valid input that the fuzzer then
// mutates. Inputs saved from crashes (crash_*) are left alone. Built and run
// by `tools/fuzz.sh --seeds`; the layouts are those in each target's header
// comment.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fuzz/codec_types.h"
#include "fuzz/fuzz_input.h"
#include "proto/dist_autograd.pb.h"
#include "proto/rref.pb.h"
#include "proto/store.pb.h"
#include "rpc/channel/shm/shm_channel.h"
#include "rpc/codec.h"
#include "rpc/internal/wire.h"
#include "rref/rref_service.h"

namespace baton::fuzz {
namespace {

namespace fs = std::filesystem;
using rpc::Blob;
using rpc::Payload;

std::string g_root;
int g_written = 0;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(g_root) / target;
  fs::create_directories(dir);
  std::ofstream out(dir / ("seed_" + name), std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  FUZZ_CHECK(out.good());
  ++g_written;
}

std::string Contents(const Blob& b) {
  std::string out(b.size(), '\0');
  b.CopyTo(out.data());
  return out;
}

template <typename T>
Payload Encode(const T& value) {
  absl::StatusOr<Payload> p = rpc::EncodeMessage(value);
  FUZZ_CHECK(p.ok());
  return *std::move(p);
}

at::Tensor Grad(at::Tensor t) {
  t.set_requires_grad(true);
  return t;
}

// ---- wire: a cut byte, a mode, then a packet (mode 0) or fields (mode 1) ----
std::string Packet(std::vector<rpc::internal::Frame> frames) {
  std::vector<grpc::Slice> slices;
  for (auto& f : frames) rpc::internal::AppendFrame(std::move(f), &slices);
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

rpc::internal::Frame Request(uint64_t id, const std::string& function, Payload payload) {
  rpc::internal::Frame f;
  f.header.set_kind(proto::FrameHeader::REQUEST);
  f.header.set_id(id);
  f.header.set_function(function);
  f.header.set_signature("(Tensor,int64)->Tensor");
  f.header.set_timeout_us(2000000);
  f.header.set_caller_id(1);
  f.payload = std::move(payload);
  return f;
}

void WireSeeds() {
  const Payload args = Encode(std::make_tuple(at::arange(6, at::kFloat), int64_t{3}));
  Write("wire", "request", FuzzWriter().U8(0).U8(0).Bytes(Packet({Request(1, "add", args)})).str());
  Write("wire", "request_in_7_byte_slices",
        FuzzWriter().U8(7).U8(0).Bytes(Packet({Request(1, "add", args)})).str());

  rpc::internal::Frame error;
  error.header.set_kind(proto::FrameHeader::RESPONSE);
  error.header.set_id(9);
  error.header.set_status_code(5);
  error.header.set_error_message("function 'sub' is not registered");
  Write("wire", "error_response", FuzzWriter().U8(0).U8(0).Bytes(Packet({std::move(error)})).str());

  proto::AutogradTag tag;
  tag.set_context_id((int64_t{1} << 48) | 1);
  tag.set_message_id(4);
  tag.add_grad_indices(0);
  rpc::internal::Frame reply;
  reply.header.set_kind(proto::FrameHeader::RESPONSE);
  reply.header.set_id(2);
  reply.payload = Encode(std::vector<at::Tensor>{at::ones({2, 2}), at::Tensor()});
  reply.payload.extensions["dist_autograd"] = tag.SerializeAsString();
  rpc::internal::Frame shm = Request(3, "big", Encode(std::make_tuple(at::Tensor())));
  proto::ShmBlob* sb = shm.header.add_shm_blobs();
  sb->set_index(0);
  sb->set_name("/baton.4026531836.1234.s0");
  sb->set_size(40000);
  sb->set_generation(2);
  sb->set_capacity(1 << 20);
  shm.payload.blobs.emplace_back();
  Write("wire", "three_frames",
        FuzzWriter()
            .U8(3)
            .U8(0)
            .Bytes(Packet({Request(1, "f", args), std::move(reply), std::move(shm)}))
            .str());
  Write("wire", "empty_frame",
        FuzzWriter().U8(0).U8(0).Bytes(Packet({rpc::internal::Frame()})).str());
  // Fields: a request with a 10-byte payload (room for two tensors) and
  // blobs of 4 and 0 bytes, the second also listed as a shared-memory blob;
  // then a response with none.
  Write("wire", "fields",
        FuzzWriter()
            .U8(0)
            .U8(1)
            .U8(0)
            .U64(10)
            .U8(2)
            .U64(4)
            .U64(0)
            .U8(1)
            .U32(1)
            .U64(40000)
            .Chunk("tag")
            .Chunk("payload!!!blob")
            .U8(1)
            .U64(0)
            .U8(0)
            .U8(0)
            .Chunk("")
            .Chunk("")
            .str());
  // A header that lists far more blob sizes (packed zeros) than its payload
  // of one small tensor can name: refused before anything is allocated for
  // them (the shape of an 8 MiB header that once cost 54x its size).
  rpc::internal::Frame many = Request(4, "add", args);
  std::string packet = Packet({std::move(many)});
  uint32_t header_len = 0;
  std::memcpy(&header_len, packet.data(), 4);
  std::string zeros;
  zeros.push_back(static_cast<char>((10 << 3) | 2));  // blob_sizes, packed
  zeros.push_back(static_cast<char>(0x80 | (3000 & 0x7f)));
  zeros.push_back(static_cast<char>(3000 >> 7));
  zeros.append(3000, '\0');
  packet.insert(4 + header_len, zeros);
  header_len += static_cast<uint32_t>(zeros.size());
  std::memcpy(packet.data(), &header_len, 4);
  Write("wire", "header_lists_many_blobs", FuzzWriter().U8(0).U8(0).Bytes(packet).str());
}

// ---- codec: type, flags, blobs, payload ----
std::string CodecInput(CodecCase type, uint8_t flags, const Payload& p) {
  FuzzWriter w;
  w.U8(type).U8(flags).U8(static_cast<uint8_t>(p.blobs.size()));
  for (const Blob& b : p.blobs) w.Chunk(Contents(b));
  return w.Bytes(p.bytes).str();
}

template <typename T>
void CodecSeed(const std::string& name, CodecCase type, const T& value) {
  const Payload p = Encode(value);
  Write("codec", name, CodecInput(type, 0, p));
  Write("codec", name + "_hooked", CodecInput(type, 4, p));
  if (!p.blobs.empty()) Write("codec", name + "_split_misaligned", CodecInput(type, 7, p));
}

app::Tree MakeTree(int depth) {
  app::Tree t;
  t.value = depth;
  for (int i = 0; i < depth; ++i) t.children.push_back(MakeTree(depth - 1));
  return t;
}

void CodecSeeds() {
  using Tensor = at::Tensor;
  CodecSeed("tensor", kTensor, Grad(at::arange(6, at::kFloat).reshape({2, 3})));
  CodecSeed("tensor_vector", kTensorVector,
            std::vector<Tensor>{at::ones({2}), Tensor(), at::arange(3, at::kLong)});
  CodecSeed("propagate_args", kPropagateArgs,
            std::make_tuple(int64_t{(int64_t{1} << 48) | 1}, int64_t{7},
                            std::vector<Tensor>{Grad(at::ones({2})), at::zeros({1}, at::kHalf)}));
  CodecSeed("optional_tensor_map", kOptionalTensorMap,
            std::map<std::string, std::optional<Tensor>>{{"a", at::ones({1}, at::kDouble)},
                                                         {"b", std::nullopt}});
  CodecSeed("nested_unordered_map", kNestedUnorderedMap,
            std::unordered_map<std::string, std::vector<std::pair<std::string, Tensor>>>{
                {"x", {{"w", at::ones({2}, at::kComplexFloat)}, {"b", at::zeros({0, 3})}}}});
  CodecSeed("int_cube", kIntCube,
            std::vector<std::vector<std::vector<int32_t>>>{{{1, -2}, {}}, {{3}}});
  CodecSeed("bool_vector", kBoolVector, std::vector<bool>{true, false, true});
  CodecSeed("optional_strings", kOptionalStrings,
            std::optional<std::vector<std::string>>{{"a", "bc", ""}});
  CodecSeed("scalars", kScalars,
            std::make_tuple(true, uint8_t{200}, int16_t{-3}, uint32_t{70000}, 1.5f, -2.25,
                            std::string("name")));
  CodecSeed("tree", kTree, MakeTree(3));
  CodecSeed(
      "points", kPoints,
      std::vector<app::Point>{{1.0, "p", at::ones({3}, at::kBFloat16)}, {-2.0, "q", Tensor()}});
  CodecSeed("mixed", kMixed,
            std::make_pair(std::map<std::string, app::Tree>{{"t", MakeTree(2)}},
                           std::vector<std::optional<app::Point>>{
                               std::nullopt, app::Point{0.5, "r", at::ones({1}, at::kBool)}}));
}

// ---- shm: flags, blobs, edits ----
void ShmSeeds() {
  const uint16_t large = 0x8000 | 10;
  Write("shm", "one_segment", FuzzWriter().U8(1).U8(0).U16(large).U8(0).str());
  Write("shm", "one_segment_sender_unnamed", FuzzWriter().U8(0).U8(0).U16(large).U8(0).str());
  Write("shm", "two_segments_and_a_small_blob",
        FuzzWriter().U8(1).U8(2).U16(large).U16(5).U16(0x8000 | 3).U8(0).str());
  // Edits: entry, operation (Edit in shm_fuzzer.cc), argument.
  Write("shm", "stale_generation",
        FuzzWriter().U8(1).U8(0).U16(large).U8(1).U8(0).U8(6).U8(1).str());
  Write("shm", "decoy_name", FuzzWriter().U8(1).U8(0).U16(large).U8(1).U8(0).U8(7).U8(0).str());
  Write("shm", "size_past_capacity",
        FuzzWriter().U8(1).U8(0).U16(large).U8(1).U8(0).U8(1).U64(uint64_t{3} << 20).str());
  Write("shm", "bad_index", FuzzWriter().U8(1).U8(0).U16(large).U8(1).U8(0).U8(0).U32(9).str());
  Write("shm", "duplicate_entry",
        FuzzWriter().U8(1).U8(0).U16(large).U8(1).U8(1).U8(6).U8(0).str());
}

// ---- bulk: flags, the bytes after the hello, frames ----
void BulkSeeds() {
  auto record = [](uint64_t id, const std::string& bytes) {
    return FuzzWriter().U64(id).U64(bytes.size()).U64(0).U64(0).U64(bytes.size()).str() + bytes;
  };
  auto slice = [](uint64_t id, const std::string& bytes, uint64_t stripe, uint64_t offset,
                  uint64_t total) {
    return FuzzWriter().U64(id).U64(bytes.size()).U64(stripe).U64(offset).U64(total).str() + bytes;
  };
  const std::string two = record(1, std::string(100, 'a')) + record(2, std::string(9, 'b'));
  // One frame naming blob 1 (index 0, id 1, 100 bytes at 0) of a frame with one blob.
  const std::string frame_1 = FuzzWriter().U8(0).U8(0).U8(1).U16(100).U16(0).U8(0).U8(1).str();
  Write("bulk", "two_records_one_frame", FuzzWriter().U8(1).U16(two.size()).str() + two + frame_1);
  Write("bulk", "wrong_token", FuzzWriter().U8(0).U16(two.size()).str() + two + frame_1);
  const std::string truncated = record(1, std::string(100, 'a')).substr(0, 60);
  Write("bulk", "truncated_record",
        FuzzWriter().U8(1).U16(truncated.size()).str() + truncated + frame_1);
  const std::string huge =
      FuzzWriter().U64(1).U64(uint64_t{1} << 40).U64(0).U64(0).U64(uint64_t{1} << 40).str();
  Write("bulk", "oversized_record", FuzzWriter().U8(1).U16(huge.size()).str() + huge + frame_1);
  const std::string twice = record(3, "xy") + record(3, "zw");
  Write("bulk", "repeated_id",
        FuzzWriter().U8(1).U16(twice.size()).str() + twice +
            FuzzWriter()
                .U8(1)  // two entries, then two blobs
                .U8(0)
                .U8(3)
                .U16(2)
                .U16(0)
                .U8(0)
                .U8(1)
                .U8(3)
                .U16(2)
                .U16(0)
                .U8(0)
                .U8(2)
                .str());
  // B10: a stripe of two slices on lane 1 (flags bit 3), claimed by one
  // frame naming both; and one whose second slice overlaps the first.
  const std::string stripe =
      slice(1, std::string(64, 'p'), 5, 0, 100) + slice(2, std::string(36, 'q'), 5, 64, 100);
  const std::string both = FuzzWriter()
                               .U8(1)  // two entries of stripe 5, then one blob
                               .U8(0)
                               .U8(1)
                               .U16(64)
                               .U16(0)
                               .U8(5)
                               .U8(0)
                               .U8(2)
                               .U16(36)
                               .U16(64)
                               .U8(5)
                               .U8(1)
                               .str();
  Write("bulk", "stripe_two_slices",
        FuzzWriter().U8(1 | 8).U16(stripe.size()).str() + stripe + both);
  const std::string overlap =
      slice(1, std::string(64, 'p'), 5, 0, 100) + slice(2, std::string(64, 'q'), 5, 32, 100);
  Write("bulk", "stripe_overlapping_slice",
        FuzzWriter().U8(1).U16(overlap.size()).str() + overlap + both);
}

// ---- store: method, token mode, request ----
void StoreSeeds() {
  proto::SetRequest set;
  set.set_key("rank/0");
  set.set_value("127.0.0.1:29500");
  proto::GetRequest get;
  get.set_key("rank/0");
  get.set_timeout_ms(1);
  proto::AddRequest add;
  add.set_key("counter");
  add.set_delta(5);
  proto::CompareSetRequest cas;
  cas.set_key("leader");
  cas.set_desired("w0");
  proto::WaitRequest wait;
  wait.add_keys("rank/0");
  wait.add_keys("counter");
  wait.set_timeout_ms(1);
  proto::DeleteRequest del;
  del.set_key("rank/0");
  FuzzWriter all;
  all.U8(0).U8(0).Chunk(set.SerializeAsString());
  all.U8(1).U8(0).Chunk(get.SerializeAsString());
  all.U8(2).U8(0).Chunk(add.SerializeAsString());
  all.U8(3).U8(0).Chunk(cas.SerializeAsString());
  all.U8(4).U8(0).Chunk(wait.SerializeAsString());
  all.U8(5).U8(0).Chunk(del.SerializeAsString());
  all.U8(6).U8(0).Chunk("");
  Write("store", "every_method", all.str());
  Write("store", "wrong_token",
        FuzzWriter().U8(0).U8(2).Chunk(set.SerializeAsString()).Chunk("not-the-token").str());
  Write("store", "no_token", FuzzWriter().U8(2).U8(1).Chunk(add.SerializeAsString()).str());
  proto::AddRequest big = add;
  big.set_delta(INT64_MAX - 10);
  Write("store", "add_twice",
        FuzzWriter()
            .U8(2)
            .U8(0)
            .Chunk(big.SerializeAsString())
            .U8(2)
            .U8(0)
            .Chunk(add.SerializeAsString())
            .str());
  Write("store", "add_to_text",
        FuzzWriter()
            .U8(0)
            .U8(0)
            .Chunk(set.SerializeAsString())
            .U8(2)
            .U8(0)
            .Chunk([] {
              proto::AddRequest a;
              a.set_key("rank/0");
              a.set_delta(1);
              return a.SerializeAsString();
            }())
            .str());
  Write("store", "get_missing", FuzzWriter().U8(1).U8(0).Chunk(get.SerializeAsString()).str());
  // From fields (token mode bit 7): Set k1, Add 7 to k0 twice, Wait for both.
  Write("store", "fields",
        FuzzWriter()
            .U8(0)
            .U8(0x80)
            .U8(1)
            .Chunk("v")
            .U8(2)
            .U8(0x80)
            .U8(0)
            .U64(7)
            .U8(2)
            .U8(0x80)
            .U8(0)
            .U64(7)
            .U8(4)
            .U8(0x80)
            .U8(2)
            .U8(0)
            .U8(1)
            .U64(1)
            .str());
}

// ---- rref: operations (Step in rref_fuzzer.cc) ----
std::string ControlMessage(proto::RRefControl::Kind kind, int rref_worker, uint64_t rref_local,
                           int fork_worker, uint64_t fork_local, int parent) {
  proto::RRefControl m;
  m.set_kind(kind);
  m.mutable_rref()->set_worker(rref_worker);
  m.mutable_rref()->set_local(rref_local);
  m.mutable_fork()->set_worker(fork_worker);
  m.mutable_fork()->set_local(fork_local);
  m.set_parent(parent);
  return m.SerializeAsString();
}

// An RRef as Codec<RRef<T>>::Encode lays it out (that encoder needs an agent).
std::string RRefPayload(const std::string& type) {
  rpc::Encoder enc;
  enc.WritePod<uint8_t>(1);
  enc.WritePod<int32_t>(1);  // owner
  enc.WritePod<int32_t>(2);  // parent
  enc.WritePod<int32_t>(1);  // rref id
  enc.WriteVarint(3);
  enc.WritePod<int32_t>(2);  // fork id
  enc.WriteVarint(4);
  enc.WriteString(type);
  return std::move(enc).Finish()->bytes;
}

void RRefSeeds() {
  // The worker owns an RRef (local id 1) and forks it to worker 1; worker 1
  // forks it on to worker 2 (a fork request with parent 1), then both delete.
  FuzzWriter owner;
  owner.U8(5).U8(7).U8(0).U8(1).U8(1);
  owner.U8(0).Chunk(ControlMessage(proto::RRefControl::FORK_REQUEST, 0, 1, 1, 9, 1));
  owner.U8(0).Chunk(ControlMessage(proto::RRefControl::USER_DELETE, 0, 1, 0, 2, 0));
  owner.U8(0).Chunk(ControlMessage(proto::RRefControl::USER_DELETE, 0, 1, 1, 9, 0));
  owner.U8(8).U8(0);
  Write("rref", "owner_forks_and_deletes", owner.str());

  // remote() from worker 1 and a fetch of the value.
  proto::RRefCall call;
  call.mutable_rref()->set_worker(1);
  call.mutable_rref()->set_local(3);
  call.mutable_fork()->set_worker(1);
  call.mutable_fork()->set_local(4);
  call.set_function("make");
  call.set_signature("(int64)->int64");
  call.set_type("l");
  const std::string header = rref::WithHeader(call, Encode(std::make_tuple(int64_t{5}))).bytes;
  Write("rref", "remote_then_fetch",
        FuzzWriter().U8(2).Chunk(header).U8(0).U8(2).Chunk(header).U8(1).str());
  // A user reference: created by remote(), forked to a third worker,
  // accepted, dropped.
  // Ids of op 1 are packed: worker = b % 4 - 1, local = (b >> 2) % 8.
  Write("rref", "user_fork_accept",
        FuzzWriter()
            .U8(6)
            .U8(0)
            .U8(7)
            .U8(0)
            .U8(2)
            .U8(1)
            .U8(1)
            .U8(1)
            .U8(5)
            .U8(13)
            .U8(0)
            .U8(8)
            .U8(0)
            .str());
  Write("rref", "rref_in_payload", FuzzWriter().U8(3).Chunk(RRefPayload("l")).str());
  Write("rref", "adopt_descriptor", FuzzWriter().U8(4).U8(5).U8(9).U8(1).U8(2).U8(8).U8(0).str());
}

// ---- dist_autograd: operations (Step in dist_autograd_fuzzer.cc) ----
std::string Tag(int64_t context, int64_t message, std::vector<uint32_t> indices) {
  proto::AutogradTag t;
  t.set_context_id(context);
  t.set_message_id(message);
  for (uint32_t i : indices) t.add_grad_indices(i);
  return t.SerializeAsString();
}

void AutogradPayload(FuzzWriter& w, const Payload& p) {
  w.U8(static_cast<uint8_t>(p.blobs.size()));
  for (const Blob& b : p.blobs) w.Chunk(Contents(b));
  w.Chunk(p.bytes);
}

void AutogradSeeds() {
  const int64_t context = (int64_t{1} << 48) | 1;
  // A propagate-shaped request whose first tensor requires grad.
  FuzzWriter request;
  request.U8(0).U8(0x80).U8(1).U8(0).Chunk(Tag(context, 4, {0}));
  AutogradPayload(request, Encode(std::make_tuple(
                               context, int64_t{4},
                               std::vector<at::Tensor>{Grad(at::ones({2})), at::zeros({1})})));
  Write("dist_autograd", "request_with_grad", request.str());

  FuzzWriter reply;
  reply.U8(0).U8(1).U8(2).U8(0).Chunk(Tag(context, 8, {0, 1}));
  AutogradPayload(reply, Encode(std::vector<at::Tensor>{Grad(at::ones({3})),
                                                        Grad(at::ones({1}, at::kDouble))}));
  Write("dist_autograd", "reply_vector", reply.str());

  FuzzWriter map;
  map.U8(0).U8(0x83).U8(1).U8(0).Chunk(Tag(context, 2, {1}));
  AutogradPayload(map, Encode(std::map<std::string, at::Tensor>{{"a", at::ones({1})},
                                                                {"b", Grad(at::ones({2}))}}));
  Write("dist_autograd", "request_map", map.str());

  proto::ReleaseContext release;
  release.set_context_id(context);
  FuzzWriter both;
  both.U8(0).U8(0x82).U8(1).U8(0).Chunk(Tag(context, 1, {0}));
  AutogradPayload(both, Encode(Grad(at::ones({2}))));
  both.U8(1).U8(1).Chunk(release.SerializeAsString());
  both.U8(0).U8(0x82).U8(1).U8(0).Chunk(Tag(context, 1, {0}));  // after the release
  AutogradPayload(both, Encode(Grad(at::ones({2}))));
  Write("dist_autograd", "receive_release_receive", both.str());

  Write("dist_autograd", "reply_to_tagged_request",
        FuzzWriter().U8(2).U8(0).Chunk(Tag(context, 3, {})).U8(1).str());
}

}  // namespace
}  // namespace baton::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  using namespace baton::fuzz;
  g_root = argv[1];
  WireSeeds();
  CodecSeeds();
  ShmSeeds();
  BulkSeeds();
  StoreSeeds();
  RRefSeeds();
  AutogradSeeds();
  std::printf("make_seeds: wrote %d seeds under %s\n", g_written, argv[1]);
  return 0;
}
