// Command-line flags for the examples: --name=value or --name value, typed
// by the variable each flag is bound to.
//
//   FlagSet flags("pipeline_fashion_mnist");
//   int64_t steps = 0;
//   flags.Int("steps", &steps, "training steps (0: whole epochs)");
//   if (absl::Status s = flags.Parse(argc, argv); !s.ok()) { ...; return 2; }
//
// Contract: Parse() sets the bound variables of the flags given and leaves
// the others at their defaults. INVALID_ARGUMENT names the argument for an
// unknown flag, a missing value or a value that is not of the flag's type.
// Booleans accept true/false/1/0, and a bare --name means true. Usage()
// lists every flag with its default and help.
//
// Thread-safety: not thread-safe; use from main().
#ifndef BATON_EXAMPLES_FLAGS_H_
#define BATON_EXAMPLES_FLAGS_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace baton::examples {

class FlagSet {
 public:
  explicit FlagSet(std::string program) : program_(std::move(program)) {}

  void String(const std::string& name, std::string* v, const std::string& help);
  void Int(const std::string& name, int64_t* v, const std::string& help);
  void Double(const std::string& name, double* v, const std::string& help);
  void Bool(const std::string& name, bool* v, const std::string& help);

  absl::Status Parse(int argc, char** argv);
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;
    std::variant<std::string*, int64_t*, double*, bool*> target;
    std::string help;
    std::string default_text;
  };
  const Flag* Find(const std::string& name) const;

  std::string program_;
  std::vector<Flag> flags_;
};

}  // namespace baton::examples

#endif  // BATON_EXAMPLES_FLAGS_H_
