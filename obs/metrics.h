// Metrics in Prometheus's text exposition format (version 0.0.4): what an
// operator's Prometheus scrapes from each worker (obs/http_server.h).
//
//   obs::MetricsRegistry m;
//   obs::RpcMetrics* f = m.Rpc("train_step");           // once per function
//   f->Record(obs::Side::kCaller, absl::StatusCode::kOk, absl::Microseconds(80));
//   m.AddCollector([&](obs::MetricsWriter& w) {          // values read at scrape
//     w.Family("baton_rref_owned", "RRefs this worker owns.", "gauge");
//     w.Sample({}, owned());
//   });
//   std::string text = m.Render();
//
// Contract:
// - Rpc(function) returns one object per function name for the registry's
//   lifetime; recording on it is lock-free (relaxed atomics), so the hot path
//   costs a few atomic adds.
// - Render() writes every family once, with HELP and TYPE, samples grouped,
//   label values escaped (\\, \", \n); `promtool check metrics` accepts it
//   (tests/obs/metrics_test.cc runs promtool).
// - Collectors run on the scraping thread, under no lock of the registry's
//   hot path; they must not block and must not call Render().
//
// Thread-safety: every method is safe to call concurrently.
#ifndef BATON_OBS_METRICS_H_
#define BATON_OBS_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::obs {

// The Content-Type of a scrape (text exposition format 0.0.4).
inline constexpr absl::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

// Latency buckets in seconds (upper bounds; +Inf is implied).
inline constexpr std::array<double, 17> kLatencyBuckets = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
    50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};

// A histogram of durations over kLatencyBuckets.
class LatencyHistogram {
 public:
  void Observe(absl::Duration d);
  // Cumulative counts per bucket (+Inf last), the sum in seconds, the count.
  void Read(std::vector<uint64_t>* cumulative, double* sum_seconds, uint64_t* count) const;

 private:
  std::array<std::atomic<uint64_t>, kLatencyBuckets.size() + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

enum class Side { kCaller = 0, kCallee = 1 };

// The calls of one function, on each side: completions by status code and
// their durations (caller: from the call to its completion; callee: from the
// function's start to its reply).
class RpcMetrics {
 public:
  void Record(Side side, absl::StatusCode code, absl::Duration duration);

 private:
  friend class MetricsRegistry;
  static constexpr int kCodes = 17;  // absl::StatusCode 0..16; others count as UNKNOWN
  struct PerSide {
    std::array<std::atomic<uint64_t>, kCodes> calls{};
    LatencyHistogram duration;
  };
  std::array<PerSide, 2> sides_;
};

// Writes families at scrape time (collectors).
class MetricsWriter {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  // Starts a family: `type` is "counter" or "gauge"; `name` follows
  // Prometheus's rules (counters end in _total).
  void Family(const std::string& name, const std::string& help, const std::string& type);
  // A sample of the current family.
  void Sample(const Labels& labels, double value);
  // A family of one sample.
  void Gauge(const std::string& name, const std::string& help, double value,
             const Labels& labels = {}) {
    Family(name, help, "gauge");
    Sample(labels, value);
  }
  void Counter(const std::string& name, const std::string& help, double value,
               const Labels& labels = {}) {
    Family(name, help, "counter");
    Sample(labels, value);
  }

  std::string& text() { return out_; }

 private:
  friend class MetricsRegistry;
  std::string out_;
  std::string family_;
};

class MetricsRegistry {
 public:
  using Collector = std::function<void(MetricsWriter&)>;

  RpcMetrics* Rpc(const std::string& function);
  void AddCollector(Collector collector);
  std::string Render() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<RpcMetrics>> rpc_ ABSL_GUARDED_BY(mu_);
  std::vector<Collector> collectors_ ABSL_GUARDED_BY(mu_);
};

// A label value in the exposition format's escaping.
std::string EscapeLabelValue(const std::string& v);

// One exposition of several (a node's workers, scraped by baton-run): every
// sample gets the label `label`="<source name>" first; each family appears
// once, with the HELP and TYPE of the first source that has it, its samples
// from every source together. Lines that are neither comments nor samples
// are dropped.
std::string MergeExpositions(
    const std::string& label,
    const std::vector<std::pair<std::string, std::string>>& sources);  // (name, text)

}  // namespace baton::obs

#endif  // BATON_OBS_METRICS_H_
