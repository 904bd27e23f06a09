// The Gloo backend: collectives on CPU tensors over gloo's TCP transport
// (Debian's libgloo), rendezvous through baton's store.
//
//   auto pg = ProcessGroup::Create(store, rank, world, GlooBackendFactory());
//
// Contract: takes dense contiguous CPU tensors of every dtype: the data
// movement ops (broadcast, gathers, scatter, all_to_all, send/recv) move
// bytes of any dtype; reductions support float, double, half, bfloat16, the
// integer types and bool (sum/max = or, product/min = and), and complex for
// sum/avg. Collectives run in issue order on one thread per group; send/recv
// are posted at once and matched by (peer, tag). A timeout or a lost
// connection aborts the group (later ops fail with FAILED_PRECONDITION).
//
// Thread-safety: see ProcessGroup.
#ifndef BATON_COMM_GLOO_BACKEND_H_
#define BATON_COMM_GLOO_BACKEND_H_

#include <string>

#include "comm/backend.h"

namespace baton::comm {

struct GlooOptions {
  // Address to listen on for peers; loopback by default. Use the host's
  // address (or set `interface`) for multi-host jobs.
  std::string hostname = "127.0.0.1";
  // Network interface name (e.g. "eth0"); overrides hostname when set.
  std::string interface;
};

BackendFactory GlooBackendFactory(GlooOptions options = {});

}  // namespace baton::comm

#endif  // BATON_COMM_GLOO_BACKEND_H_
