// Test-only fault injection for the RRef protocol: a ControlSender wrapper
// that delays chosen message kinds, so that they arrive after messages sent
// later (reordering on real processes). Never linked into a library.
//
// Thread-safety: safe for concurrent use.
#ifndef BATON_TESTS_FAULT_INJECTION_H_
#define BATON_TESTS_FAULT_INJECTION_H_

#include <memory>
#include <set>
#include <string>

#include "rpc/timer.h"
#include "rref/rref_context.h"

namespace baton::testing {

class DelayingControlSender : public rref::ControlSender {
 public:
  enum Kind { kForkRequest, kChildAccept, kUserDelete };

  DelayingControlSender(rref::ControlSender* real, std::set<Kind> delayed, absl::Duration delay)
      : real_(real),
        delayed_(std::move(delayed)),
        delay_(delay),
        timer_(std::make_unique<rpc::DeadlineTimer>()) {}

  // "fork", "accept", "delete" (comma-separated) -> kinds.
  static std::set<Kind> Parse(const std::string& spec) {
    std::set<Kind> out;
    if (spec.find("fork") != std::string::npos) out.insert(kForkRequest);
    if (spec.find("accept") != std::string::npos) out.insert(kChildAccept);
    if (spec.find("delete") != std::string::npos) out.insert(kUserDelete);
    return out;
  }

  rpc::Future<void> ForkRequest(int owner, rref::RRefId r, rref::ForkId f, int parent) override {
    return Maybe(kForkRequest, [=] { return real_->ForkRequest(owner, r, f, parent); });
  }
  rpc::Future<void> ChildAccept(int parent, rref::RRefId r, rref::ForkId f) override {
    return Maybe(kChildAccept, [=] { return real_->ChildAccept(parent, r, f); });
  }
  rpc::Future<void> UserDelete(int owner, rref::RRefId r, rref::ForkId f) override {
    return Maybe(kUserDelete, [=] { return real_->UserDelete(owner, r, f); });
  }

 private:
  template <typename F>
  rpc::Future<void> Maybe(Kind k, F send) {
    if (delayed_.count(k) == 0) return send();
    rpc::Promise<void> p;
    timer_->Schedule(absl::Now() + delay_, [p, send]() mutable {
      send().OnReady([p](const auto& r) {
        if (r.ok()) {
          p.SetValue();
        } else {
          p.SetError(r.status());
        }
      });
    });
    return p.future();
  }

  rref::ControlSender* const real_;
  const std::set<Kind> delayed_;
  const absl::Duration delay_;
  std::unique_ptr<rpc::DeadlineTimer> timer_;
};

}  // namespace baton::testing

#endif  // BATON_TESTS_FAULT_INJECTION_H_
