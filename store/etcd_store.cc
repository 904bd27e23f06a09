#include "store/etcd_store.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/grpc_options.h"
#include "base/grpc_status.h"
#include "base/status.h"
#include "base/status_macros.h"

namespace baton::store {
namespace {

// Between the attempts of a call that met UNAVAILABLE.
constexpr absl::Duration kRetryPause = absl::Milliseconds(100);

using etcdserverpb::Compare;
using etcdserverpb::RequestOp;

// A Txn's compare on `key`.
Compare CompareCreate(const std::string& key, int64_t create_revision) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::CREATE);
  c.set_result(Compare::EQUAL);
  c.set_create_revision(create_revision);
  return c;
}
Compare CompareMod(const std::string& key, int64_t mod_revision) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::MOD);
  c.set_result(Compare::EQUAL);
  c.set_mod_revision(mod_revision);
  return c;
}
Compare CompareValue(const std::string& key, absl::string_view value) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::VALUE);
  c.set_result(Compare::EQUAL);
  c.set_value(std::string(value));
  return c;
}
RequestOp RangeOp(const std::string& key) {
  RequestOp op;
  op.mutable_request_range()->set_key(key);
  return op;
}

// The end of the range of keys that start with `prefix`.
std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// The value of the single key a Txn's range op read, if it exists.
const etcdserverpb::KeyValue* RangeResult(const etcdserverpb::TxnResponse& r) {
  if (r.responses_size() == 0 || !r.responses(0).has_response_range()) return nullptr;
  const auto& range = r.responses(0).response_range();
  return range.kvs_size() == 0 ? nullptr : &range.kvs(0);
}

}  // namespace

EtcdStore::EtcdStore(EtcdStoreOptions options) : options_(std::move(options)) {
  channel_ = grpc::CreateCustomChannel(options_.endpoint, BatonChannelCredentials(options_.tls),
                                       BatonChannelArguments(64 << 20, options_.tls));
  kv_ = etcdserverpb::KV::NewStub(channel_);
  watch_ = etcdserverpb::Watch::NewStub(channel_);
  lease_ = etcdserverpb::Lease::NewStub(channel_);
  auth_ = etcdserverpb::Auth::NewStub(channel_);
}

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Connect(EtcdStoreOptions options) {
  if (options.endpoint.empty()) return absl::InvalidArgumentError("etcd: no endpoint");
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError("etcd: an empty key prefix would share keys across jobs");
  }
  std::unique_ptr<EtcdStore> store(new EtcdStore(std::move(options)));
  RETURN_IF_ERROR(store->WaitForEtcd());
  if (!store->options_.user.empty()) {
    RETURN_IF_ERROR(store->Authenticate());
  }
  if (store->options_.lease_ttl > absl::ZeroDuration()) {
    RETURN_IF_ERROR(store->JoinOrGrantLease(0));
    store->keepalive_ = std::thread([s = store.get()] { s->KeepAliveLoop(); });
  }
  return store;
}

EtcdStore::~EtcdStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (keepalive_ctx_ != nullptr) keepalive_ctx_->TryCancel();
  }
  if (keepalive_.joinable()) keepalive_.join();
}

int64_t EtcdStore::lease_id() const {
  absl::MutexLock lock(&mu_);
  return lease_id_;
}

absl::Status EtcdStore::RevokeLease() {
  int64_t job, session;
  {
    absl::MutexLock lock(&mu_);
    job = lease_id_;
    session = session_id_;
    stopping_ = true;
    if (keepalive_ctx_ != nullptr) keepalive_ctx_->TryCancel();
  }
  if (keepalive_.joinable()) keepalive_.join();
  absl::Status first;
  for (int64_t id : {job, session}) {
    if (id == 0) continue;
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(id);
    etcdserverpb::LeaseRevokeResponse resp;
    absl::Status s =
        Rpc("lease revoke", LeaseKey(), absl::Now() + options_.call_timeout,
            [&](grpc::ClientContext* c) { return lease_->LeaseRevoke(c, req, &resp); });
    if (first.ok()) first = s;
  }
  return first;
}

std::string EtcdStore::DataKey(absl::string_view key) const {
  return absl::StrCat(options_.prefix, "k/", key);
}
std::string EtcdStore::LeaseKey() const { return absl::StrCat(options_.prefix, "lease"); }

