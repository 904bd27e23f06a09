#include "ps/types.h"

#include "absl/strings/str_cat.h"

namespace baton::ps {

std::string ShardStats::DebugString() const {
  std::string out =
      absl::StrCat("server ", server, ": clock ", applied_clock, " (trainers ", min_clock, "..",
                   max_clock, ", live ", live_trainers, ", dropped ", dropped_trainers,
                   "), max staleness ", max_staleness, ", applied pushes ", applied_pushes);
  if (duplicate_pushes > 0) absl::StrAppend(&out, " (", duplicate_pushes, " repeats not applied)");
  for (const auto& t : tables) {
    absl::StrAppend(&out, "; ", t.table, ": pulls ", t.pulls, " pushes ", t.pushes, " updates ",
                    t.applied_updates, " bytes out/in ", t.bytes_pulled, "/", t.bytes_pushed);
    if (t.rows > 0) absl::StrAppend(&out, " rows ", t.rows);
  }
  return out;
}

}  // namespace baton::ps
