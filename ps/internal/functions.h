// The parameter server's remote functions and their wire messages, shared by
// PsServer (ps/server.cc) and PsClient (ps/client.cc). Internal to //ps.
//
// Every function takes one typed request and returns one typed reply:
// - Requests and fixed replies are plain structs whose fields travel in the
//   order BATON_CODEC_FIELDS lists them (rpc/codec.h). A struct's codec name
//   spells every field's type, so a peer built with another field list is
//   refused as an argument type mismatch, and a field that fails to decode
//   is named in the DATA_LOSS error ("PushRequest.end_clock: ...").
// - Records of counters that grow over time (ShardStats) are protocol
//   buffers (proto/ps.proto, through rpc/proto_codec.h); ToProto/FromProto
//   below are the one place each side fills or reads them.
// Every request that reads or changes a table names the trainer, the
// session its Join returned and the trainer's clock (PS6 in
// ps/server_shard.h). A request's `tables`, `ids` (and `gradients` or
// `values`) are parallel lists, one entry per table; the server refuses
// lists of different lengths with INVALID_ARGUMENT naming them.
//
// Thread-safety: constants and value types.
#ifndef BATON_PS_INTERNAL_FUNCTIONS_H_
#define BATON_PS_INTERNAL_FUNCTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/ps.pb.h"
#include "ps/types.h"
#include "rpc/codec.h"
#include "rpc/function.h"
#include "rpc/proto_codec.h"

namespace baton::ps::internal {

using Names = std::vector<std::string>;
using Tensors = std::vector<at::Tensor>;

// baton.ps.join: a trainer (re)joins a server (PS6). Same-host dense
// tables (ps/internal/shared_tables.h): the trainer announces its gradient
// box for this server, the server its parameter board; an empty name is
// none, and a side that cannot map the other's (another host: SD4) says so.
struct JoinRequest {
  int32_t trainer = 0;
  std::string fingerprint;  // PsSpec::Fingerprint() of the trainer's spec
  std::string box;          // the trainer's gradient box; empty: none
  uint64_t box_nonce = 0;
  int64_t box_bytes = 0;
  BATON_CODEC_FIELDS(JoinRequest, trainer, fingerprint, box, box_nonce, box_bytes);
};
struct JoinReply {
  int64_t clock = 0;        // the clock the trainer continues from
  int64_t session = 0;      // carried by the trainer's later requests
  bool box_mapped = false;  // the server reads pushes from the box
  std::string board;        // the server's parameter board; empty: none
  uint64_t board_nonce = 0;
  int64_t board_bytes = 0;
  BATON_CODEC_FIELDS(JoinReply, clock, session, box_mapped, board, board_nonce, board_bytes);
};

// baton.ps.init_dense: initial values of dense tables (first writer wins).
struct InitRequest {
  int32_t trainer = 0;
  Names tables;
  Tensors values;  // per table, the flat chunk this server holds
  BATON_CODEC_FIELDS(InitRequest, trainer, tables, values);
};
struct InitReply {
  int64_t initialized = 0;  // tables this call gave their value
  BATON_CODEC_FIELDS(InitReply, initialized);
};

// baton.ps.pull: values of dense chunks or embedding rows, once the clock
// may be served (PS1, PS4); the reply may be parked (PS5).
struct PullRequest {
  int32_t trainer = 0;
  int64_t session = 0;
  int64_t clock = 0;
  Names tables;
  Tensors ids;  // per table: embedding int64[n] ids; dense: undefined
  // Dense values may stay on the server's parameter board (the trainer
  // mapped it).
  bool from_board = false;
  BATON_CODEC_FIELDS(PullRequest, trainer, session, clock, tables, ids, from_board);
};
struct PullReply {
  int64_t staleness = 0;
  Tensors values;              // per requested table, in order; undefined: on the board
  int64_t board_version = -1;  // the board's version to read; -1: none
  uint64_t board_nonce = 0;    // which board (versions count per board)
  BATON_CODEC_FIELDS(PullReply, staleness, values, board_version, board_nonce);
};

// baton.ps.push: gradients of one clock; end_clock marks the trainer's last
// push of it.
struct PushRequest {
  int32_t trainer = 0;
  int64_t session = 0;
  int64_t clock = 0;
  bool end_clock = false;
  Names tables;
  Tensors ids;        // per table: embedding int64[n] ids; dense: undefined
  Tensors gradients;  // per table: dense [chunk size]; embedding [n, dim]
  // > 0: the dense gradients left undefined in `gradients` are this
  // generation of the trainer's gradient box (SD3).
  uint64_t box_generation = 0;
  // > 0: this push's id in the trainer's session, for the server to apply
  // it once however often it arrives (PS9).
  uint64_t push_id = 0;
  BATON_CODEC_FIELDS(PushRequest, trainer, session, clock, end_clock, tables, ids, gradients,
                     box_generation, push_id);
};
struct PushReply {
  int64_t clock = 0;  // the clock the trainer is at afterwards
  // With a parameter board: if a pull at `clock` could be served at once,
  // the board's version it may read (-1: it must ask), and which board; the
  // trainer's next dense pull then reads it without a message.
  int64_t board_version = -1;
  uint64_t board_nonce = 0;
  BATON_CODEC_FIELDS(PushReply, clock, board_version, board_nonce);
};

// baton.ps.checkpoint: the server writes a checkpoint now.
struct CheckpointReply {
  std::string path;
  BATON_CODEC_FIELDS(CheckpointReply, path);
};

inline const rpc::Function<JoinReply(JoinRequest)> kJoinFn("baton.ps.join");
inline const rpc::Function<InitReply(InitRequest)> kInitFn("baton.ps.init_dense");
inline const rpc::Function<PullReply(PullRequest)> kPullFn("baton.ps.pull");
inline const rpc::Function<PushReply(PushRequest)> kPushFn("baton.ps.push");
inline const rpc::Function<proto::ShardStats()> kStatsFn("baton.ps.stats");
inline const rpc::Function<CheckpointReply()> kCheckpointFn("baton.ps.checkpoint");

// ShardStats on the wire: the server fills the message with ToProto, the
// client reads it with FromProto.
proto::ShardStats ToProto(const ShardStats& stats);
ShardStats FromProto(const proto::ShardStats& stats);

}  // namespace baton::ps::internal

#endif  // BATON_PS_INTERNAL_FUNCTIONS_H_
