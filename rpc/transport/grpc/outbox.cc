#include "rpc/transport/grpc/outbox.h"

#include <utility>

namespace baton::rpc::internal {
namespace {

// Packets are coalesced up to this size (a single larger frame goes alone).
constexpr size_t kCoalesceBytes = 1 << 20;

}  // namespace

bool Outbox::Send(std::vector<grpc::Slice> slices, size_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    queued_bytes_ += bytes;
    queue_.push_back({std::move(slices), bytes});
    if (writing_) return true;
    writing_ = true;
    BuildLocked();
  }
  start_write_(&current_);
  return true;
}

void Outbox::OnWriteDone(bool ok) {
  bool idle_close = false;
  bool start_next = false;
  bool resume = false;
  {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      closed_ = true;
      queue_.clear();
      queued_bytes_ = 0;
    }
    if (closed_ || queue_.empty()) {
      writing_ = false;
      idle_close = closed_ && !idle_closed_;
      if (idle_close) idle_closed_ = true;
    } else {
      BuildLocked();
      start_next = true;
      if (reads_paused_ && queued_bytes_ <= pause_limit_ / 2) {
        reads_paused_ = false;
        resume = true;
      }
    }
  }
  if (idle_close) on_idle_close_();
  if (resume) resume_reads_();
  if (start_next) start_write_(&current_);
}

bool Outbox::PauseReadsIfOver(size_t limit) {
  absl::MutexLock lock(&mu_);
  if (closed_ || !writing_ || queued_bytes_ <= limit || resume_reads_ == nullptr) return false;
  reads_paused_ = true;
  pause_limit_ = limit;
  return true;
}

void Outbox::Close() {
  bool idle_close = false;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    queue_.clear();
    queued_bytes_ = 0;
    idle_close = !writing_ && !idle_closed_;
    if (idle_close) idle_closed_ = true;
  }
  if (idle_close) on_idle_close_();
}

void Outbox::BuildLocked() {
  std::vector<grpc::Slice> slices;
  size_t bytes = 0;
  while (!queue_.empty() && (slices.empty() || bytes + queue_.front().bytes <= kCoalesceBytes)) {
    auto& item = queue_.front();
    bytes += item.bytes;
    queued_bytes_ -= item.bytes;
    for (auto& s : item.slices) slices.push_back(std::move(s));
    queue_.pop_front();
  }
  current_ = grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace baton::rpc::internal
