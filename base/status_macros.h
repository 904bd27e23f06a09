// Early returns on error, for functions that return absl::Status or
// absl::StatusOr<T> (the error model inside baton, docs/api.md):
//
//   RETURN_IF_ERROR(Write(frame));              // an absl::Status
//   ASSIGN_OR_RETURN(Peer peer, Lookup(name));  // an absl::StatusOr<Peer>
//   ASSIGN_OR_RETURN(auto agent, RpcAgent::Create(options, registry));
//
// Contract: RETURN_IF_ERROR evaluates its argument once and returns it from
// the enclosing function unless it is OK. ASSIGN_OR_RETURN evaluates its
// right side once; an error returns its status, otherwise the value is
// moved into the left side (a declaration or an existing lvalue). Neither
// adds context: where the caller should say what failed, use
// baton::Annotate (base/status.h) explicitly. One ASSIGN_OR_RETURN per
// line (its hidden variable is named after the line).
//
// Thread-safety: macros; they add nothing shared.
#ifndef BATON_BASE_STATUS_MACROS_H_
#define BATON_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#if defined(RETURN_IF_ERROR) || defined(ASSIGN_OR_RETURN)
#error "RETURN_IF_ERROR or ASSIGN_OR_RETURN is already defined by another header"
#endif

#define RETURN_IF_ERROR(expr)                                                                     \
  do {                                                                                            \
    if (::absl::Status baton_status_macros_status_ = (expr); !baton_status_macros_status_.ok()) { \
      return baton_status_macros_status_;                                                         \
    }                                                                                             \
  } while (false)

#define BATON_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define BATON_STATUS_MACROS_CONCAT_(a, b) BATON_STATUS_MACROS_CONCAT_INNER_(a, b)

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  BATON_ASSIGN_OR_RETURN_IMPL_(BATON_STATUS_MACROS_CONCAT_(baton_status_or_, __LINE__), lhs, rexpr)

#define BATON_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)

#endif  // BATON_BASE_STATUS_MACROS_H_
