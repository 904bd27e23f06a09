#include "comm/process_group.h"

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "comm/internal/store_exchange.h"

namespace baton::comm {
namespace internal {

// torch's names, which users know from Python ("float32", "int64").
std::string DtypeName(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kShort: return "int16";
    case c10::kInt: return "int32";
    case c10::kLong: return "int64";
    case c10::kBool: return "bool";
    case c10::kComplexFloat: return "complex64";
    case c10::kComplexDouble: return "complex128";
    default: return c10::toString(type);
  }
}

std::string ShapeText(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat(DtypeName(t.scalar_type()), "[", absl::StrJoin(t.sizes(), ","), "]");
}

// The shared state behind ProcessGroup handles.
class GroupState {
 public:
  struct Init {
    std::shared_ptr<store::Store> store;
    BackendFactory factory;
    GroupOptions options;
    std::string prefix;
    int rank = -1;  // -1: not a member
    int size = 0;
    std::vector<int> global_ranks;  // members' world ranks
    int global_rank = -1;           // this process's world rank
    std::unique_ptr<Backend> backend;
  };

  explicit GroupState(Init init)
      : store_(std::move(init.store)),
        factory_(std::move(init.factory)),
        options_(std::move(init.options)),
        prefix_(std::move(init.prefix)),
        rank_(init.rank),
        size_(init.size),
        global_ranks_(std::move(init.global_ranks)),
        global_rank_(init.global_rank),
        backend_name_(init.backend ? init.backend->name() : "none"),
        device_type_(init.backend ? init.backend->device_type() : c10::DeviceType::CPU),
        backend_(std::move(init.backend)) {}

  ~GroupState() { (void)Destroy(absl::Seconds(5)); }

  bool is_member() const { return rank_ >= 0; }
  int rank() const { return rank_; }
  int size() const { return is_member() ? size_ : -1; }
  const std::string& name() const { return options_.name; }
  const std::string& backend_name() const { return backend_name_; }
  absl::Duration timeout() const { return options_.timeout; }

  // Issues one op: checks that the group can run it, validates with
  // `validate`, runs the debug fingerprint check for collectives, then calls
  // `issue` with the backend. Returns a failed Work on any error.
  template <typename Validate, typename Issue>
  WorkPtr Run(OpKind kind, Validate validate, Issue issue) {
    absl::MutexLock issue_lock(&issue_mu_);
    const bool collective = kind != OpKind::kSend && kind != OpKind::kRecv;
    OpInfo info;
    info.kind = kind;
    std::shared_ptr<Backend> backend;
    {
      absl::MutexLock lock(&mu_);
      backend = backend_;
      if (collective && backend) info.seq = next_seq_;
    }
    info.description = collective
                           ? absl::StrCat(OpName(kind), " #", info.seq, " on group '", name(), "'")
                           : absl::StrCat(OpName(kind), " on group '", name(), "'");
    if (!is_member()) {
      return Work::Completed(info.description,
                             absl::FailedPreconditionError(absl::StrCat(
                                 OpName(kind), " on group '", name(), "': this process (global ",
                                 "rank ", global_rank_, ") is not a member of the group (ranks ",
                                 RanksText(global_ranks_, {}), ")")));
    }
    if (!backend) {
      return Work::Completed(info.description,
                             absl::FailedPreconditionError(
                                 absl::StrCat(OpName(kind), " on group '", name(),
                                              "': the group is not initialised or was destroyed")));
    }
    std::string fingerprint;
    absl::Status valid = validate(&fingerprint);
    if (!valid.ok()) {
      return Work::Completed(
          info.description,
          Annotate(valid, absl::StrCat(info.description, " (backend ", backend_name_, ", rank ",
                                       RankText(rank_, global_ranks_), ")")));
    }
    if (collective) {
      {
        absl::MutexLock lock(&mu_);
        ++next_seq_;
      }
      if (options_.check_fingerprints) {
        absl::Status agreed = ExchangeFingerprint(*store_, prefix_, info.seq, rank_, size_,
                                                  global_ranks_, fingerprint, options_.timeout);
        if (!agreed.ok()) {
          return Work::Completed(info.description, Annotate(agreed, info.description));
        }
      }
    }
    return issue(*backend, info);
  }