void EtcdStore::Prepare(grpc::ClientContext* ctx, absl::Time deadline) const {
  requests_.fetch_add(1, std::memory_order_relaxed);
  ctx->set_wait_for_ready(true);
  if (deadline != absl::InfiniteFuture()) ctx->set_deadline(absl::ToChronoTime(deadline));
  absl::MutexLock lock(&mu_);
  if (!token_.empty()) ctx->AddMetadata("token", token_);
}

absl::Status EtcdStore::Fail(const char* op, absl::string_view key, const absl::Status& s) const {
  std::string what = absl::StrCat("etcd ", options_.endpoint, ": ", op);
  if (!key.empty()) absl::StrAppend(&what, " '", key, "'");
  if (s.code() == absl::StatusCode::kDeadlineExceeded &&
      absl::StrContains(s.message(), "Deadline Exceeded")) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": no answer from etcd (is it running at ", options_.endpoint, "?)"));
  }
  return Annotate(s, what);
}

absl::Status EtcdStore::WaitForEtcd() {
  const absl::Time deadline =
      absl::Now() + (options_.connect_timeout > absl::ZeroDuration() ? options_.connect_timeout
                                                                     : options_.call_timeout);
  etcdserverpb::RangeRequest rq;
  rq.set_key(LeaseKey());
  rq.set_count_only(true);
  for (;;) {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    etcdserverpb::RangeResponse resp;
    const absl::Status s = FromGrpcStatus(kv_->Range(&ctx, rq, &resp));
    // Any answer but UNAVAILABLE (an authentication error included) says
    // that etcd is up; the calls that follow report their own errors.
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) return absl::OkStatus();
    if (absl::Now() >= deadline) return Fail("connect", "", s);
    absl::SleepFor(std::min(kRetryPause, deadline - absl::Now()));
  }
}

absl::Status EtcdStore::Authenticate() {
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  etcdserverpb::AuthenticateRequest req;
  req.set_name(options_.user);
  req.set_password(options_.password);
  etcdserverpb::AuthenticateResponse resp;
  absl::Status s = FromGrpcStatus(auth_->Authenticate(&ctx, req, &resp));
  if (!s.ok()) {
    return Fail("authenticate", "", Annotate(s, absl::StrCat("as user '", options_.user, "'")));
  }
  absl::MutexLock lock(&mu_);
  token_ = resp.token();
  return absl::OkStatus();
}

template <typename Call>
absl::Status EtcdStore::Rpc(const char* op, absl::string_view key, absl::Time deadline, Call call) {
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    absl::Status s = FromGrpcStatus(call(&ctx));
    // An expired auth token: authenticate again, once.
    if (s.code() == absl::StatusCode::kUnauthenticated && attempt == 0 && !options_.user.empty() &&
        Authenticate().ok()) {
      continue;
    }
    // A broken connection, or etcd without a leader: again, until the
    // deadline (a partition shorter than call_timeout only delays a call).
    if (absl::IsUnavailable(s) && absl::Now() < deadline) {
      absl::SleepFor(std::min(kRetryPause, deadline - absl::Now()));
      continue;
    }
    return s.ok() ? s : Fail(op, key, s);
  }
}

RequestOp EtcdStore::PutOp(const std::string& full_key, absl::string_view value) const {
  RequestOp op;
  auto* put = op.mutable_request_put();
  put->set_key(full_key);
  put->set_value(std::string(value));
  put->set_lease(lease_id());
  return op;
}

absl::StatusOr<int64_t> EtcdStore::KeepAliveOnce(int64_t id, absl::Time deadline) {
  grpc::ClientContext ctx;
  Prepare(&ctx, deadline);
  auto stream = lease_->LeaseKeepAlive(&ctx);
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(id);
  etcdserverpb::LeaseKeepAliveResponse resp;
  const bool ok = stream->Write(req) && stream->Read(&resp);
  stream->WritesDone();
  ctx.TryCancel();
  absl::Status s = FromGrpcStatus(stream->Finish());
  if (!ok) {
    return Fail("lease keep-alive", LeaseKey(),
                s.ok() || absl::IsCancelled(s) ? absl::UnavailableError("stream ended") : s);
  }
  return resp.ttl();
}

