#include "testing/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace baton::testing {
namespace {

// Ports from here up to the ephemeral range: above the well-known and most
// registered services' ports.
constexpr int kLowest = 10000;

// The first port the kernel hands out to connections and bind(0); 32768
// when it cannot be read (Linux's default).
int EphemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  int high = 0;
  if (in >> low >> high && low > kLowest + 1000) return low;
  return 32768;
}

}  // namespace

bool PortIsFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

int FreePort() {
  static absl::Mutex mu;
  static auto* given = new absl::flat_hash_set<int>();
  static const int high = EphemeralLow();  // exclusive
  std::random_device seed;
  std::mt19937 gen(seed() ^ static_cast<unsigned>(::getpid()));
  std::uniform_int_distribution<int> draw(kLowest, high - 1);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = draw(gen);
    {
      absl::MutexLock lock(&mu);
      if (given->contains(port)) continue;
    }
    if (!PortIsFree(port)) continue;
    absl::MutexLock lock(&mu);
    if (given->insert(port).second) return port;
  }
  return -1;
}

}  // namespace baton::testing
