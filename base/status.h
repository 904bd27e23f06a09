// Status helpers shared by every layer.
//
// Contract: errors inside baton are absl::Status values. Codes keep their
// meaning end to end (the mapping to gRPC's codes is in base/grpc_status.h,
// for the layers that speak gRPC); this file holds the single exception type
// that the user-facing API throws. No gRPC header is included here.
//
// Thread-safety: everything here is stateless and safe for concurrent use.
#ifndef BATON_BASE_STATUS_H_
#define BATON_BASE_STATUS_H_

#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace baton {

// Returns `status` with `context` prepended to its message ("context: msg"),
// keeping the code. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Builds a status from a raw absl::StatusCode integer received from the wire.
// Unknown numbers become UNKNOWN (the message says so).
absl::Status StatusFromWire(int code, absl::string_view message);

// Human-readable duration for error messages: "250ms", "1.5s".
std::string DurationText(absl::Duration d);

// The one exception type thrown by baton's user-facing API (rpc_sync,
// Future::value, ...). It carries the full status.
class Error : public std::runtime_error {
 public:
  explicit Error(absl::Status status);
  const absl::Status& status() const { return status_; }
  absl::StatusCode code() const { return status_.code(); }

 private:
  absl::Status status_;
};

// Throws Error if !status.ok().
void ThrowIfError(const absl::Status& status);

}  // namespace baton

#endif  // BATON_BASE_STATUS_H_
