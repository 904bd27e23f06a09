#include "base/status.h"

#include "absl/strings/str_cat.h"

namespace baton {

absl::Status StatusFromWire(int code, absl::string_view message) {
  if (code == 0) return absl::OkStatus();
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(
        absl::StrCat("unknown status code ", code, " from the wire: ", message));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

std::string DurationText(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "no limit";
  return absl::FormatDuration(d);
}

Error::Error(absl::Status status)
    : std::runtime_error(status.ToString()), status_(std::move(status)) {}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw Error(status);
}

}  // namespace baton
