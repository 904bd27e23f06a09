// Recorder: a TransportHandler for transport tests (two transports in one
// process). It records what arrives and answers every request.
//
// Thread-safety: the handler methods and Wait* may run on any thread; read
// the recorded vectors under mu_.
#ifndef BATON_TESTING_TRANSPORT_RECORDER_H_
#define BATON_TESTING_TRANSPORT_RECORDER_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/transport.h"

namespace baton::rpc::internal {

// Records what arrives; answers every request with its id + 1000.
class Recorder : public TransportHandler {
 public:
  void OnRequest(std::shared_ptr<ReplyChannel> channel, Frame frame) override {
    Frame reply;
    reply.header.set_kind(proto::FrameHeader::RESPONSE);
    reply.header.set_id(frame.header.id() + 1000);
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(std::move(frame));
    }
    if (answer_) channel->Send(std::move(reply));
  }
  void OnResponse(int peer, Frame frame) override {
    absl::MutexLock lock(&mu_);
    responses_.push_back({peer, std::move(frame)});
  }
  void OnStreamClosed(int peer, uint64_t /*stream_id*/, const absl::Status& cause) override {
    absl::MutexLock lock(&mu_);
    closed_.push_back({peer, cause});
  }
  void OnRequestsUnread(int peer, uint64_t /*stream_id*/, const std::vector<uint64_t>& ids,
                        const absl::Status& /*cause*/) override {
    absl::MutexLock lock(&mu_);
    // Always before the same link's OnStreamClosed (T5).
    unread_before_close_ = closed_.empty();
    unread_.push_back({peer, ids});
  }
  bool WaitRequests(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return requests_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  bool WaitResponses(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return responses_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  bool WaitClosed(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto any = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !closed_.empty(); };
    return mu_.AwaitWithTimeout(absl::Condition(&any), timeout);
  }

  bool answer_ = true;
  absl::Mutex mu_;
  std::vector<Frame> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, Frame>> responses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, absl::Status>> closed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, std::vector<uint64_t>>> unread_ ABSL_GUARDED_BY(mu_);
  bool unread_before_close_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::rpc::internal

#endif  // BATON_TESTING_TRANSPORT_RECORDER_H_
