// Facts about this process's host and fresh random names, shared by the
// layers that need them (the agent's rendezvous, the same-host transports,
// the launcher, the same-host all-reduce).
//
// Contract:
// - RandomHex(bytes) returns 2 * bytes lowercase hex digits from the
//   kernel's random source (/dev/urandom, or std::random_device if it cannot
//   be read): for tokens, nonces and names of shared objects.
// - BootId() returns this boot of the machine (/proc/sys/kernel/random/
//   boot_id), or "" where it cannot be read; two processes with the same
//   non-empty boot id run on the same machine since its last boot.
//
// Thread-safety: stateless; safe from any thread.
#ifndef BATON_BASE_HOST_H_
#define BATON_BASE_HOST_H_

#include <string>

namespace baton {

std::string RandomHex(int bytes);
std::string BootId();

}  // namespace baton

#endif  // BATON_BASE_HOST_H_
