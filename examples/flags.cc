#include "examples/flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton::examples {

void FlagSet::String(const std::string& name, std::string* v, const std::string& help) {
  flags_.push_back({name, v, help, absl::StrCat("'", *v, "'")});
}
void FlagSet::Int(const std::string& name, int64_t* v, const std::string& help) {
  flags_.push_back({name, v, help, absl::StrCat(*v)});
}
void FlagSet::Double(const std::string& name, double* v, const std::string& help) {
  flags_.push_back({name, v, help, absl::StrCat(*v)});
}
void FlagSet::Bool(const std::string& name, bool* v, const std::string& help) {
  flags_.push_back({name, v, help, *v ? "true" : "false"});
}

const FlagSet::Flag* FlagSet::Find(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

absl::Status FlagSet::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    arg = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    const Flag* f = Find(arg);
    if (f == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", arg));
    if (auto* b = std::get_if<bool*>(&f->target)) {
      if (!has_value) {
        **b = true;
        continue;
      }
      if (value == "true" || value == "1") {
        **b = true;
      } else if (value == "false" || value == "0") {
        **b = false;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", arg, ": '", value, "' is not a boolean"));
      }
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc)
        return absl::InvalidArgumentError(absl::StrCat("--", arg, " needs a value"));
      value = argv[++i];
    }
    bool ok = true;
    if (auto* s = std::get_if<std::string*>(&f->target)) {
      **s = value;
    } else if (auto* n = std::get_if<int64_t*>(&f->target)) {
      ok = absl::SimpleAtoi(value, *n);
    } else if (auto* d = std::get_if<double*>(&f->target)) {
      ok = absl::SimpleAtod(value, *d);
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("--", arg, ": bad value '", value, "'"));
    }
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", program_, " [flags]\n");
  for (const Flag& f : flags_) {
    absl::StrAppendFormat(&out, "  --%-20s %s (default %s)\n", f.name, f.help, f.default_text);
  }
  return out;
}

}  // namespace baton::examples