absl::Status EtcdStore::JoinOrGrantLease(int64_t dead) {
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  const std::string key = LeaseKey();
  for (int attempt = 0; attempt < 16; ++attempt) {
    etcdserverpb::RangeRequest rq;
    rq.set_key(key);
    etcdserverpb::RangeResponse current;
    absl::Status s = Rpc("range", key, deadline,
                         [&](grpc::ClientContext* c) { return kv_->Range(c, rq, &current); });
    if (!s.ok()) return s;
    int64_t stored = 0;
    if (current.kvs_size() > 0 && absl::SimpleAtoi(current.kvs(0).value(), &stored) &&
        stored != dead) {
      ASSIGN_OR_RETURN(auto ttl, KeepAliveOnce(stored, deadline));
      if (ttl > 0) {
        absl::MutexLock lock(&mu_);
        lease_id_ = stored;
        return absl::OkStatus();
      }
    }
    // None, or a dead one: grant a lease and store it unless another
    // process did first.
    etcdserverpb::LeaseGrantRequest grant;
    grant.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(options_.lease_ttl)));
    etcdserverpb::LeaseGrantResponse granted;
    s = Rpc("lease grant", key, deadline,
            [&](grpc::ClientContext* c) { return lease_->LeaseGrant(c, grant, &granted); });
    if (!s.ok()) return s;
    if (!granted.error().empty()) {
      return Fail("lease grant", key, absl::UnavailableError(granted.error()));
    }
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = current.kvs_size() > 0 ? CompareMod(key, current.kvs(0).mod_revision())
                                                : CompareCreate(key, 0);
    RequestOp put;
    put.mutable_request_put()->set_key(key);
    put.mutable_request_put()->set_value(absl::StrCat(granted.id()));
    put.mutable_request_put()->set_lease(granted.id());
    *txn.add_success() = put;
    etcdserverpb::TxnResponse done;
    s = Rpc("txn", key, deadline, [&](grpc::ClientContext* c) { return kv_->Txn(c, txn, &done); });
    if (!s.ok()) return s;
    if (done.succeeded()) {
      absl::MutexLock lock(&mu_);
      lease_id_ = granted.id();
      return absl::OkStatus();
    }
    // Another process stored its lease first: use that one.
    etcdserverpb::LeaseRevokeRequest revoke;
    revoke.set_id(granted.id());
    etcdserverpb::LeaseRevokeResponse revoked;
    (void)Rpc("lease revoke", key, deadline,
              [&](grpc::ClientContext* c) { return lease_->LeaseRevoke(c, revoke, &revoked); });
  }
  return Fail("lease", key, absl::AbortedError("the job's lease kept changing; gave up"));
}

void EtcdStore::KeepAliveLoop() {
  while (true) {
    grpc::ClientContext ctx;
    Prepare(&ctx, absl::InfiniteFuture());
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      keepalive_ctx_ = &ctx;
    }
    auto stream = lease_->LeaseKeepAlive(&ctx);
    bool expired = false;
    bool broken = false;
    while (!broken && !expired) {
      int64_t job, session;
      absl::Duration period = absl::Seconds(20);
      {
        absl::MutexLock lock(&mu_);
        job = lease_id_;
        session = session_id_;
        if (job != 0) period = std::min(period, options_.lease_ttl / 3);
        if (session != 0) period = std::min(period, session_ttl_ / 3);
      }
      for (int64_t id : {job, session}) {
        if (id == 0) continue;
        etcdserverpb::LeaseKeepAliveRequest req;
        req.set_id(id);
        etcdserverpb::LeaseKeepAliveResponse resp;
        if (!stream->Write(req) || !stream->Read(&resp)) {
          broken = true;
          break;
        }
        if (resp.ttl() > 0) continue;
        if (id == job) {
          expired = true;
        } else {
          // The session lapsed (this process was stopped too long): its keys
          // are gone; the owner learns it when it looks.
          absl::MutexLock lock(&mu_);
          if (session_id_ == id) session_id_ = 0;
        }
      }
      if (broken || expired) break;
      absl::MutexLock lock(&mu_);
      auto woken = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || session_new_; };
      mu_.AwaitWithTimeout(absl::Condition(&woken), std::max(absl::Milliseconds(100), period));
      session_new_ = false;
      if (stopping_) break;
    }
    ctx.TryCancel();
    (void)stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      keepalive_ctx_ = nullptr;
      if (stopping_) return;
    }
    // The job's lease expired (every process of the job was gone for its
    // TTL, or etcd lost it): grant the job a new one. A broken stream: open
    // another after a pause, bounded by the stop signal.
    if (expired) {
      (void)JoinOrGrantLease(lease_id());
      continue;
    }
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(200))) return;
  }
}

