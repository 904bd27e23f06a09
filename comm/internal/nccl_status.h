// NCCL result codes as absl::Status, with NCCL's own description of the
// last error (ncclGetLastError), which says what was wrong, where the result
// code alone says only "invalid argument" or "internal error".
//
// CUDA build only (includes nccl.h). Thread-safety: safe from any thread;
// ncclGetLastError reports the calling thread's last NCCL error.
#ifndef BATON_COMM_INTERNAL_NCCL_STATUS_H_
#define BATON_COMM_INTERNAL_NCCL_STATUS_H_

#include <nccl.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace baton::comm::internal {

// OK for ncclSuccess; otherwise UNAVAILABLE
//   "<what>: NCCL error <code> (<ncclGetErrorString>): <ncclGetLastError>"
// (the last part only when NCCL recorded one).
inline absl::Status NcclStatus(ncclResult_t r, absl::string_view what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(what, ": NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r), ")");
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, ": ", last);
  return absl::UnavailableError(message);
}

}  // namespace baton::comm::internal

#endif  // BATON_COMM_INTERNAL_NCCL_STATUS_H_