  absl::StatusOr<ProcessGroup> NewGroup(std::vector<int> ranks, absl::string_view name);

  absl::Status Destroy(absl::Duration timeout) {
    std::shared_ptr<Backend> backend;
    {
      absl::MutexLock lock(&mu_);
      backend.swap(backend_);
    }
    if (!backend) return absl::OkStatus();
    return Annotate(backend->Shutdown(timeout), absl::StrCat("destroying group '", name(), "'"));
  }

  // Validation helpers shared by the ops.
  absl::Status CheckTensor(const at::Tensor& t, absl::string_view what) const;
  absl::Status CheckList(const std::vector<at::Tensor>& tensors, absl::string_view what,
                         bool same_shape) const;
  absl::Status CheckRoot(int root) const;
  absl::Status CheckPeer(int peer) const;
  absl::Status CheckReduce(ReduceOp op, const at::Tensor& t) const;

 private:
  const std::shared_ptr<store::Store> store_;
  const BackendFactory factory_;
  const GroupOptions options_;
  const std::string prefix_;
  const int rank_;
  const int size_;
  const std::vector<int> global_ranks_;
  const int global_rank_;
  const std::string backend_name_;
  const c10::DeviceType device_type_;

  // Serialises issuing, so each collective gets the next sequence number and
  // reaches the backend in that order.
  absl::Mutex issue_mu_;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(issue_mu_);
  std::shared_ptr<Backend> backend_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t subgroups_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::Status GroupState::CheckTensor(const at::Tensor& t, absl::string_view what) const {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is undefined"));
  }
  if (t.device().type() != device_type_) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is on device ", t.device().str(),
                                                   " but backend ", backend_name_, " takes ",
                                                   c10::DeviceTypeName(device_type_), " tensors"));
  }
  if (t.layout() != c10::kStrided) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a dense (strided) tensor"));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not contiguous; call .contiguous() first"));
  }
  return absl::OkStatus();
}

absl::Status GroupState::CheckList(const std::vector<at::Tensor>& tensors, absl::string_view what,
                                   bool same_shape) const {
  if (tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " list is empty"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    RETURN_IF_ERROR(CheckTensor(tensors[i], absl::StrCat(what, " ", i)));
    if (tensors[i].scalar_type() != tensors[0].scalar_type()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", i, " has dtype ", DtypeName(tensors[i].scalar_type()), " but ",
                       what, " 0 has ", DtypeName(tensors[0].scalar_type())));
    }
    if (same_shape && tensors[i].sizes() != tensors[0].sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", i, " has shape ",
                                                     ShapeText(tensors[i]), " but ", what,
                                                     " 0 has ", ShapeText(tensors[0])));
    }
  }
  return absl::OkStatus();
}

absl::Status GroupState::CheckRoot(int root) const {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("root ", root, " is outside the group (size ", size_, ")"));
  }
  return absl::OkStatus();
}

absl::Status GroupState::CheckPeer(int peer) const {
  if (peer < 0 || peer >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer rank ", peer, " is outside the group (size ", size_, ")"));
  }
  if (peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("peer rank ", peer, " is this rank itself"));
  }
  return absl::OkStatus();
}

absl::Status GroupState::CheckReduce(ReduceOp op, const at::Tensor& t) const {
  const c10::ScalarType type = t.scalar_type();
  if (op == ReduceOp::kAvg && !c10::isFloatingType(type) && !c10::isComplexType(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op avg is not exact for ", DtypeName(type),
                     " tensors; use sum and divide, or a floating-point tensor"));
  }
  if (c10::isComplexType(type) && op != ReduceOp::kSum && op != ReduceOp::kAvg) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op ", ReduceOpName(op), " is not defined for complex tensors"));
  }
  if (type == c10::kBool && op == ReduceOp::kAvg) {
    return absl::InvalidArgumentError("reduce op avg on bool tensors");
  }
  return absl::OkStatus();
}

