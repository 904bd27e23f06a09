// The one log path of library code (log.h).
#include "base/log.h"

#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace baton {

namespace {

// The whole line with one write(2) where the kernel allows (a short write
// of a terminal or pipe goes on from where it stopped).
void WriteToStderr(LogSeverity /*severity*/, const std::string& line) {
  const std::string whole = line + "\n";
  const char* p = whole.data();
  size_t left = whole.size();
  while (left > 0) {
    const ssize_t n = write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr closed: nothing to tell
    p += n;
    left -= static_cast<size_t>(n);
  }
}

char Letter(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kInfo: return 'I';
    case LogSeverity::kWarning: return 'W';
    case LogSeverity::kError: return 'E';
  }
  return '?';
}

}  // namespace

struct Logger::Shared {
  explicit Shared(Sink s) : sink(std::move(s)) {}
  absl::Mutex mu;
  const Sink sink ABSL_GUARDED_BY(mu);  // called under mu: one line at a time, in order
};

Logger::Logger() : Logger(std::string()) {}

Logger::Logger(std::string prefix, Sink sink)
    : shared_(std::make_shared<Shared>(sink ? std::move(sink) : Sink(&WriteToStderr))),
      prefix_(std::move(prefix)) {}

Logger Logger::Child(absl::string_view more) const {
  Logger child = *this;
  child.prefix_ = prefix_.empty() ? std::string(more) : absl::StrCat(prefix_, ": ", more);
  return child;
}

void Logger::Log(LogSeverity severity, absl::string_view message) const {
  const std::string line =
      prefix_.empty()
          ? absl::StrCat("baton ", std::string(1, Letter(severity)), " ", message)
          : absl::StrCat("baton ", std::string(1, Letter(severity)), " ", prefix_, ": ", message);
  absl::MutexLock lock(&shared_->mu);
  shared_->sink(severity, line);
}

}  // namespace baton
