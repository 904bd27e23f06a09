#include "rpc/transport/grpc/grpc_transport.h"

#include <algorithm>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/grpc_options.h"
#include "base/grpc_status.h"
#include "base/status.h"
#include "base/status_macros.h"
#include "rpc/transport/grpc/outbox.h"

namespace baton::rpc::internal {
namespace {

// A server stream stops reading requests while more than this many reply
// bytes wait to be written (a caller that sends but does not read its
// replies), and reads again once half of it is written: the stream's
// memory stays bounded and gRPC's flow control holds the caller back.
constexpr size_t kMaxQueuedReplyBytes = size_t{64} << 20;

}  // namespace

namespace {

// The live server streams bound to each caller id. The unread-reply bound
// (kMaxQueuedReplyBytes) holds per caller: each of a caller's n streams may
// hold 1/n of it, so opening more streams gains a caller nothing.
class CallerStreams {
 public:
  void Add(int caller) {
    absl::MutexLock lock(&mu_);
    ++count_[caller];
  }
  void Remove(int caller) {
    absl::MutexLock lock(&mu_);
    auto it = count_.find(caller);
    if (it != count_.end() && --it->second == 0) count_.erase(it);
  }
  // What one stream of `caller` may leave unread.
  size_t ReplyBudget(int caller) const {
    absl::MutexLock lock(&mu_);
    auto it = count_.find(caller);
    const int n = it == count_.end() ? 1 : std::max(1, it->second);
    return kMaxQueuedReplyBytes / static_cast<size_t>(n);
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, int> count_ ABSL_GUARDED_BY(mu_);
};

// Hands `frame` to `deliver` once the blobs it names on the bulk channel
// arrived (B6, rpc/channel/tcp/bulk_channel.h), at once if they already
// did, else on the channel's thread; or its error to `fail` if they cannot
// arrive. The stream reads on meanwhile: later frames may pass this one.
// The callbacks and pointers are taken by reference: the retry lambda holds
// its own copies, and a copy of a std::function that captures a shared_ptr is
// an allocation.
void DeliverWithBlobs(BulkChannel* bulk, int peer, const std::shared_ptr<Frame>& frame,
                      const std::function<void(Frame)>& deliver,
                      const std::function<void(const absl::Status&)>& fail,
                      const std::shared_ptr<uint64_t>& wait_epoch = std::make_shared<uint64_t>(0)) {
  absl::StatusOr<bool> got =
      bulk == nullptr ? absl::DataLossError(
                            "a frame names bulk-channel blobs but this worker has no bulk channel")
                      : bulk->Import(
                            peer, *frame,
                            [bulk, peer, frame, deliver, fail, wait_epoch] {
                              DeliverWithBlobs(bulk, peer, frame, deliver, fail, wait_epoch);
                            },
                            wait_epoch.get());
  if (!got.ok()) {
    fail(got.status());
  } else if (*got) {
    deliver(std::move(*frame));
  }
}

// The reply to a request, or what stands for a response, whose bulk blobs
// did not arrive: the call fails with it (a request: before it ran).
Frame LostBlobsResponse(uint64_t id, const absl::Status& cause, bool request) {
  Frame f;
  f.header.set_kind(proto::FrameHeader::RESPONSE);
  f.header.set_id(id);
  f.header.set_status_code(static_cast<int>(
      absl::IsDataLoss(cause) ? absl::StatusCode::kDataLoss : absl::StatusCode::kUnavailable));
  f.header.set_error_message(
      absl::StrCat(request ? "the request's" : "the reply's",
                   " tensors did not arrive on the bulk channel: ", cause.message()));
  f.header.set_not_run(request);
  return f;
}

// The transport's bulk channel, on the host it listens on, with its job
// token, limits and partition tolerance; hellos are checked by the
// handler's stream authenticator.
absl::StatusOr<std::unique_ptr<BulkChannel>> StartBulkChannel(const TransportOptions& options,
                                                              TransportHandler* handler) {
  BulkChannelOptions bulk;
  const std::string& la = options.listen_address;
  bulk.host = la.substr(0, la.rfind(':'));
  if (bulk.host.size() >= 2 && bulk.host.front() == '[') {
    bulk.host = bulk.host.substr(1, bulk.host.size() - 2);
  }
  bulk.job_token = options.job_token;
  bulk.min_bytes = options.bulk_min_bytes;
  bulk.lanes = options.bulk_lanes;
  bulk.max_blob_bytes = static_cast<uint64_t>(options.max_message_bytes);
  bulk.unclaimed_budget = static_cast<uint64_t>(options.max_message_bytes);
  bulk.silence_timeout = options.silence_timeout;
  bulk.tls = options.tls;
  bulk.log = options.log.Child("bulk channel");
  return BulkChannel::Start(bulk, [handler](const std::string& identity) {
    // The authenticator answers through a callback; this is the channel's
    // own reader thread, which may wait for it. The answer may come after
    // the wait gave up: it lands in shared state.
    struct Answer {
      absl::Notification done;
      absl::StatusOr<int> bound;
    };
    auto answer = std::make_shared<Answer>();
    handler->AuthenticateStream(identity, [answer](absl::StatusOr<int> b) {
      answer->bound = std::move(b);
      answer->done.Notify();
    });
    if (!answer->done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
      return absl::StatusOr<int>(absl::DeadlineExceededError("authentication timed out"));
    }
    return answer->bound;
  });
}

// Finishes a stream that failed the token check.
class RejectReactor : public grpc::ServerGenericBidiReactor {
 public:
  explicit RejectReactor(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// One incoming stream: reads request packets, hands frames to the handler,
// writes replies through its outbox.
class ServerStream : public grpc::ServerGenericBidiReactor {
 public:
  ServerStream(TransportHandler* handler, std::shared_ptr<CallerStreams> callers, BulkChannel* bulk,
               absl::string_view identity)
      : handler_(handler), callers_(std::move(callers)), bulk_(bulk) {
    sink_ = std::make_shared<Sink>();
    sink_->bulk = bulk;
    auto outbox =
        std::make_unique<Outbox>([this](const grpc::ByteBuffer* b) { StartWrite(b); },
                                 [this] { Finish(finish_status_); }, [this] { StartRead(&in_); });
    outbox_ = outbox.get();
    {
      absl::MutexLock lock(&sink_->mu);
      sink_->outbox = std::move(outbox);
    }
    // No operation is started before the answer, so the stream cannot be
    // done (OnDone) while the handler holds `this`.
    handler_->AuthenticateStream(identity,
                                 [this](absl::StatusOr<int> bound) { OnAuthenticated(bound); });
  }

  void OnAuthenticated(const absl::StatusOr<int>& bound) {
    if (!bound.ok()) {
      finish_status_ = ToGrpcStatus(bound.status());
      outbox_->Close();
      return;
    }
    if (*bound >= 0) {
      caller_.store(*bound, std::memory_order_relaxed);
      sink_->caller.store(*bound, std::memory_order_relaxed);
      callers_->Add(*bound);
    }
    // The caller learns that the stream was accepted from these metadata
    // (before them, it knows that nothing it sent was read: P8), so no
    // frame is read before they left.
    StartSendInitialMetadata();
  }

  void OnSendInitialMetadataDone(bool ok) override {
    if (!ok) {
      outbox_->Close();
      return;
    }
    StartRead(&in_);
  }

  // The reactions below run before OnDone(), the only place the sink lets
  // go of the outbox, so outbox_ is valid in them without the sink's lock.
  void OnReadDone(bool ok) override {
    if (!ok) {
      outbox_->Close();
      return;
    }
    std::vector<Frame> frames;
    absl::Status s = ParsePacket(&in_, PacketSource::kGrpc, &frames);
    in_.Clear();
    if (!s.ok()) {
      // The peer speaks something else; drop the stream rather than guess,
      // and tell it why. (Written before Close(): the outbox's lock orders
      // it before the finish callback reads it.)
      finish_status_ = grpc::Status(
          grpc::StatusCode::DATA_LOSS,
          absl::StrCat("baton: malformed packet, stream closed: ", s.message().substr(0, 1024)));
      outbox_->Close();
      return;
    }
    // A stream is bound to the caller id its first request claims: flow
    // control counts requests per caller (F2), so a stream must not spread
    // its requests over other callers' room.
    for (auto& f : frames) {
      int bound = -1;
      const int claimed = f.header.caller_id();
      if (caller_.compare_exchange_strong(bound, claimed, std::memory_order_relaxed)) {
        sink_->caller.store(claimed, std::memory_order_relaxed);
        callers_->Add(claimed);
      } else if (bound != claimed) {
        finish_status_ = grpc::Status(
            grpc::StatusCode::PERMISSION_DENIED,
            absl::StrCat("baton: a request claims caller id ", claimed,
                         " on a stream bound to caller id ", bound, "; stream closed"));
        outbox_->Close();
        return;
      }
      if (f.header.tcp_blobs_size() > 0) {
        const uint64_t id = f.header.id();
        TransportHandler* handler = handler_;
        std::shared_ptr<Sink> sink = sink_;
        DeliverWithBlobs(
            bulk_, claimed, std::make_shared<Frame>(std::move(f)),
            [handler, sink](Frame g) { handler->OnRequest(sink, std::move(g)); },
            [sink, id](const absl::Status& cause) {
              sink->Send(LostBlobsResponse(id, cause, /*request=*/true));
            });
        continue;
      }
      handler_->OnRequest(sink_, std::move(f));
    }
    // A caller that does not read its replies gets no more requests read;
    // the outbox resumes reading once its replies drain. The bound holds
    // per caller, shared among its streams.
    const int caller = caller_.load(std::memory_order_relaxed);
    if (outbox_->PauseReadsIfOver(caller >= 0 ? callers_->ReplyBudget(caller)
                                              : kMaxQueuedReplyBytes)) {
      return;
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }

  // The caller's end went away without closing the stream: it died, its
  // host did, or it cancelled at a non-graceful shutdown.
  void OnCancel() override {
    const int caller = caller_.load(std::memory_order_relaxed);
    if (caller >= 0) {
      handler_->OnPeerLost(caller, absl::UnavailableError(absl::StrCat("the stream from worker ",
                                                                       caller, " was cancelled")));
    }
  }

  void OnDone() override {
    const int caller = caller_.load(std::memory_order_relaxed);
    if (caller >= 0) callers_->Remove(caller);
    sink_->Detach();
    delete this;
  }

 private:
  struct Sink : ReplyChannel {
    bool Send(Frame frame) override {
      const int to = caller.load(std::memory_order_relaxed);
      if (bulk != nullptr && to >= 0) bulk->Export(to, frame);
      std::vector<grpc::Slice> slices;
      const size_t bytes = AppendFrame(std::move(frame), &slices);
      absl::MutexLock lock(&mu);
      if (outbox == nullptr) return false;
      // The outbox outlives this call: Detach() takes mu.
      return outbox->Send(std::move(slices), bytes);
    }
    void Detach() {
      std::unique_ptr<Outbox> dead;
      absl::MutexLock lock(&mu);
      dead = std::move(outbox);
    }
    absl::Mutex mu;
    std::unique_ptr<Outbox> outbox ABSL_GUARDED_BY(mu);
    // The transport's; it stays until every stream's outbox is detached
    // (StopServer), and closed it lets Export do nothing.
    BulkChannel* bulk = nullptr;
    std::atomic<int> caller{-1};  // the stream's, once bound
  };

  TransportHandler* const handler_;
  const std::shared_ptr<CallerStreams> callers_;
  BulkChannel* const bulk_;  // null: none
  std::shared_ptr<Sink> sink_;
  Outbox* outbox_ = nullptr;  // owned by sink_ until OnDone()
  grpc::ByteBuffer in_;
  std::atomic<int> caller_{-1};  // bound by the first request's caller id
  // How the stream ends: OK after the caller's half-close, DATA_LOSS
  // naming the problem after a malformed packet.
  grpc::Status finish_status_ = grpc::Status::OK;
};

}  // namespace

// One outgoing stream to a peer.
class ClientStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                     public std::enable_shared_from_this<ClientStream> {
 public:
  // (peer, stream id, cause, whether the peer accepted the stream).
  using DoneFn = std::function<void(int, uint64_t, const absl::Status&, bool)>;

  ClientStream(TransportHandler* handler, BulkChannel* bulk, int peer, uint64_t id, DoneFn done)
      : handler_(handler), bulk_(bulk), peer_(peer), id_(id), done_(std::move(done)) {
    outbox_ = std::make_unique<Outbox>([this](const grpc::ByteBuffer* b) { StartWrite(b); },
                                       [this] {
                                         StartWritesDone();
                                         RemoveHold();
                                       });
  }

  // `wait_for_link`: the stream waits for the connection to come back
  // (a partition), instead of ending when it cannot be made now.
  void Start(grpc::GenericStub* stub, const std::string& token, const std::string& identity,
             bool wait_for_link) {
    self_ = shared_from_this();
    ctx_.set_wait_for_ready(wait_for_link);
    if (!token.empty()) ctx_.AddMetadata(kTokenMetadataKey, token);
    if (!identity.empty()) ctx_.AddMetadata(kIdentityMetadataKey, identity);
    stub->PrepareBidiStreamingCall(&ctx_, kStreamMethod, grpc::StubOptions(), this);
    AddHold();  // released by the outbox once no write can start
    StartRead(&in_);
    StartCall();
  }

  // True when the frame is this stream's to deliver or to account for:
  // written or queued, or refused by an outbox that closed while the stream
  // has not reported its end yet (the ending, OnStreamClosed or
  // OnStreamRefused with the real cause, covers the frame: a refused token
  // closes the outbox before OnDone brings UNAUTHENTICATED). False once the
  // end was reported; `*ended` is then its cause.
  bool Send(std::vector<grpc::Slice> slices, size_t bytes, absl::Status* ended) {
    if (outbox_->Send(std::move(slices), bytes)) return true;
    absl::MutexLock lock(&end_mu_);
    if (!end_reported_) return true;
    *ended = end_cause_;
    return false;
  }
  void Close(bool cancel) {
    outbox_->Close();
    if (cancel) ctx_.TryCancel();
  }
  uint64_t id() const { return id_; }

  void OnReadDone(bool ok) override {
    if (!ok) {
      outbox_->Close();
      return;
    }
    std::vector<Frame> frames;
    absl::Status s = ParsePacket(&in_, PacketSource::kGrpc, &frames);
    in_.Clear();
    if (!s.ok()) {
      parse_error_ = s;
      outbox_->Close();
      ctx_.TryCancel();
      return;
    }
    for (auto& f : frames) {
      if (f.header.tcp_blobs_size() > 0) {
        const uint64_t id = f.header.id();
        TransportHandler* handler = handler_;
        const int peer = peer_;
        DeliverWithBlobs(
            bulk_, peer, std::make_shared<Frame>(std::move(f)),
            [handler, peer](Frame g) { handler->OnResponse(peer, std::move(g)); },
            [handler, peer, id](const absl::Status& cause) {
              handler->OnResponse(peer, LostBlobsResponse(id, cause, /*request=*/false));
            });
        continue;
      }
      handler_->OnResponse(peer_, std::move(f));
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }

  // The server sends its metadata once it accepted the stream, before it
  // reads any frame.
  void OnReadInitialMetadataDone(bool ok) override { accepted_ = ok; }

  void OnDone(const grpc::Status& status) override {
    absl::Status cause = parse_error_.ok() ? FromGrpcStatus(status) : parse_error_;
    if (cause.ok()) cause = absl::UnavailableError("stream closed");
    {
      // Before the report: a Send() that sees the end not reported yet can
      // count on it.
      absl::MutexLock lock(&end_mu_);
      end_reported_ = true;
      end_cause_ = cause;
    }
    // Every reaction ran before OnDone: accepted_ is final.
    done_(peer_, id_, cause, accepted_);
    self_.reset();  // may delete this
  }

 private:
  TransportHandler* const handler_;
  BulkChannel* const bulk_;  // the transport's (null: none)
  const int peer_;
  const uint64_t id_;
  const DoneFn done_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer in_;
  std::unique_ptr<Outbox> outbox_;
  absl::Status parse_error_;
  bool accepted_ = false;
  absl::Mutex end_mu_;
  bool end_reported_ ABSL_GUARDED_BY(end_mu_) = false;
  absl::Status end_cause_ ABSL_GUARDED_BY(end_mu_);
  std::shared_ptr<ClientStream> self_;
};

// What the outgoing streams report to, and what outlives the transport:
// how many stream objects are not destroyed yet (their ClientContexts hold
// the channels), and the transport their done callbacks reach (null once it
// retired them).
class ClientStreamLifetimes {
 public:
  explicit ClientStreamLifetimes(GrpcTransport* owner) : owner_(owner) {}

  void Created() {
    absl::MutexLock lock(&mu_);
    ++objects_;
  }
  // After the stream object was deleted, its ClientContext included.
  void Destroyed() {
    absl::MutexLock lock(&mu_);
    --objects_;
  }

  // Runs fn(owner) without the lock held, unless the owner retired; Retire
  // waits for it to return.
  template <typename Fn>
  void WithOwner(Fn fn) {
    GrpcTransport* owner = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (owner_ == nullptr) return;
      owner = owner_;
      ++in_done_;
    }
    fn(owner);
    absl::MutexLock lock(&mu_);
    --in_done_;
  }

  // Waits at most `timeout` for every stream object to be destroyed and
  // every done callback to return, then detaches the owner. Returns how many
  // stream objects are left (0: every one is gone).
  int Retire(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto all_gone = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return objects_ == 0 && in_done_ == 0;
    };
    mu_.AwaitWithTimeout(absl::Condition(&all_gone), timeout);
    owner_ = nullptr;
    return objects_ + in_done_;
  }

 private:
  absl::Mutex mu_;
  GrpcTransport* owner_ ABSL_GUARDED_BY(mu_);
  int objects_ ABSL_GUARDED_BY(mu_) = 0;
  int in_done_ ABSL_GUARDED_BY(mu_) = 0;
};

class GrpcTransport::Service : public grpc::CallbackGenericService {
 public:
  Service(TransportHandler* handler, std::string token)
      : handler_(handler), token_(std::move(token)) {}
  // Before the server starts.
  void set_bulk(BulkChannel* bulk) { bulk_ = bulk; }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    if (ctx->method() != kStreamMethod) {
      return new RejectReactor(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                            absl::StrCat("baton serves only ", kStreamMethod)));
    }
    if (!token_.empty()) {
      const auto& md = ctx->client_metadata();
      auto it = md.find(kTokenMetadataKey);
      if (it == md.end() || absl::string_view(it->second.data(), it->second.size()) != token_) {
        return new RejectReactor(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                              it == md.end()
                                                  ? "call without a job token (x-baton-token)"
                                                  : "call with a wrong job token"));
      }
    }
    const auto& md = ctx->client_metadata();
    auto id = md.find(kIdentityMetadataKey);
    return new ServerStream(handler_, callers_, bulk_,
                            id == md.end()
                                ? absl::string_view()
                                : absl::string_view(id->second.data(), id->second.size()));
  }

