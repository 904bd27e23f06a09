#include "base/host.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "absl/strings/escaping.h"

namespace baton {

std::string RandomHex(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  size_t got = 0;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    while (got < raw.size()) {
      const ssize_t n = ::read(fd, raw.data() + got, raw.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  if (got < raw.size()) {
    std::random_device rd;
    for (size_t i = got; i < raw.size(); ++i) raw[i] = static_cast<char>(rd() & 0xff);
  }
  return absl::BytesToHexString(raw);
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

}  // namespace baton
