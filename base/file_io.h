// Whole-file reads and crash-safe whole-file writes, for checkpoints and
// other small state files.
//
// Contract:
// - WriteFileAtomically(path, parts) writes the concatenation of `parts` to
//   "<dir>/.tmp-<name>", fsyncs it, renames it over `path` and fsyncs the
//   directory, so a reader sees the old file or the whole new one, never a
//   torn one. The file gets `mode` (0644 unless given; 0600 for secrets).
//   Missing parent directories are created first. On error the
//   temporary file is removed and INTERNAL names the file and the step that
//   failed ("cannot create", "writing", "fsync", "rename to") with strerror.
// - MakeDirs(path) creates `path` and its missing parents (mkdir -p);
//   INTERNAL "cannot create directory D: ..." on failure.
// - ReadFile(path) returns the file's bytes; NOT_FOUND "cannot open PATH" if
//   it cannot be opened.
//
// Thread-safety: stateless; concurrent writes to the same path are the
// caller's to avoid (they share the temporary name).
#ifndef BATON_BASE_FILE_IO_H_
#define BATON_BASE_FILE_IO_H_

#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

absl::Status MakeDirs(const std::string& path);
absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<absl::string_view> parts,
                                 unsigned mode = 0644);
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace baton

#endif  // BATON_BASE_FILE_IO_H_