absl::StatusOr<ProcessGroup> GroupState::NewGroup(std::vector<int> ranks, absl::string_view name) {
  if (!is_member()) {
    return absl::FailedPreconditionError(
        absl::StrCat("new_group on group '", options_.name,
                     "': this process is not a member of the parent group"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!backend_) {
      return absl::FailedPreconditionError(
          absl::StrCat("new_group on group '", options_.name,
                       "': the group is not initialised or was destroyed"));
    }
  }
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty() || std::unique(ranks.begin(), ranks.end()) != ranks.end() ||
      ranks.front() < 0 || ranks.back() >= size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "new_group on group '", options_.name, "': ranks [", absl::StrJoin(ranks, ", "),
        "] must be unique ranks of the parent group (size ", size_, ")"));
  }
  int64_t index;
  {
    absl::MutexLock lock(&mu_);
    index = subgroups_++;
  }
  Init init;
  init.store = store_;
  init.factory = factory_;
  init.options = options_;
  init.options.name = name.empty() ? absl::StrCat(options_.name, "/sub", index) : std::string(name);
  init.prefix = absl::StrCat(prefix_, "/sub", index);
  init.size = static_cast<int>(ranks.size());
  init.global_rank = global_rank_;
  for (int r : ranks) init.global_ranks.push_back(global_ranks_[r]);
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it != ranks.end()) {
    init.rank = static_cast<int>(it - ranks.begin());
    BackendContext ctx;
    ctx.store = store_;
    ctx.prefix = init.prefix;
    ctx.group_name = init.options.name;
    ctx.rank = init.rank;
    ctx.size = init.size;
    ctx.global_ranks = init.global_ranks;
    ctx.timeout = init.options.timeout;
    absl::StatusOr<std::unique_ptr<Backend>> backend = factory_(ctx);
    if (!backend.ok()) {
      return Annotate(backend.status(), absl::StrCat("new_group '", init.options.name, "'"));
    }
    init.backend = std::move(*backend);
  }
  return ProcessGroup::FromState(std::make_shared<GroupState>(std::move(init)));
}

}  // namespace internal

using internal::GroupState;
using internal::ShapeText;

absl::StatusOr<ProcessGroup> ProcessGroup::Create(std::shared_ptr<store::Store> store, int rank,
                                                  int world_size, BackendFactory backend,
                                                  GroupOptions options) {
  const std::string where = absl::StrCat("creating group '", options.name, "'");
  if (store == nullptr || !backend) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": store and backend factory are required"));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": rank ", rank, " is not in [0, world_size=", world_size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": timeout must be positive"));
  }
  if (DebugFromEnv()) options.check_fingerprints = true;
  GroupState::Init init;
  init.prefix = absl::StrCat("comm/", options.name);
  // Every rank arrives before anyone connects, so a missing rank is named.
  absl::Status joined =
      store::Barrier(*store, init.prefix + "/join", rank, world_size, options.timeout);
  if (!joined.ok()) return Annotate(joined, where);
  BackendContext ctx;
  ctx.store = store;
  ctx.prefix = init.prefix;
  ctx.group_name = options.name;
  ctx.rank = rank;
  ctx.size = world_size;
  for (int r = 0; r < world_size; ++r) ctx.global_ranks.push_back(r);
  ctx.timeout = options.timeout;
  absl::StatusOr<std::unique_ptr<Backend>> made = backend(ctx);
  if (!made.ok()) return Annotate(made.status(), where);
  init.store = std::move(store);
  init.factory = std::move(backend);
  init.options = std::move(options);
  init.rank = rank;
  init.size = world_size;
  init.global_ranks = ctx.global_ranks;
  init.global_rank = rank;
  init.backend = std::move(*made);
  return ProcessGroup(std::make_shared<GroupState>(std::move(init)));
}