 private:
  TransportHandler* const handler_;
  const std::string token_;
  const std::shared_ptr<CallerStreams> callers_ = std::make_shared<CallerStreams>();
  BulkChannel* bulk_ = nullptr;
};

GrpcTransport::GrpcTransport(TransportOptions options, TransportHandler* handler)
    : options_(std::move(options)),
      handler_(handler),
      lifetimes_(std::make_shared<ClientStreamLifetimes>(this)) {}

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Start(TransportOptions options,
                                                                    TransportHandler* handler) {
  std::unique_ptr<GrpcTransport> t(new GrpcTransport(std::move(options), handler));
  t->service_ = std::make_unique<Service>(handler, t->options_.job_token);
  if (t->options_.bulk_channel) {
    // Under TLS the channel's connections are TLS too (B9).
    ASSIGN_OR_RETURN(auto channel, StartBulkChannel(t->options_, handler));
    t->bulk_ = std::move(channel);
    t->service_->set_bulk(t->bulk_.get());
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(t->options_.listen_address, BatonServerCredentials(t->options_.tls),
                           &port);
  builder.RegisterCallbackGenericService(t->service_.get());
  ApplyBatonServerArguments(builder, t->options_.max_message_bytes + (1 << 20));
  t->server_ = builder.BuildAndStart();
  if (t->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("rpc server could not listen on ", t->options_.listen_address));
  }
  const std::string& la = t->options_.listen_address;
  t->address_ = absl::StrCat(la.substr(0, la.rfind(':')), ":", port);
  return t;
}

GrpcTransport::~GrpcTransport() {
  (void)CloseStreams(/*cancel=*/true, absl::Seconds(5));
  StopServer(absl::ZeroDuration());
  // A stream's OnDone (a reaction thread) deletes it after its done callback
  // returned, and its ClientContext holds the channel: the channels are
  // released here, on this thread, only once every stream object is gone.
  const int left = lifetimes_->Retire(absl::Seconds(5));
  if (left == 0) return;
  options_.log.Warning(absl::StrCat(left, " outgoing gRPC stream(s) of the transport at ", address_,
                                    " still alive at its destruction; their channels are kept, "
                                    "never released"));
  absl::MutexLock lock(&mu_);
  auto* kept = new std::vector<Peer>();  // deliberately never freed
  for (auto& [id, p] : peers_) kept->push_back(std::move(p));
  for (auto& p : retired_) kept->push_back(std::move(p));
  peers_.clear();
  retired_.clear();
}

void GrpcTransport::AddPeer(int id, const std::string& address, const std::string& identity) {
  absl::MutexLock lock(&mu_);
  Peer& p = peers_[id];
  if (!p.address.empty()) {
    if (p.address == address && p.identity == identity) return;
    retired_.push_back(std::move(p));
    p = Peer();
  }
  // The channel is made by the first stream to the peer (Send): a worker
  // of a large job talks to few of its peers, and a channel costs CPU and
  // memory to make.
  p.address = address;
  p.identity = identity;
}

void GrpcTransport::ResetPeer(int peer) {
  std::shared_ptr<ClientStream> waiting;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    it->second.silent = false;
    waiting = it->second.stream;
  }
  // Its OnDone (CANCELLED) fails what is still pending on it.
  if (waiting != nullptr) waiting->Close(/*cancel=*/true);
}

