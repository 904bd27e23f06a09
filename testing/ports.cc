#include "testing/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace baton::testing {

int FreePort() {
  static absl::Mutex mu;
  static auto* given = new absl::flat_hash_set<int>();
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = 0;
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      socklen_t len = sizeof(addr);
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
        port = ntohs(addr.sin_port);
      }
    }
    ::close(fd);
    absl::MutexLock lock(&mu);
    if (port > 0 && given->insert(port).second) return port;
  }
  return -1;
}

}  // namespace baton::testing