ProcessGroup ProcessGroup::FromState(std::shared_ptr<GroupState> state) {
  return ProcessGroup(std::move(state));
}

ProcessGroup::ProcessGroup() = default;
ProcessGroup::~ProcessGroup() = default;
ProcessGroup::ProcessGroup(const ProcessGroup&) = default;
ProcessGroup& ProcessGroup::operator=(const ProcessGroup&) = default;
ProcessGroup::ProcessGroup(ProcessGroup&&) noexcept = default;
ProcessGroup& ProcessGroup::operator=(ProcessGroup&&) noexcept = default;
ProcessGroup::ProcessGroup(std::shared_ptr<GroupState> state) : state_(std::move(state)) {}

bool ProcessGroup::is_member() const { return state_ && state_->is_member(); }
int ProcessGroup::rank() const { return state_ ? state_->rank() : -1; }
int ProcessGroup::size() const { return state_ ? state_->size() : -1; }
std::string ProcessGroup::name() const { return state_ ? state_->name() : ""; }
std::string ProcessGroup::backend_name() const { return state_ ? state_->backend_name() : "none"; }
absl::Duration ProcessGroup::timeout() const {
  return state_ ? state_->timeout() : absl::ZeroDuration();
}

namespace {

WorkPtr NoGroup(OpKind kind) {
  return Work::Completed(std::string(OpName(kind)),
                         absl::FailedPreconditionError(absl::StrCat(
                             OpName(kind),
                             ": the process group is not initialised (default-constructed "
                             "handle)")));
}

}  // namespace

WorkPtr ProcessGroup::AllReduce(std::vector<at::Tensor> tensors, ReduceOp op) {
  if (!state_) return NoGroup(OpKind::kAllReduce);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kAllReduce,
      [&](std::string* fp) -> absl::Status {
        absl::Status s = g.CheckList(tensors, "tensor", /*same_shape=*/true);
        if (s.ok()) s = g.CheckReduce(op, tensors[0]);
        *fp = absl::StrCat("all_reduce(", ReduceOpName(op), ") ",
                           ShapeText(tensors.empty() ? at::Tensor() : tensors[0]));
        return s;
      },
      [&](Backend& b, const OpInfo& info) { return b.AllReduce(info, std::move(tensors), op); });
}

WorkPtr ProcessGroup::Broadcast(std::vector<at::Tensor> tensors, int root) {
  if (!state_) return NoGroup(OpKind::kBroadcast);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kBroadcast,
      [&](std::string* fp) -> absl::Status {
        absl::Status s = g.CheckList(tensors, "tensor", /*same_shape=*/true);
        if (s.ok()) s = g.CheckRoot(root);
        if (s.ok()) {
          *fp = absl::StrCat("broadcast(root=", root, ") ", ShapeText(tensors[0]));
        }
        return s;
      },
      [&](Backend& b, const OpInfo& info) { return b.Broadcast(info, std::move(tensors), root); });
}

WorkPtr ProcessGroup::Reduce(std::vector<at::Tensor> tensors, int root, ReduceOp op) {
  if (!state_) return NoGroup(OpKind::kReduce);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kReduce,
      [&](std::string* fp) -> absl::Status {
        absl::Status s = g.CheckList(tensors, "tensor", /*same_shape=*/true);
        if (s.ok()) s = g.CheckRoot(root);
        if (s.ok()) s = g.CheckReduce(op, tensors[0]);
        if (s.ok()) {
          *fp = absl::StrCat("reduce(root=", root, ",", ReduceOpName(op), ") ",
                             ShapeText(tensors[0]));
        }
        return s;
      },
      [&](Backend& b, const OpInfo& info) { return b.Reduce(info, std::move(tensors), root, op); });
}

