// GlooStore: baton's rendezvous store seen through gloo's
// gloo::rendezvous::Store interface, so gloo's full-mesh connect can exchange
// addresses through it.
//
// Contract: every key is prefixed with `prefix` + "/gloo/". gloo's interface
// has no error values: failures throw gloo::IoException carrying the baton
// status text (the Gloo backend catches it at its boundary). get() and the
// timeout-less wait() use the timeout given at construction.
//
// Thread-safety: as safe as the underlying store (every baton store is safe
// for concurrent use).
#ifndef BATON_COMM_INTERNAL_GLOO_STORE_H_
#define BATON_COMM_INTERNAL_GLOO_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "absl/time/time.h"
#include "store/store.h"

namespace baton::comm::internal {

class GlooStore final : public ::gloo::rendezvous::Store {
 public:
  // `store` must outlive this adapter.
  GlooStore(store::Store& store, std::string prefix, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const;

  store::Store& store_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace baton::comm::internal

#endif  // BATON_COMM_INTERNAL_GLOO_STORE_H_
