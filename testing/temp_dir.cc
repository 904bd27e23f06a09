#include "testing/temp_dir.h"

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace baton::testing {

std::string MakeTempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base != nullptr ? base : "/tmp", "/", name, "-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror(("mkdtemp " + tmpl).c_str());
    std::abort();
  }
  return tmpl;
}

}  // namespace baton::testing
