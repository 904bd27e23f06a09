// Log lines of baton's library code: one path, with a severity and the
// prefix of whoever logs (a worker, a parameter server, the launcher),
// instead of each component writing to stderr its own way.
//
// Contract:
// - A line reads "baton <I|W|E> <prefix>: <message>" (no prefix: "baton <S>
//   <message>") and reaches the logger's sink whole. The default sink writes
//   it to stderr with one write(2), line and newline together, so lines of
//   threads and processes that share the terminal never interleave within a
//   line.
// - The lines of one Logger, and of its copies and children, reach their
//   sink in the order they were logged: the sink is called under a lock they
//   share.
// - Nothing is global: a component logs through the Logger its owner gave
//   it (an option, a constructor argument); a default-constructed Logger
//   writes to stderr.
//
// Thread-safety: Log is safe for concurrent use. The sink is called under
// the logger's lock, one line at a time; it must not log to the same logger.
#ifndef BATON_BASE_LOG_H_
#define BATON_BASE_LOG_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace baton {

enum class LogSeverity { kInfo, kWarning, kError };

class Logger {
 public:
  // Takes each finished line (without its newline).
  using Sink = std::function<void(LogSeverity, const std::string& line)>;

  // stderr, no prefix.
  Logger();
  // `sink` null: stderr.
  explicit Logger(std::string prefix, Sink sink = nullptr);

  // The same sink (and order), the prefix extended: "<prefix>: <more>".
  Logger Child(absl::string_view more) const;

  void Log(LogSeverity severity, absl::string_view message) const;
  void Info(absl::string_view message) const { Log(LogSeverity::kInfo, message); }
  void Warning(absl::string_view message) const { Log(LogSeverity::kWarning, message); }
  void Error(absl::string_view message) const { Log(LogSeverity::kError, message); }

  const std::string& prefix() const { return prefix_; }

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::string prefix_;
};

}  // namespace baton

#endif  // BATON_BASE_LOG_H_
