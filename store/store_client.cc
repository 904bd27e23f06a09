#include "store/store_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/grpc_options.h"
#include "base/grpc_status.h"
#include "base/host.h"
#include "base/status.h"
#include "store/store_server.h"

namespace baton::store {
namespace {

// Slack added to a blocking call's gRPC deadline so the server's own timeout
// (which names the keys) fires first.
constexpr absl::Duration kServerSlack = absl::Seconds(2);
// Between the attempts of a call whose connection broke.
constexpr absl::Duration kRetryPause = absl::Milliseconds(100);

int64_t ToMillis(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return INT64_MAX / 2;
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(d));
}

proto::SetRequest SetRequestFor(absl::string_view key, absl::string_view value) {
  proto::SetRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  return req;
}

// What a repeat of a blocking call may still wait of `timeout`, begun at
// `start`, in the server's milliseconds.
int64_t LeftMillis(absl::Duration timeout, absl::Time start) {
  return ToMillis(timeout == absl::InfiniteDuration() ? timeout : timeout - (absl::Now() - start));
}

}  // namespace

StoreClient::StoreClient(StoreClientOptions options)
    : options_(std::move(options)), client_id_(RandomHex(12)) {
  channel_ = grpc::CreateCustomChannel(options_.address, BatonChannelCredentials(options_.tls),
                                       BatonChannelArguments(64 << 20, options_.tls));
  stub_ = proto::Store::NewStub(channel_);
}

StoreClient::~StoreClient() = default;

void StoreClient::Prepare(grpc::ClientContext* ctx, absl::Time deadline) const {
  ctx->set_wait_for_ready(true);
  if (deadline != absl::InfiniteFuture()) ctx->set_deadline(absl::ToChronoTime(deadline));
  if (!options_.job_token.empty()) {
    ctx->AddMetadata(kTokenMetadataKey, options_.job_token);
  }
}

void StoreClient::PrepareFailFast(grpc::ClientContext* ctx, absl::Duration deadline) const {
  ctx->set_wait_for_ready(false);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (!options_.job_token.empty()) ctx->AddMetadata(kTokenMetadataKey, options_.job_token);
}

absl::Status StoreClient::Fail(const char* op, absl::string_view key, const absl::Status& s) const {
  std::string what = absl::StrCat("store ", options_.address, ": ", op);
  if (!key.empty()) absl::StrAppend(&what, " '", key, "'");
  if (s.code() == absl::StatusCode::kDeadlineExceeded &&
      absl::StrContains(s.message(), "Deadline Exceeded")) {
    // gRPC's own deadline: the server never answered.
    return absl::DeadlineExceededError(
        absl::StrCat(what,
                     ": no answer from the store server (is rank 0 / "
                     "the store running at ",
                     options_.address, "?)"));
  }
  return Annotate(s, what);
}

template <typename Attempt>
absl::Status StoreClient::Retrying(absl::Time deadline, Attempt attempt) const {
  for (;;) {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    requests_.fetch_add(1, std::memory_order_relaxed);
    absl::Status s = FromGrpcStatus(attempt(&ctx));
    // UNAVAILABLE without the server's mark: the connection broke (or could
    // not be made) before an answer. With the mark it is the server's own
    // answer (its store closed), which a repeat would not change.
    if (s.ok() || !absl::IsUnavailable(s) || absl::Now() >= deadline ||
        ctx.GetServerTrailingMetadata().count(kStoreAnsweredKey) > 0) {
      return s;
    }
    absl::SleepFor(std::min(kRetryPause, deadline - absl::Now()));
  }
}

absl::Status StoreClient::Set(absl::string_view key, absl::string_view value) {
  const proto::SetRequest req = SetRequestFor(key, value);
  proto::SetResponse resp;
  absl::Status s = Retrying(absl::Now() + options_.call_timeout,
                            [&](grpc::ClientContext* ctx) { return stub_->Set(ctx, req, &resp); });
  return s.ok() ? s : Fail("set", key, s);
}

absl::StatusOr<std::string> StoreClient::Get(absl::string_view key, absl::Duration timeout) {
  const absl::Time start = absl::Now();
  proto::GetRequest req;
  req.set_key(std::string(key));
  proto::GetResponse resp;
  absl::Status s = Retrying(start + std::max(timeout, options_.call_timeout) + kServerSlack,
                            [&](grpc::ClientContext* ctx) {
                              // A repeat waits only for what is left of the caller's timeout.
                              req.set_timeout_ms(LeftMillis(timeout, start));
                              return stub_->Get(ctx, req, &resp);
                            });
  if (!s.ok()) return Fail("get", key, s);
  return std::move(*resp.mutable_value());
}

absl::StatusOr<int64_t> StoreClient::Add(absl::string_view key, int64_t delta) {
  proto::AddRequest req;
  req.set_key(std::string(key));
  req.set_delta(delta);
  // A repeat after a broken connection must not count twice.
  req.set_request_id(absl::StrCat(client_id_, ":", next_request_.fetch_add(1)));
  proto::AddResponse resp;
  absl::Status s = Retrying(absl::Now() + options_.call_timeout,
                            [&](grpc::ClientContext* ctx) { return stub_->Add(ctx, req, &resp); });
  if (!s.ok()) return Fail("add", key, s);
  return resp.value();
}