WorkPtr ProcessGroup::AllGather(std::vector<at::Tensor> outputs, at::Tensor input) {
  if (!state_) return NoGroup(OpKind::kAllGather);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kAllGather,
      [&](std::string* fp) -> absl::Status {
        absl::Status s = g.CheckTensor(input, "input");
        if (!s.ok()) return s;
        if (static_cast<int>(outputs.size()) != g.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("expected ", g.size(), " output tensors, got ", outputs.size()));
        }
        s = g.CheckList(outputs, "output", /*same_shape=*/true);
        if (s.ok() && (outputs[0].sizes() != input.sizes() ||
                       outputs[0].scalar_type() != input.scalar_type())) {
          s = absl::InvalidArgumentError(absl::StrCat("outputs are ", ShapeText(outputs[0]),
                                                      " but the input is ", ShapeText(input)));
        }
        *fp = absl::StrCat("all_gather ", ShapeText(input));
        return s;
      },
      [&](Backend& b, const OpInfo& info) {
        return b.AllGather(info, std::move(outputs), std::move(input));
      });
}

// Gather's outputs and Scatter's inputs: the root passes one tensor per
// rank, each shaped like this rank's own tensor; other ranks pass none.
absl::Status CheckRootList(GroupState& g, int root, const std::vector<at::Tensor>& list,
                           const char* list_name, const at::Tensor& own, const char* own_name) {
  if (g.rank() != root) {
    if (!list.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("only the root passes ", list_name, " tensors"));
    }
    return absl::OkStatus();
  }
  if (static_cast<int>(list.size()) != g.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", g.size(), " ", list_name,
                                                   " tensors on the root, got ", list.size()));
  }
  absl::Status s = g.CheckList(list, list_name, /*same_shape=*/true);
  if (s.ok() && (list[0].sizes() != own.sizes() || list[0].scalar_type() != own.scalar_type())) {
    s = absl::InvalidArgumentError(absl::StrCat(list_name, "s are ", ShapeText(list[0]),
                                                " but the ", own_name, " is ", ShapeText(own)));
  }
  return s;
}

WorkPtr ProcessGroup::Gather(std::vector<at::Tensor> outputs, at::Tensor input, int root) {
  if (!state_) return NoGroup(OpKind::kGather);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kGather,
      [&](std::string* fp) -> absl::Status {
        absl::Status s = g.CheckTensor(input, "input");
        if (s.ok()) s = g.CheckRoot(root);
        if (!s.ok()) return s;
        *fp = absl::StrCat("gather(root=", root, ") ", ShapeText(input));
        return CheckRootList(g, root, outputs, "output", input, "input");
      },
      [&](Backend& b, const OpInfo& info) {
        return b.Gather(info, std::move(outputs), std::move(input), root);
      });
}

WorkPtr ProcessGroup::Scatter(at::Tensor output, std::vector<at::Tensor> inputs, int root) {
  if (!state_) return NoGroup(OpKind::kScatter);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kScatter,
      [&](std::string* fp) -> absl::Status {
        absl::Status s = g.CheckTensor(output, "output");
        if (s.ok()) s = g.CheckRoot(root);
        if (!s.ok()) return s;
        *fp = absl::StrCat("scatter(root=", root, ") ", ShapeText(output));
        return CheckRootList(g, root, inputs, "input", output, "output");
      },
      [&](Backend& b, const OpInfo& info) {
        return b.Scatter(info, std::move(output), std::move(inputs), root);
      });
}