absl::StatusOr<bool> EtcdStore::CreateOnSession(absl::string_view key, absl::string_view value,
                                                absl::Duration ttl) {
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  const std::string full = DataKey(key);
  for (int attempt = 0;; ++attempt) {
    int64_t session;
    {
      absl::MutexLock lock(&mu_);
      session = session_id_;
    }
    if (session == 0) {
      etcdserverpb::LeaseGrantRequest grant;
      grant.set_ttl(std::max<int64_t>(2, absl::ToInt64Seconds(ttl)));
      etcdserverpb::LeaseGrantResponse granted;
      absl::Status s = Rpc("session lease", key, deadline, [&](grpc::ClientContext* c) {
        return lease_->LeaseGrant(c, grant, &granted);
      });
      if (!s.ok()) return s;
      if (!granted.error().empty()) {
        return Fail("session lease", key, absl::UnavailableError(granted.error()));
      }
      session = granted.id();
      absl::MutexLock lock(&mu_);
      session_id_ = session;
      session_ttl_ = absl::Seconds(granted.ttl());
      session_new_ = true;
      if (!keepalive_.joinable() && !stopping_) {
        keepalive_ = std::thread([this] { KeepAliveLoop(); });
      }
    }
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = CompareCreate(full, 0);
    RequestOp put;
    put.mutable_request_put()->set_key(full);
    put.mutable_request_put()->set_value(std::string(value));
    put.mutable_request_put()->set_lease(session);
    *txn.add_success() = put;
    etcdserverpb::TxnResponse done;
    absl::Status s = Rpc("create", key, deadline,
                         [&](grpc::ClientContext* c) { return kv_->Txn(c, txn, &done); });
    if (absl::IsNotFound(s) && attempt == 0) {
      // The session lapsed (this process was stopped past its TTL): begin a
      // new one.
      absl::MutexLock lock(&mu_);
      if (session_id_ == session) session_id_ = 0;
      continue;
    }
    if (!s.ok()) return s;
    return done.succeeded();
  }
}

absl::Status EtcdStore::PutWithLease(const std::string& full_key, absl::string_view value,
                                     absl::Time deadline) {
  for (int attempt = 0;; ++attempt) {
    etcdserverpb::PutRequest req;
    req.set_key(full_key);
    req.set_value(std::string(value));
    req.set_lease(lease_id());
    etcdserverpb::PutResponse resp;
    absl::Status s = Rpc("put", full_key, deadline,
                         [&](grpc::ClientContext* c) { return kv_->Put(c, req, &resp); });
    // "requested lease not found": the job's lease expired; renew it once.
    if (absl::IsNotFound(s) && attempt == 0 && req.lease() != 0) {
      RETURN_IF_ERROR(JoinOrGrantLease(req.lease()));
      continue;
    }
    return s;
  }
}

absl::Status EtcdStore::Set(absl::string_view key, absl::string_view value) {
  return PutWithLease(DataKey(key), value, absl::Now() + options_.call_timeout);
}

absl::StatusOr<std::vector<std::optional<std::string>>> EtcdStore::ReadKeys(
    const std::vector<std::string>& full_keys, int64_t* revision) {
  // etcd's default --max-txn-ops.
  constexpr size_t kOpsPerTxn = 128;
  std::vector<std::optional<std::string>> values(full_keys.size());
  *revision = std::numeric_limits<int64_t>::max();
  for (size_t begin = 0; begin < full_keys.size(); begin += kOpsPerTxn) {
    const size_t end = std::min(full_keys.size(), begin + kOpsPerTxn);
    etcdserverpb::TxnRequest txn;  // no compare: the success ops run
    for (size_t i = begin; i < end; ++i) *txn.add_success() = RangeOp(full_keys[i]);
    etcdserverpb::TxnResponse done;
    RETURN_IF_ERROR(Rpc("read", full_keys[begin], absl::Now() + options_.call_timeout,
                        [&](grpc::ClientContext* c) { return kv_->Txn(c, txn, &done); }));
    *revision = std::min(*revision, done.header().revision());
    for (size_t i = begin; i < end; ++i) {
      const auto& op = done.responses(static_cast<int>(i - begin));
      if (op.has_response_range() && op.response_range().kvs_size() > 0) {
        values[i] = op.response_range().kvs(0).value();
      }
    }
  }
  return values;
}

