#include "obs/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace baton::obs {
namespace {

// Prometheus's float rendering: shortest round-trip form, NaN and the
// infinities as the text format spells them. Whole numbers below 1e15 print
// as integers; the range is tested before the cast (a cast of NaN, an
// infinity or a value past int64 is undefined).
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::abs(v) < 1e15 && v == std::trunc(v)) return absl::StrCat(static_cast<int64_t>(v));
  // The shortest of %.15g..%.17g that reads back as the same double.
  for (int digits = 15; digits < 17; ++digits) {
    std::string s = absl::StrFormat("%.*g", digits, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

std::string LabelText(const MetricsWriter::Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ",", labels[i].first, "=\"",
                    EscapeLabelValue(labels[i].second), "\"");
  }
  return out + "}";
}

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void LatencyHistogram::Observe(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(d);
  const size_t i =
      static_cast<size_t>(std::lower_bound(kLatencyBuckets.begin(), kLatencyBuckets.end(), s) -
                          kLatencyBuckets.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Nanoseconds(d))),
                    std::memory_order_relaxed);
}

void LatencyHistogram::Read(std::vector<uint64_t>* cumulative, double* sum_seconds,
                            uint64_t* count) const {
  cumulative->clear();
  uint64_t total = 0;
  for (const auto& b : buckets_) {
    total += b.load(std::memory_order_relaxed);
    cumulative->push_back(total);
  }
  *count = total;
  *sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
}

void RpcMetrics::Record(Side side, absl::StatusCode code, absl::Duration duration) {
  PerSide& s = sides_[static_cast<int>(side)];
  int c = static_cast<int>(code);
  if (c < 0 || c >= kCodes) c = static_cast<int>(absl::StatusCode::kUnknown);
  s.calls[c].fetch_add(1, std::memory_order_relaxed);
  s.duration.Observe(duration);
}

void MetricsWriter::Family(const std::string& name, const std::string& help,
                           const std::string& type) {
  family_ = name;
  absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void MetricsWriter::Sample(const Labels& labels, double value) {
  absl::StrAppend(&out_, family_, LabelText(labels), " ", Number(value), "\n");
}

RpcMetrics* MetricsRegistry::Rpc(const std::string& function) {
  {
    // Every call looks its function up: readers share the lock.
    absl::ReaderMutexLock lock(&mu_);
    auto it = rpc_.find(function);
    if (it != rpc_.end()) return it->second.get();
  }
  absl::MutexLock lock(&mu_);
  auto& slot = rpc_[function];
  if (slot == nullptr) slot = std::make_unique<RpcMetrics>();
  return slot.get();
}

void MetricsRegistry::AddCollector(Collector collector) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::string MetricsRegistry::Render() const {
  // Functions in name order, so the output is stable.
  std::map<std::string, const RpcMetrics*> functions;
  std::vector<Collector> collectors;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, m] : rpc_) functions.emplace(name, m.get());
    collectors = collectors_;
  }
  MetricsWriter w;
  const char* sides[] = {"caller", "callee"};
  w.Family("baton_rpc_calls_total",
           "RPC calls completed, by function, side (caller or callee) and status code.", "counter");
  for (const auto& [name, m] : functions) {
    for (int side = 0; side < 2; ++side) {
      for (int code = 0; code < RpcMetrics::kCodes; ++code) {
        const uint64_t n = m->sides_[side].calls[code].load(std::memory_order_relaxed);
        if (n == 0) continue;
        w.Sample({{"function", name}, {"side", sides[side]}, {"code", CodeName(code)}},
                 static_cast<double>(n));
      }
    }
  }
  absl::StrAppend(&w.out_, "# HELP baton_rpc_call_duration_seconds ",
                  "Durations of RPC calls: on the caller from the call to its completion, on "
                  "the callee from the function's start to its reply.\n",
                  "# TYPE baton_rpc_call_duration_seconds histogram\n");
  std::vector<uint64_t> cumulative;
  for (const auto& [name, m] : functions) {
    for (int side = 0; side < 2; ++side) {
      double sum = 0;
      uint64_t count = 0;
      m->sides_[side].duration.Read(&cumulative, &sum, &count);
      if (count == 0) continue;
      const std::string base =
          absl::StrCat("function=\"", EscapeLabelValue(name), "\",side=\"", sides[side], "\"");
      for (size_t i = 0; i < cumulative.size(); ++i) {
        absl::StrAppend(&w.out_, "baton_rpc_call_duration_seconds_bucket{", base, ",le=\"",
                        i < kLatencyBuckets.size() ? Number(kLatencyBuckets[i]) : "+Inf", "\"} ",
                        cumulative[i], "\n");
      }
      absl::StrAppend(&w.out_, "baton_rpc_call_duration_seconds_sum{", base, "} ", Number(sum),
                      "\n", "baton_rpc_call_duration_seconds_count{", base, "} ", count, "\n");
    }
  }
  for (const Collector& c : collectors) c(w);
  return std::move(w.out_);
}

std::string MergeExpositions(const std::string& label,
                             const std::vector<std::pair<std::string, std::string>>& sources) {
  struct Family {
    std::string help;
    std::string type;
    std::vector<std::string> samples;
  };
  std::vector<std::string> order;
  std::map<std::string, Family> families;
  for (const auto& [source, text] : sources) {
    const std::string tag = absl::StrCat(label, "=\"", EscapeLabelValue(source), "\"");
    std::string current;  // the family of the samples that follow
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(line, "# HELP ") || absl::StartsWith(line, "# TYPE ")) {
        absl::string_view rest = line.substr(7);
        const std::string name(rest.substr(0, rest.find(' ')));
        current = name;
        if (!families.count(name)) order.push_back(name);
        Family& f = families[name];
        std::string& slot = line[2] == 'H' ? f.help : f.type;
        if (slot.empty()) slot = std::string(line);
        continue;
      }
      if (line.empty() || line[0] == '#') continue;
      const size_t name_end = line.find_first_of("{ ");
      if (name_end == absl::string_view::npos) continue;
      std::string sample;
      if (line[name_end] == '{') {
        const bool empty = name_end + 1 < line.size() && line[name_end + 1] == '}';
        sample = absl::StrCat(line.substr(0, name_end + 1), tag, empty ? "" : ",",
                              line.substr(name_end + 1));
      } else {
        sample = absl::StrCat(line.substr(0, name_end), "{", tag, "}", line.substr(name_end));
      }
      // A sample before any TYPE line is a family of its own (untyped).
      const std::string family = current.empty() ? std::string(line.substr(0, name_end)) : current;
      if (!families.count(family)) order.push_back(family);
      families[family].samples.push_back(std::move(sample));
    }
  }
  std::string out;
  for (const std::string& name : order) {
    const Family& f = families[name];
    if (!f.help.empty()) absl::StrAppend(&out, f.help, "\n");
    if (!f.type.empty()) absl::StrAppend(&out, f.type, "\n");
    for (const std::string& s : f.samples) absl::StrAppend(&out, s, "\n");
  }
  return out;
}

}  // namespace baton::obs