WorkPtr ProcessGroup::ReduceScatter(at::Tensor output, std::vector<at::Tensor> inputs,
                                    ReduceOp op) {
  if (!state_) return NoGroup(OpKind::kReduceScatter);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kReduceScatter,
      [&](std::string* fp) -> absl::Status {
        absl::Status s = g.CheckTensor(output, "output");
        if (s.ok()) s = g.CheckReduce(op, output);
        if (!s.ok()) return s;
        *fp = absl::StrCat("reduce_scatter(", ReduceOpName(op), ") ", ShapeText(output));
        if (static_cast<int>(inputs.size()) != g.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("expected ", g.size(), " input tensors, got ", inputs.size()));
        }
        s = g.CheckList(inputs, "input", /*same_shape=*/true);
        if (s.ok() && (inputs[0].sizes() != output.sizes() ||
                       inputs[0].scalar_type() != output.scalar_type())) {
          s = absl::InvalidArgumentError(absl::StrCat("inputs are ", ShapeText(inputs[0]),
                                                      " but the output is ", ShapeText(output)));
        }
        return s;
      },
      [&](Backend& b, const OpInfo& info) {
        return b.ReduceScatter(info, std::move(output), std::move(inputs), op);
      });
}

WorkPtr ProcessGroup::AllToAll(at::Tensor output, at::Tensor input) {
  if (!state_) return NoGroup(OpKind::kAllToAll);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kAllToAll,
      [&](std::string* fp) -> absl::Status {
        absl::Status s = g.CheckTensor(input, "input");
        if (s.ok()) s = g.CheckTensor(output, "output");
        if (!s.ok()) return s;
        *fp = absl::StrCat("all_to_all ", ShapeText(input));
        if (input.sizes() != output.sizes() || input.scalar_type() != output.scalar_type()) {
          return absl::InvalidArgumentError(absl::StrCat("output is ", ShapeText(output),
                                                         " but the input is ", ShapeText(input)));
        }
        if (input.dim() == 0 || input.size(0) % g.size() != 0) {
          return absl::InvalidArgumentError(absl::StrCat("input ", ShapeText(input),
                                                         " does not split evenly along dim 0 into ",
                                                         g.size(), " chunks"));
        }
        return absl::OkStatus();
      },
      [&](Backend& b, const OpInfo& info) {
        return b.AllToAll(info, std::move(output), std::move(input));
      });
}

WorkPtr ProcessGroup::Barrier() {
  if (!state_) return NoGroup(OpKind::kBarrier);
  return state_->Run(
      OpKind::kBarrier,
      [&](std::string* fp) {
        *fp = "barrier";
        return absl::OkStatus();
      },
      [&](Backend& b, const OpInfo& info) { return b.Barrier(info); });
}

WorkPtr ProcessGroup::Send(at::Tensor tensor, int dst, uint32_t tag) {
  if (!state_) return NoGroup(OpKind::kSend);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kSend,
      [&](std::string*) {
        absl::Status s = g.CheckTensor(tensor, "tensor");
        if (s.ok()) s = g.CheckPeer(dst);
        return s;
      },
      [&](Backend& b, const OpInfo& info) { return b.Send(info, std::move(tensor), dst, tag); });
}

WorkPtr ProcessGroup::Recv(at::Tensor tensor, int src, uint32_t tag) {
  if (!state_) return NoGroup(OpKind::kRecv);
  GroupState& g = *state_;
  return g.Run(
      OpKind::kRecv,
      [&](std::string*) {
        absl::Status s = g.CheckTensor(tensor, "tensor");
        if (s.ok()) s = g.CheckPeer(src);
        return s;
      },
      [&](Backend& b, const OpInfo& info) { return b.Recv(info, std::move(tensor), src, tag); });
}

absl::StatusOr<ProcessGroup> ProcessGroup::NewGroup(std::vector<int> ranks,
                                                    absl::string_view name) {
  if (!state_) {
    return absl::FailedPreconditionError("new_group: the process group is not initialised");
  }
  return state_->NewGroup(std::move(ranks), name);
}

absl::Status ProcessGroup::Destroy(absl::Duration timeout) {
  if (!state_) return absl::OkStatus();
  return state_->Destroy(timeout);
}

}  // namespace baton::comm
