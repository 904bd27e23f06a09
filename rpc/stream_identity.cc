// Stream identities of the RPC agent (internal::AgentImpl): what this
// worker presents when it opens a network stream to a peer, and the check of
// what an incoming stream presents (docs/flow_control.md, W1-W3).
//
// An identity is "<rank>/<incarnation>/<proof>": the opener's rank and
// incarnation, and the hex of its WorkerIdentity proof (base/identity.h) of
// StreamStatement(opener, callee) under the key pair each incarnation
// registered (proto::WorkerRecord.identity_key).
#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "rpc/executor.h"
#include "rpc/internal/agent_impl.h"
#include "rpc/internal/agent_internals.h"
#include "store/store.h"

namespace baton::rpc::internal {
namespace {

// What a stream's proof proves: who opens it, toward whom. Both
// incarnations are in it, so a proof toward one incarnation of the callee
// is refused by the next.
std::string StreamStatement(int caller, int64_t caller_incarnation, int callee,
                            int64_t callee_incarnation) {
  return absl::StrCat("baton stream v1: worker ", caller, " incarnation ", caller_incarnation,
                      " to worker ", callee, " incarnation ", callee_incarnation);
}

struct Claim {
  int rank = -1;
  int64_t incarnation = 0;
  std::string proof;
};

absl::StatusOr<Claim> ParseClaim(absl::string_view identity) {
  if (identity.empty()) {
    return absl::PermissionDeniedError(
        "a stream without a worker identity (x-baton-identity); every worker presents one");
  }
  std::vector<absl::string_view> parts = absl::StrSplit(identity, '/');
  Claim c;
  std::string proof;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &c.rank) || c.rank < 0 ||
      !absl::SimpleAtoi(parts[1], &c.incarnation) || c.incarnation <= 0 ||
      parts[2].size() != 2 * WorkerIdentity::kProofBytes ||
      !absl::c_all_of(parts[2], absl::ascii_isxdigit)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a malformed worker identity (x-baton-identity: \"",
        absl::CHexEscape(identity.substr(0, 96)), "\"); expected <rank>/<incarnation>/<",
        2 * WorkerIdentity::kProofBytes, " hex digits>"));
  }
  c.proof = absl::HexStringToBytes(parts[2]);
  return c;
}

}  // namespace

std::string AgentImpl::IdentityToward(int peer, int64_t peer_incarnation,
                                      const std::string& peer_key) const {
  if (!identity_.has_value() || peer_key.empty()) return "";
  auto proof =
      identity_->Prove(peer_key, StreamStatement(rank_, incarnation_, peer, peer_incarnation));
  // A key the peer registered that proves nothing: present none, and the
  // peer's refusal names the problem.
  if (!proof.ok()) return "";
  return absl::StrCat(rank_, "/", incarnation_, "/", absl::BytesToHexString(*proof));
}

void AgentImpl::AddNetworkPeer(int peer, const proto::WorkerRecord& record) {
  const int64_t incarnation =
      peer == rank_ ? incarnation_ : std::max<int64_t>(1, record.incarnation());
  if (Peer* p = PeerAt(peer)) p->SetIdentity(record.identity_key(), incarnation);
  transport_->AddPeer(peer, record.address(),
                      IdentityToward(peer, incarnation, record.identity_key()));
  if (peer != rank_) transport_->AddBulkPeer(peer, record.bulk_address());
}

std::string AgentImpl::StreamIdentity(int peer) const {
  const Peer* p = PeerAt(peer);
  if (p == nullptr) return "";
  const auto [key, incarnation] = p->identity();
  return IdentityToward(peer, incarnation, key);
}

std::string AgentInternals::StreamIdentity(const RpcAgent& agent, int peer) {
  return agent.impl_->StreamIdentity(peer);
}

absl::StatusOr<int> AgentImpl::CheckClaim(int rank, int64_t incarnation, const std::string& proof,
                                          const std::string& key) const {
  absl::Status s =
      identity_->Verify(key, StreamStatement(rank, incarnation, rank_, incarnation_), proof);
  if (!s.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker '", options_.name, "' refuses a stream claiming to come from worker id ", rank,
        " (incarnation ", incarnation, "): ", s.message()));
  }
  return rank;
}

void AgentImpl::AuthenticateStream(absl::string_view identity,
                                   std::function<void(absl::StatusOr<int>)> done) {
  auto claim = ParseClaim(identity);
  if (!claim.ok()) {
    done(absl::PermissionDeniedError(
        absl::StrCat("worker '", options_.name, "' refuses ", claim.status().message())));
    return;
  }
  if (!identity_.has_value() || claim->rank >= slots_) {
    done(absl::PermissionDeniedError(absl::StrCat(
        "worker '", options_.name, "' refuses a stream claiming worker id ", claim->rank,
        claim->rank >= slots_
            ? (options_.dynamic_group
                   ? absl::StrCat(": the group's ranks are below ", slots_,
                                  " (AgentOptions::max_ranks)")
                   : absl::StrCat(": the job has ", options_.world_size, " workers"))
            : ": it has no identity yet")));
    return;
  }
  std::string key;
  if (const Peer* p = PeerAt(claim->rank)) key = p->KeyOf(claim->incarnation);
  if (!key.empty()) {
    done(CheckClaim(claim->rank, claim->incarnation, claim->proof, key));
    return;
  }
  // The key is not known here yet: an incarnation that rejoined after our
  // rendezvous, or a stream that opened before it read the registrations.
  // The registration says which key that incarnation holds.
  auto check = [this, c = *std::move(claim), done]() {
    const Claim& claim = c;
    absl::StatusOr<proto::WorkerRecord> read;
    {
      Executor::BlockingScope blocking;  // a store read (E2)
      read = rendezvous_->ReadRecordNow(claim.rank, absl::Seconds(2), /*fail_fast=*/false);
    }
    const proto::WorkerRecord record = read.ok() ? *read : proto::WorkerRecord();
    if (!read.ok()) {
      done(absl::UnavailableError(
          absl::StrCat("worker '", options_.name, "' could not read the registration of worker id ",
                       claim.rank, " to check its stream: ", read.status().ToString())));
    } else if (record.incarnation() > claim.incarnation) {
      done(absl::UnavailableError(
          absl::StrCat("worker '", options_.name, "' refuses a stream from incarnation ",
                       claim.incarnation, " of worker id ", claim.rank, ": incarnation ",
                       record.incarnation(), " of that rank rejoined the job")));
    } else if (record.incarnation() < claim.incarnation) {
      done(absl::PermissionDeniedError(absl::StrCat(
          "worker '", options_.name, "' refuses a stream claiming incarnation ", claim.incarnation,
          " of worker id ", claim.rank, ": the latest registered is ", record.incarnation())));
    } else {
      done(CheckClaim(claim.rank, claim.incarnation, claim.proof, record.identity_key()));
    }
  };
  if (!executor_->Submit(check)) {
    done(absl::UnavailableError(absl::StrCat("worker '", options_.name, "' is shutting down")));
  }
}

}  // namespace baton::rpc::internal
