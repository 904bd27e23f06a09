#include "base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace baton {
namespace {

absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status MakeDirs(const std::string& path) {
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      const std::string cur = path.substr(0, i);
      if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError(absl::StrCat("cannot create directory ", cur));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<absl::string_view> parts, unsigned mode) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (slash != std::string::npos && slash > 0) {
    RETURN_IF_ERROR(MakeDirs(dir));
  }
  const std::string tmp = absl::StrCat(dir, "/.tmp-", name);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoError(absl::StrCat("cannot create ", tmp));
  auto fail = [&](const std::string& what) {
    absl::Status s = ErrnoError(what);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  for (absl::string_view part : parts) {
    size_t off = 0;
    while (off < part.size()) {
      const ssize_t n = ::write(fd, part.data() + off, part.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return fail(absl::StrCat("writing ", tmp));
      off += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) return fail(absl::StrCat("fsync ", tmp));
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoError(absl::StrCat("rename to ", path));
    ::unlink(tmp.c_str());
    return s;
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace baton