bool GrpcTransport::connected(int peer) const {
  absl::MutexLock lock(&mu_);
  return !closing_ && peers_.contains(peer);
}

void GrpcTransport::AddBulkPeer(int id, const std::string& bulk_address) {
  if (bulk_ == nullptr || bulk_address.empty()) return;
  std::string identity;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(id);
    if (it == peers_.end()) return;
    identity = it->second.identity;
  }
  bulk_->AddPeer(id, bulk_address, identity);
}

absl::StatusOr<uint64_t> GrpcTransport::Send(int peer, Frame frame) {
  if (bulk_ != nullptr) bulk_->Export(peer, frame);
  std::vector<grpc::Slice> slices;
  const size_t bytes = AppendFrame(std::move(frame), &slices);
  std::shared_ptr<ClientStream> stream;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return absl::UnavailableError("agent is shutting down");
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return absl::NotFoundError(absl::StrCat("no address for worker id ", peer));
    }
    if (it->second.stream == nullptr) {
      const std::shared_ptr<ClientStreamLifetimes> lifetimes = lifetimes_;
      lifetimes->Created();
      it->second.stream = std::shared_ptr<ClientStream>(
          new ClientStream(handler_, bulk_.get(), peer, next_stream_id_++,
                           [lifetimes](int p, uint64_t id, const absl::Status& s, bool accepted) {
                             lifetimes->WithOwner([&](GrpcTransport* t) {
                               t->OnClientStreamDone(p, id, s, accepted);
                             });
                           }),
          [lifetimes](ClientStream* stream) {
            delete stream;
            lifetimes->Destroyed();
          });
      ++live_streams_;
      Peer& p = it->second;
      if (p.stub == nullptr) {
        p.channel = grpc::CreateCustomChannel(
            p.address, BatonChannelCredentials(options_.tls),
            BatonChannelArguments(options_.max_message_bytes + (1 << 20), options_.tls,
                                  options_.silence_timeout));
        p.stub = std::make_unique<grpc::GenericStub>(p.channel);
      }
      p.stream->Start(p.stub.get(), options_.job_token, p.identity, p.silent);
    }
    stream = it->second.stream;
  }
  absl::Status ended;
  if (stream->Send(std::move(slices), bytes, &ended)) return stream->id();
  // The stream ended (its peer went away, or refused it); the next call
  // opens a new one.
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(peer);
  if (it != peers_.end() && it->second.stream == stream) it->second.stream.reset();
  return absl::Status(
      absl::IsUnauthenticated(ended) ? ended.code() : absl::StatusCode::kUnavailable,
      absl::StrCat("the stream to the peer closed: ", ended.message()));
}

