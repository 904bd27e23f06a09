// Small helpers shared by the benchmark binaries: command-line flags, the
// clock, statistics as numpy computes them, and the JSON lines the peer
// scripts print ({"system": ..., "metric": ..., "value": ..., "unit": ...}).
//
// Thread-safety: Flags and JsonLine are not thread-safe; the functions are.
#ifndef BATON_BENCH_BENCH_UTIL_H_
#define BATON_BENCH_BENCH_UTIL_H_

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace baton::bench {

// Seconds on a monotonic clock (time.perf_counter()).
inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This process's CPU time so far (user + system, every thread), in seconds.
inline double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// numpy.median: the mean of the two middle values for an even count.
inline double Median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  const size_t n = xs.size();
  std::nth_element(xs.begin(), xs.begin() + n / 2, xs.end());
  const double hi = xs[n / 2];
  if (n % 2 == 1) return hi;
  return (*std::max_element(xs.begin(), xs.begin() + n / 2) + hi) / 2;
}

inline double Mean(const std::vector<double>& xs) {
  return xs.empty() ? 0 : std::accumulate(xs.begin(), xs.end(), 0.0) / xs.size();
}

// "--name value" and "--name=value" flags; "--name" alone is a boolean.
// Unknown flags are an error (Parse returns false and says which).
class Flags {
 public:
  // `known`: flag names without dashes; `booleans`: those that take no value.
  Flags(std::set<std::string> known, std::set<std::string> booleans)
      : known_(std::move(known)), booleans_(std::move(booleans)) {}

  bool Parse(const std::vector<std::string>& args) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a.rfind("--", 0) != 0) return Fail(absl::StrCat("unexpected argument '", a, "'"));
      std::string name = a.substr(2), value;
      const size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (known_.count(name) == 0 && booleans_.count(name) == 0) {
        return Fail(absl::StrCat("unknown flag --", name));
      }
      if (eq == std::string::npos) {
        if (booleans_.count(name) > 0) {
          value = "1";
        } else if (i + 1 < args.size()) {
          value = args[++i];
        } else {
          return Fail(absl::StrCat("--", name, " needs a value"));
        }
      }
      values_[name] = value;
    }
    return true;
  }
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Str(const std::string& name, const std::string& def) const {
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
  }
  // Exits with a message on a malformed number.
  int64_t Int(const std::string& name, int64_t def) const {
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    int64_t v;
    if (!absl::SimpleAtoi(it->second, &v)) Die(name, it->second);
    return v;
  }
  double Double(const std::string& name, double def) const {
    auto it = values_.find(name);
    if (it == values_.end()) return def;
    double v;
    if (!absl::SimpleAtod(it->second, &v)) Die(name, it->second);
    return v;
  }
  bool Bool(const std::string& name) const { return Has(name) && Str(name, "") != "0"; }

 private:
  bool Fail(const std::string& msg) {
    std::fprintf(stderr, "%s\n", msg.c_str());
    return false;
  }
  [[noreturn]] static void Die(const std::string& name, const std::string& v) {
    std::fprintf(stderr, "--%s: not a number: '%s'\n", name.c_str(), v.c_str());
    std::exit(2);
  }
  std::set<std::string> known_, booleans_;
  std::map<std::string, std::string> values_;
};

// One JSON object on one line, keys in insertion order.
class JsonLine {
 public:
  JsonLine& Add(const std::string& key, const std::string& v) {
    fields_.push_back(absl::StrCat("\"", key, "\": \"", v, "\""));
    return *this;
  }
  JsonLine& Add(const std::string& key, const char* v) { return Add(key, std::string(v)); }
  JsonLine& Add(const std::string& key, double v) {
    fields_.push_back(absl::StrFormat("\"%s\": %.10g", key, v));
    return *this;
  }
  JsonLine& Add(const std::string& key, int64_t v) {
    fields_.push_back(absl::StrCat("\"", key, "\": ", v));
    return *this;
  }
  JsonLine& Add(const std::string& key, int v) { return Add(key, static_cast<int64_t>(v)); }
  // Prints to stdout and flushes.
  void Print() const {
    std::printf("{%s}\n", absl::StrJoin(fields_, ", ").c_str());
    std::fflush(stdout);
  }

 private:
  std::vector<std::string> fields_;
};

// Space-separated numbers (a worker's report line), parsed back by ParseNumbers.
inline std::string Numbers(const std::vector<double>& xs) {
  return absl::StrJoin(xs, " ", [](std::string* out, double x) {
    absl::StrAppend(out, absl::StrFormat("%.17g", x));
  });
}
inline std::vector<double> ParseNumbers(const std::string& s) {
  std::vector<double> out;
  for (absl::string_view tok : absl::StrSplit(s, ' ', absl::SkipEmpty())) {
    double v;
    if (absl::SimpleAtod(tok, &v)) out.push_back(v);
  }
  return out;
}

}  // namespace baton::bench

#endif  // BATON_BENCH_BENCH_UTIL_H_
