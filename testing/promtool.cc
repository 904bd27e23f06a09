#include "testing/promtool.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "testing/temp_dir.h"

namespace baton::testing {

std::pair<int, std::string> Promtool(const std::string& exposition) {
  const std::string dir = MakeTempDir("promtool");
  const std::string in = dir + "/metrics.txt", out = dir + "/out.txt";
  std::ofstream(in) << exposition;
  const int status = std::system(
      absl::StrCat("/usr/bin/promtool check metrics < ", in, " > ", out, " 2>&1").c_str());
  std::ifstream f(out);
  std::string said((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, said};
}

}  // namespace baton::testing