absl::StatusOr<EtcdStore::Awaited> EtcdStore::AwaitKeys(const std::vector<std::string>& keys,
                                                        absl::Time deadline) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(DataKey(k));
  Awaited out;
  while (true) {
    int64_t revision = 0;
    ASSIGN_OR_RETURN(auto read, ReadKeys(full, &revision));
    out.values = std::move(read);
    out.missing.clear();
    for (size_t i = 0; i < full.size(); ++i) {
      if (!out.values[i].has_value()) out.missing.push_back(i);
    }
    if (out.missing.empty() || absl::Now() >= deadline) return out;
    // One watch over the range the missing keys share, from just after the
    // read: a put in between is an event.
    std::string lo = full[out.missing[0]];
    for (size_t i : out.missing) {
      size_t n = 0;
      while (n < lo.size() && n < full[i].size() && lo[n] == full[i][n]) ++n;
      lo.resize(n);
    }
    grpc::ClientContext ctx;
    Prepare(&ctx, deadline);
    auto stream = watch_->Watch(&ctx);
    etcdserverpb::WatchRequest create;
    auto* cr = create.mutable_create_request();
    if (out.missing.size() == 1) {
      cr->set_key(full[out.missing[0]]);
    } else {
      cr->set_key(lo);
      cr->set_range_end(PrefixEnd(lo));
    }
    cr->set_start_revision(revision + 1);
    std::set<size_t> waiting(out.missing.begin(), out.missing.end());
    std::map<std::string, size_t> index;
    for (size_t i : out.missing) index.emplace(full[i], i);
    bool compacted = false;
    // Counted from after the read: the watch starts at the revision after
    // it, so whatever is set from now on reaches this call.
    waiting_.fetch_add(1, std::memory_order_acq_rel);
    if (stream->Write(create)) {
      etcdserverpb::WatchResponse resp;
      while (!waiting.empty() && stream->Read(&resp)) {
        if (resp.canceled()) {
          compacted = resp.compact_revision() > 0;
          break;
        }
        for (const auto& e : resp.events()) {
          if (e.type() != etcdserverpb::Event::PUT) continue;
          auto it = index.find(e.kv().key());
          if (it == index.end()) continue;
          out.values[it->second] = e.kv().value();
          waiting.erase(it->second);
        }
      }
    }
    waiting_.fetch_sub(1, std::memory_order_acq_rel);
    ctx.TryCancel();
    const absl::Status ended = FromGrpcStatus(stream->Finish());
    if (waiting.empty()) {
      out.missing.clear();
      return out;
    }
    if (compacted) continue;  // the revision was compacted away: read again
    out.missing.assign(waiting.begin(), waiting.end());
    if (absl::Now() >= deadline) return out;
    if (!ended.ok() && !absl::IsCancelled(ended) && !absl::IsDeadlineExceeded(ended)) {
      return Fail("watch", keys[out.missing[0]], ended);
    }
  }
}

absl::StatusOr<std::string> EtcdStore::Get(absl::string_view key, absl::Duration timeout) {
  const absl::Time deadline = timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + std::max(timeout, absl::ZeroDuration());
  ASSIGN_OR_RETURN(auto got, AwaitKeys({std::string(key)}, deadline));
  if (got.missing.empty()) return *std::move(got.values[0]);
  return absl::DeadlineExceededError(absl::StrCat("etcd ", options_.endpoint, ": key '", key,
                                                  "' not set within ",
                                                  absl::FormatDuration(timeout)));
}

absl::StatusOr<int64_t> EtcdStore::Add(absl::string_view key, int64_t delta) {
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  const std::string full = DataKey(key);
  while (true) {
    etcdserverpb::RangeRequest rq;
    rq.set_key(full);
    etcdserverpb::RangeResponse current;
    absl::Status s = Rpc("add", key, deadline,
                         [&](grpc::ClientContext* c) { return kv_->Range(c, rq, &current); });
    if (!s.ok()) return s;
    int64_t value = 0;
    if (current.kvs_size() > 0 && !absl::SimpleAtoi(current.kvs(0).value(), &value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd: add '", key, "': value '", current.kvs(0).value(), "' is not an integer"));
    }
    if ((delta > 0 && value > std::numeric_limits<int64_t>::max() - delta) ||
        (delta < 0 && value < std::numeric_limits<int64_t>::min() - delta)) {
      return absl::OutOfRangeError(absl::StrCat("etcd: add '", key, "': ", value, " + ", delta,
                                                " overflows a 64-bit counter"));
    }
    const int64_t next = value + delta;
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = current.kvs_size() > 0 ? CompareMod(full, current.kvs(0).mod_revision())
                                                : CompareCreate(full, 0);
    *txn.add_success() = PutOp(full, absl::StrCat(next));
    etcdserverpb::TxnResponse done;
    s = Rpc("add", key, deadline, [&](grpc::ClientContext* c) { return kv_->Txn(c, txn, &done); });
    if (absl::IsNotFound(s) && lease_id() != 0) {  // the lease expired
      RETURN_IF_ERROR(JoinOrGrantLease(lease_id()));
      continue;
    }
    if (!s.ok()) return s;
    if (done.succeeded()) return next;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("etcd: add '", key, "': the counter kept changing under contention"));
    }
  }
}

