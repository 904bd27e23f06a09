// Promtool: runs Debian's real `promtool check metrics` (package
// prometheus) on an exposition, for tests that check what a scrape serves.
//
// Thread-safety: thread-compatible (each call uses its own temporary dir).
#ifndef BATON_TESTING_PROMTOOL_H_
#define BATON_TESTING_PROMTOOL_H_

#include <string>
#include <utility>

namespace baton::testing {

// promtool's exit code (0: accepted; -1 when it could not run) and what it
// said.
std::pair<int, std::string> Promtool(const std::string& exposition);

}  // namespace baton::testing

#endif  // BATON_TESTING_PROMTOOL_H_
