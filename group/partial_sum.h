// PartialSum: a group reduce's running sum (group.h, Group::reduce), as a
// hop or the caller puts it together. Internal to //group.
//
// Thread-safety: none; one owner at a time.
#ifndef BATON_GROUP_PARTIAL_SUM_H_
#define BATON_GROUP_PARTIAL_SUM_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "group/group.h"
#include "proto/group.pb.h"

namespace baton::group::internal {

// "worker 'name'", or "worker <id>" for one this worker does not know.
inline std::string Describe(rpc::Runtime& runtime, int id) {
  absl::StatusOr<rpc::WorkerInfo> w = runtime.worker(id);
  return w.ok() ? absl::StrCat("worker '", w->name, "'") : absl::StrCat("worker ", id);
}

inline std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "] ", c10::toString(t.scalar_type()));
}

// A subtree's sum as a hop, or the caller, puts it together: its own
// member's tensor and its parts' sums, and the members left out with why.
class PartialSum {
 public:
  using Outcome = absl::StatusOr<rpc::Payload>;

  explicit PartialSum(rpc::Runtime* runtime) : runtime_(runtime) {}

  // Member `m`'s own outcome: its function's encoded tensor, or its error.
  void AddOwn(int m, const Outcome& outcome) {
    if (!outcome.ok()) return Fail(m, outcome.status());
    at::Tensor t;
    absl::Status s = rpc::DecodeMessage(*outcome, &t);
    if (!s.ok() || !t.defined()) {
      return Fail(m, absl::InvalidArgumentError(absl::StrCat(
                         "its function's value is not a tensor, so it cannot be summed",
                         s.ok() ? "" : absl::StrCat(": ", s.message()))));
    }
    Add(t, {m}, "its tensor");
  }

  // The reply of the part `part` (GroupReply.reduced). One that does not
  // account for each member of the part exactly once is DATA_LOSS for all.
  void AddPart(const std::vector<int>& part, const rpc::Payload& reply) {
    proto::GroupReply r;
    const bool parsed = r.ParseFromString(reply.bytes);
    const absl::Status bad = absl::DataLossError(
        parsed ? "a group reply whose sum does not match its request" : "undecodable group reply");
    const proto::GroupReduced& reduced = r.reduced();
    absl::flat_hash_set<int> expected(part.begin(), part.end());
    bool valid =
        parsed && r.entries_size() == 0 &&
        reduced.contributors_size() + reduced.failures_size() == static_cast<int>(part.size()) &&
        (reduced.contributors_size() == 0) == reduced.value().empty();
    for (int m : reduced.contributors()) valid = valid && expected.erase(m) == 1;
    for (const auto& f : reduced.failures()) {
      valid = valid && expected.erase(f.member()) == 1 && f.code() != 0;
    }
    at::Tensor sum;
    if (valid && reduced.contributors_size() > 0) {
      rpc::Payload value;
      value.bytes = reduced.value();
      value.blobs = reply.blobs;
      valid = rpc::DecodeMessage(value, &sum).ok() && sum.defined();
    } else if (valid) {
      valid = reply.blobs.empty();
    }
    if (!valid) {
      for (int m : part) Fail(m, bad);
      return;
    }
    if (sum.defined()) {
      Add(sum, {reduced.contributors().begin(), reduced.contributors().end()},
          part.size() == 1 ? std::string("its tensor")
                           : absl::StrCat("the sum of the part of ", part.size(),
                                          " members that it is in (through ",
                                          Describe(*runtime_, part[0]), ")"));
    }
    for (const auto& f : reduced.failures()) {
      const bool known =
          f.code() > 0 && f.code() <= static_cast<int>(absl::StatusCode::kUnauthenticated);
      Fail(f.member(), absl::Status(known ? static_cast<absl::StatusCode>(f.code())
                                          : absl::StatusCode::kUnknown,
                                    f.message()));
    }
  }

  void Fail(int m, absl::Status s) { failures_.emplace_back(m, std::move(s)); }

  // What a hop answers: GroupReply.reduced, the sum's tensors as its blobs.
  absl::StatusOr<rpc::Payload> ToReply() const {
    proto::GroupReply r;
    proto::GroupReduced& reduced = *r.mutable_reduced();
    rpc::Payload reply;
    for (int m : contributors_) reduced.add_contributors(m);
    for (const auto& [m, status] : failures_) {
      proto::GroupEntry* e = reduced.add_failures();
      e->set_member(m);
      e->set_code(static_cast<int>(status.code()));
      e->set_message(std::string(status.message()));
    }
    if (sum_.defined()) {
      ASSIGN_OR_RETURN(rpc::Payload value, rpc::EncodeMessage(sum_));
      reduced.set_value(std::move(value.bytes));
      reply.blobs = std::move(value.blobs);
    }
    reply.bytes = r.SerializeAsString();
    return reply;
  }

  // The caller's outcome, in the group's member order.
  Reduced Result(const std::vector<rpc::WorkerInfo>& members, ReduceOp op) const {
    absl::flat_hash_map<int, size_t> position;
    for (size_t i = 0; i < members.size(); ++i) position[members[i].id] = i;
    std::vector<int> contributors = contributors_;
    auto by_position = [&](int a, int b) { return position.at(a) < position.at(b); };
    std::sort(contributors.begin(), contributors.end(), by_position);
    auto failures = failures_;
    std::sort(failures.begin(), failures.end(),
              [&](const auto& a, const auto& b) { return by_position(a.first, b.first); });
    Reduced out;
    for (int m : contributors) out.contributors.push_back(members[position.at(m)]);
    for (auto& [m, status] : failures) {
      const rpc::WorkerInfo& w = members[position.at(m)];
      out.failures.emplace_back(w, ForMember(status, w));
    }
    if (sum_.defined()) {
      const at::Tensor floating =
          at::isFloatingType(sum_.scalar_type()) ? sum_ : sum_.to(at::kDouble);
      out.value =
          op == ReduceOp::kSum ? sum_ : floating.div(static_cast<double>(contributors.size()));
    }
    return out;
  }

 private:
  // Integers and booleans are added as int64, so that a sum neither wraps
  // in a narrow type nor turns into a logical or.
  static at::Tensor Widened(const at::Tensor& t) {
    return at::isIntegralType(t.scalar_type(), /*includeBool=*/true) && t.scalar_type() != at::kLong
               ? t.to(at::kLong)
               : t;
  }

  void Add(const at::Tensor& given, const std::vector<int>& who, const std::string& what) {
    if (!given.device().is_cpu()) {
      for (int m : who) {
        Fail(m, absl::InvalidArgumentError(absl::StrCat(what, " is not in host memory")));
      }
      return;
    }
    const at::Tensor t = Widened(given);
    if (!sum_.defined()) {
      sum_ = t.clone(at::MemoryFormat::Contiguous);
    } else if (t.sizes() != sum_.sizes() || t.scalar_type() != sum_.scalar_type()) {
      for (int m : who) {
        Fail(m, absl::InvalidArgumentError(absl::StrCat(
                    what, ", ", Shape(given), ", does not add to the others' sum, ", Shape(sum_))));
      }
      return;
    } else {
      sum_.add_(t);
    }
    contributors_.insert(contributors_.end(), who.begin(), who.end());
  }

  rpc::Runtime* const runtime_;
  at::Tensor sum_;
  std::vector<int> contributors_;
  std::vector<std::pair<int, absl::Status>> failures_;
};

}  // namespace baton::group::internal

#endif  // BATON_GROUP_PARTIAL_SUM_H_