void GrpcTransport::OnClientStreamDone(int peer, uint64_t stream_id, const absl::Status& cause,
                                       bool accepted) {
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(peer);
    if (it != peers_.end() && it->second.stream != nullptr &&
        it->second.stream->id() == stream_id) {
      it->second.stream.reset();
      it->second.silent = IsSilence(cause);
    }
    for (Peer& old : retired_) {
      if (old.stream != nullptr && old.stream->id() == stream_id) old.stream.reset();
    }
  }
  if (accepted) {
    handler_->OnStreamClosed(peer, stream_id, cause);
  } else {
    handler_->OnStreamRefused(peer, stream_id, cause);
  }
  // Counted down only after the handler returned: CloseStreams (and so the
  // owner's teardown of the handler) waits for this call to finish.
  absl::MutexLock lock(&mu_);
  --live_streams_;
}

absl::Status GrpcTransport::CloseStreams(bool cancel, absl::Duration timeout) {
  // Frames still waiting for bulk blobs fail now (B6).
  if (bulk_ != nullptr) bulk_->Close();
  std::vector<std::shared_ptr<ClientStream>> streams;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (auto& [id, p] : peers_) {
      if (p.stream != nullptr) streams.push_back(p.stream);
    }
    for (auto& p : retired_) {
      if (p.stream != nullptr) streams.push_back(p.stream);
    }
  }
  for (auto& s : streams) s->Close(cancel);
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_streams_ == 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    // Cancel what did not close cleanly and give it a moment more.
    mu_.Unlock();
    for (auto& s : streams) s->Close(true);
    mu_.Lock();
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(1));
    if (live_streams_ != 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          live_streams_, " outgoing stream(s) still open after ", DurationText(timeout)));
    }
  }
  return absl::OkStatus();
}

void GrpcTransport::StopServer(absl::Duration grace) {
  if (bulk_ != nullptr) bulk_->Close();
  if (server_ == nullptr) return;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  server_.reset();
}

int GrpcTransport::live_streams() const {
  absl::MutexLock lock(&mu_);
  return live_streams_;
}

}  // namespace baton::rpc::internal