absl::StatusOr<std::string> EtcdStore::CompareSet(absl::string_view key, absl::string_view expected,
                                                  absl::string_view desired) {
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  const std::string full = DataKey(key);
  while (true) {
    // A value compare never matches a missing key (etcd), so an empty
    // `expected` also tries "missing" below.
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = CompareValue(full, expected);
    *txn.add_success() = PutOp(full, desired);
    *txn.add_failure() = RangeOp(full);
    etcdserverpb::TxnResponse done;
    absl::Status s = Rpc("compare-set", key, deadline,
                         [&](grpc::ClientContext* c) { return kv_->Txn(c, txn, &done); });
    if (absl::IsNotFound(s) && lease_id() != 0) {
      RETURN_IF_ERROR(JoinOrGrantLease(lease_id()));
      continue;
    }
    if (!s.ok()) return s;
    if (done.succeeded()) return std::string(desired);
    if (const etcdserverpb::KeyValue* kv = RangeResult(done); kv != nullptr) {
      return std::string(kv->value());
    }
    if (!expected.empty()) return std::string();  // missing, and `expected` wanted a value
    etcdserverpb::TxnRequest create;
    *create.add_compare() = CompareCreate(full, 0);
    *create.add_success() = PutOp(full, desired);
    *create.add_failure() = RangeOp(full);
    s = Rpc("compare-set", key, deadline,
            [&](grpc::ClientContext* c) { return kv_->Txn(c, create, &done); });
    if (!s.ok()) return s;
    if (done.succeeded()) return std::string(desired);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("etcd: compare-set '", key, "': the key kept changing under contention"));
    }
    // Created by someone else in between: compare against it.
  }
}

absl::StatusOr<std::vector<std::string>> EtcdStore::MultiGet(const std::vector<std::string>& keys,
                                                             absl::Duration timeout) {
  ASSIGN_OR_RETURN(auto got,
                   AwaitKeys(keys, absl::Now() + std::max(timeout, absl::ZeroDuration())));
  if (!got.missing.empty()) {
    std::vector<std::string> missing;
    for (size_t i : got.missing) missing.push_back(keys[i]);
    return absl::DeadlineExceededError(absl::StrCat(
        "etcd ", options_.endpoint, ": waited ", absl::FormatDuration(timeout), " for keys; ",
        missing.size(), " of ", keys.size(), " missing: '", absl::StrJoin(missing, "', '"), "'"));
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (auto& v : got.values) values.push_back(*std::move(v));
  return values;
}

absl::Status EtcdStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return MultiGet(keys, timeout).status();
}

absl::StatusOr<bool> EtcdStore::Delete(absl::string_view key) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(DataKey(key));
  etcdserverpb::DeleteRangeResponse resp;
  RETURN_IF_ERROR(Rpc("delete", key, absl::Now() + options_.call_timeout,
                      [&](grpc::ClientContext* c) { return kv_->DeleteRange(c, req, &resp); }));
  return resp.deleted() > 0;
}

absl::StatusOr<int64_t> EtcdStore::NumKeys() {
  const std::string start = DataKey("");
  etcdserverpb::RangeRequest req;
  req.set_key(start);
  req.set_range_end(PrefixEnd(start));
  req.set_count_only(true);
  etcdserverpb::RangeResponse resp;
  RETURN_IF_ERROR(Rpc("count", "", absl::Now() + options_.call_timeout,
                      [&](grpc::ClientContext* c) { return kv_->Range(c, req, &resp); }));
  return resp.count();
}

}  // namespace baton::store