absl::StatusOr<std::string> StoreClient::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  // A repeat of a swap that was applied finds `desired` and answers it: the
  // caller sees that its value is in place, as the first answer would say.
  proto::CompareSetRequest req;
  req.set_key(std::string(key));
  req.set_expected(std::string(expected));
  req.set_desired(std::string(desired));
  proto::CompareSetResponse resp;
  absl::Status s = Retrying(absl::Now() + options_.call_timeout, [&](grpc::ClientContext* ctx) {
    return stub_->CompareSet(ctx, req, &resp);
  });
  if (!s.ok()) return Fail("compare_set", key, s);
  return std::move(*resp.mutable_value());
}

absl::Status StoreClient::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time start = absl::Now();
  proto::WaitRequest req;
  for (const auto& k : keys) req.add_keys(k);
  proto::WaitResponse resp;
  absl::Status s = Retrying(start + std::max(timeout, options_.call_timeout) + kServerSlack,
                            [&](grpc::ClientContext* ctx) {
                              req.set_timeout_ms(LeftMillis(timeout, start));
                              return stub_->Wait(ctx, req, &resp);
                            });
  return s.ok() ? s : Fail("wait", "", s);
}

absl::StatusOr<std::vector<std::string>> StoreClient::MultiGet(const std::vector<std::string>& keys,
                                                               absl::Duration timeout) {
  const absl::Time start = absl::Now();
  proto::MultiGetRequest req;
  for (const auto& k : keys) req.add_keys(k);
  proto::MultiGetResponse resp;
  absl::Status s = Retrying(start + std::max(timeout, options_.call_timeout) + kServerSlack,
                            [&](grpc::ClientContext* ctx) {
                              req.set_timeout_ms(LeftMillis(timeout, start));
                              return stub_->MultiGet(ctx, req, &resp);
                            });
  if (absl::IsUnimplemented(s)) {
    // A server older than the call (a separately run baton-store): one wait,
    // then a Get per key.
    return Store::MultiGet(keys, std::max(absl::ZeroDuration(), timeout - (absl::Now() - start)));
  }
  if (!s.ok()) return Fail("multi_get", keys.empty() ? "" : keys.front(), s);
  if (resp.values_size() != static_cast<int>(keys.size())) {
    return absl::DataLossError(absl::StrCat("store ", options_.address, ": multi_get of ",
                                            keys.size(), " keys answered ", resp.values_size(),
                                            " values"));
  }
  return std::vector<std::string>(std::make_move_iterator(resp.mutable_values()->begin()),
                                  std::make_move_iterator(resp.mutable_values()->end()));
}

absl::StatusOr<bool> StoreClient::Delete(absl::string_view key) {
  proto::DeleteRequest req;
  req.set_key(std::string(key));
  proto::DeleteResponse resp;
  absl::Status s = Retrying(absl::Now() + options_.call_timeout, [&](grpc::ClientContext* ctx) {
    return stub_->Delete(ctx, req, &resp);
  });
  if (!s.ok()) return Fail("delete", key, s);
  return resp.deleted();
}

absl::StatusOr<int64_t> StoreClient::NumKeys() {
  proto::NumKeysResponse resp;
  absl::Status s = Retrying(absl::Now() + options_.call_timeout, [&](grpc::ClientContext* ctx) {
    return stub_->NumKeys(ctx, proto::NumKeysRequest(), &resp);
  });
  if (!s.ok()) return Fail("num_keys", "", s);
  return resp.count();
}

absl::Status StoreClient::TrySet(absl::string_view key, absl::string_view value,
                                 absl::Duration deadline) {
  grpc::ClientContext ctx;
  PrepareFailFast(&ctx, deadline);
  requests_.fetch_add(1, std::memory_order_relaxed);
  proto::SetResponse resp;
  absl::Status s = FromGrpcStatus(stub_->Set(&ctx, SetRequestFor(key, value), &resp));
  return s.ok() ? s : Fail("set", key, s);
}

absl::StatusOr<std::string> StoreClient::TryGet(absl::string_view key, absl::Duration deadline) {
  grpc::ClientContext ctx;
  PrepareFailFast(&ctx, deadline);
  requests_.fetch_add(1, std::memory_order_relaxed);
  proto::GetRequest req;
  req.set_key(std::string(key));
  req.set_timeout_ms(0);
  proto::GetResponse resp;
  absl::Status s = FromGrpcStatus(stub_->Get(&ctx, req, &resp));
  if (!s.ok()) return Fail("get", key, s);
  return std::move(*resp.mutable_value());
}

absl::Status StoreClient::WaitForServer(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    grpc::ClientContext ctx;
    Prepare(&ctx, std::max(deadline, absl::Now() + absl::Milliseconds(1)));
    requests_.fetch_add(1, std::memory_order_relaxed);
    proto::NumKeysResponse resp;
    absl::Status s = FromGrpcStatus(stub_->NumKeys(&ctx, proto::NumKeysRequest(), &resp));
    if (s.ok()) return s;
    // A server that is shutting down (a previous round's) cancels calls;
    // keep trying until the deadline, the next one may be starting.
    const bool transient =
        s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kUnavailable;
    if (!transient || absl::Now() >= deadline) return Fail("connect", "", s);
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace baton::store
