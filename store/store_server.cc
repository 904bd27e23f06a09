#include "store/store_server.h"

#include <grpcpp/grpcpp.h>

#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_options.h"
#include "base/grpc_status.h"
#include "base/status.h"
#include "proto/store.grpc.pb.h"

namespace baton::store {
namespace {

absl::Duration TimeoutFor(grpc::ServerContext* ctx, int64_t timeout_ms) {
  absl::Duration t = timeout_ms < 0 ? absl::ZeroDuration() : absl::Milliseconds(timeout_ms);
  // Never wait past the caller's own deadline.
  const absl::Duration left = absl::FromChrono(ctx->deadline()) - absl::Now();
  return std::max(absl::ZeroDuration(), std::min(t, left));
}

}  // namespace

class StoreServer::Service final : public proto::Store::Service {
 public:
  Service(MemoryStore* store, std::string token) : store_(store), token_(std::move(token)) {}

  grpc::Status Set(grpc::ServerContext* ctx, const proto::SetRequest* req,
                   proto::SetResponse*) override {
    if (auto s = CheckToken(ctx); !s.ok()) return s;
    return ToGrpcStatus(store_->Set(req->key(), req->value()));
  }
  grpc::Status Get(grpc::ServerContext* ctx, const proto::GetRequest* req,
                   proto::GetResponse* resp) override {
    if (auto s = CheckToken(ctx); !s.ok()) return s;
    auto v = store_->Get(req->key(), TimeoutFor(ctx, req->timeout_ms()));
    if (!v.ok()) return ToGrpcStatus(v.status());
    resp->set_value(*std::move(v));
    return grpc::Status::OK;
  }
  grpc::Status Add(grpc::ServerContext* ctx, const proto::AddRequest* req,
                   proto::AddResponse* resp) override {
    if (auto s = CheckToken(ctx); !s.ok()) return s;
    if (req->request_id().empty()) {
      auto v = store_->Add(req->key(), req->delta());
      if (!v.ok()) return ToGrpcStatus(v.status());
      resp->set_value(*v);
      return grpc::Status::OK;
    }
    // A client's repeat of an Add whose answer it lost (StoreClient retries
    // after a broken connection) gets the first answer: a counter moves once.
    absl::MutexLock lock(&adds_mu_);
    auto seen = applied_adds_.find(req->request_id());
    if (seen != applied_adds_.end()) {
      resp->set_value(seen->second);
      return grpc::Status::OK;
    }
    auto v = store_->Add(req->key(), req->delta());
    if (!v.ok()) return ToGrpcStatus(v.status());
    applied_adds_.emplace(req->request_id(), *v);
    add_order_.push_back(req->request_id());
    if (add_order_.size() > kRememberedAdds) {
      applied_adds_.erase(add_order_.front());
      add_order_.pop_front();
    }
    resp->set_value(*v);
    return grpc::Status::OK;
  }
  grpc::Status CompareSet(grpc::ServerContext* ctx, const proto::CompareSetRequest* req,
                          proto::CompareSetResponse* resp) override {
    if (auto s = CheckToken(ctx); !s.ok()) return s;
    auto v = store_->CompareSet(req->key(), req->expected(), req->desired());
    if (!v.ok()) return ToGrpcStatus(v.status());
    resp->set_value(*std::move(v));
    return grpc::Status::OK;
  }
  grpc::Status Wait(grpc::ServerContext* ctx, const proto::WaitRequest* req,
                    proto::WaitResponse*) override {
    if (auto s = CheckToken(ctx); !s.ok()) return s;
    std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    return ToGrpcStatus(store_->Wait(keys, TimeoutFor(ctx, req->timeout_ms())));
  }
  grpc::Status MultiGet(grpc::ServerContext* ctx, const proto::MultiGetRequest* req,
                        proto::MultiGetResponse* resp) override {
    if (auto s = CheckToken(ctx); !s.ok()) return s;
    std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    auto values = store_->MultiGet(keys, TimeoutFor(ctx, req->timeout_ms()));
    if (!values.ok()) return ToGrpcStatus(values.status());
    for (std::string& v : *values) resp->add_values(std::move(v));
    return grpc::Status::OK;
  }
  grpc::Status Delete(grpc::ServerContext* ctx, const proto::DeleteRequest* req,
                      proto::DeleteResponse* resp) override {
    if (auto s = CheckToken(ctx); !s.ok()) return s;
    auto v = store_->Delete(req->key());
    if (!v.ok()) return ToGrpcStatus(v.status());
    resp->set_deleted(*v);
    return grpc::Status::OK;
  }
  grpc::Status NumKeys(grpc::ServerContext* ctx, const proto::NumKeysRequest*,
                       proto::NumKeysResponse* resp) override {
    if (auto s = CheckToken(ctx); !s.ok()) return s;
    auto v = store_->NumKeys();
    if (!v.ok()) return ToGrpcStatus(v.status());
    resp->set_count(*v);
    return grpc::Status::OK;
  }

 private:
  // Every handler starts here: its answer, whatever its status, says that
  // the server answered (kStoreAnsweredKey), so that a client tells this
  // server's UNAVAILABLE (its store closed) from a lost connection's.
  grpc::Status CheckToken(grpc::ServerContext* ctx) const {
    ctx->AddTrailingMetadata(kStoreAnsweredKey, "1");
    if (token_.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find(kTokenMetadataKey);
    if (it == md.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "store call without a job token (x-baton-token)");
    }
    if (absl::string_view(it->second.data(), it->second.size()) != token_) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "store call with a wrong job token");
    }
    return grpc::Status::OK;
  }

  MemoryStore* const store_;
  const std::string token_;
  // The answers of the last kRememberedAdds Adds that carried a request id,
  // oldest first in add_order_. A client repeats an Add only within its
  // partition tolerance, so a bounded memory is enough.
  static constexpr size_t kRememberedAdds = 1 << 16;
  absl::Mutex adds_mu_;
  absl::flat_hash_map<std::string, int64_t> applied_adds_ ABSL_GUARDED_BY(adds_mu_);
  std::deque<std::string> add_order_ ABSL_GUARDED_BY(adds_mu_);
};

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(StoreServerOptions options) {
  std::unique_ptr<StoreServer> server(new StoreServer());
  server->store_ = std::make_unique<MemoryStore>();
  server->service_ = std::make_unique<Service>(server->store_.get(), options.job_token);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, BatonServerCredentials(options.tls), &server->port_);
  builder.RegisterService(server->service_.get());
  ApplyBatonServerArguments(builder, 64 << 20);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("store server could not listen on ", options.address,
                                               " (address in use or not local?)"));
  }
  const auto colon = options.address.rfind(':');
  server->address_ = absl::StrCat(options.address.substr(0, colon), ":", server->port_);
  return server;
}

void StoreServer::Shutdown(absl::Duration grace) {
  if (server_ == nullptr) return;
  store_->Close();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  server_.reset();
}

StoreServer::~StoreServer() { Shutdown(); }

}  // namespace baton::store
