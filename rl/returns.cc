#include "rl/returns.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace baton::rl {
namespace {

absl::Status CheckEnds(size_t steps, const std::vector<int32_t>& ends) {
  int64_t last = -1;
  for (size_t i = 0; i < ends.size(); ++i) {
    if (ends[i] <= last || ends[i] >= static_cast<int64_t>(steps)) {
      return absl::InvalidArgumentError(
          absl::StrCat("episode_ends[", i, "] = ", ends[i],
                       ": episode ends must be ascending step indices in [0, ", steps, ")"));
    }
    last = ends[i];
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<float>> EpisodeReturns(const std::vector<float>& rewards,
                                                  const std::vector<int32_t>& episode_ends,
                                                  double gamma) {
  RETURN_IF_ERROR(CheckEnds(rewards.size(), episode_ends));
  const size_t n = rewards.size();
  std::vector<bool> ends(n, false);
  for (int32_t e : episode_ends) ends[e] = true;
  std::vector<double> g(n);
  double running = 0.0;
  for (size_t t = n; t-- > 0;) {
    if (ends[t]) running = 0.0;
    running = rewards[t] + gamma * running;
    g[t] = static_cast<float>(running);  // the peer stores returns as float32
  }
  std::vector<float> out(n, 0.0f);
  const double eps = std::numeric_limits<float>::epsilon();
  size_t begin = 0;
  auto normalize = [&](size_t b, size_t e) {
    const size_t len = e - b;
    if (len < 2) return;  // a one-step piece gets 0
    double mean = 0;
    for (size_t t = b; t < e; ++t) mean += g[t];
    mean /= static_cast<double>(len);
    double var = 0;
    for (size_t t = b; t < e; ++t) var += (g[t] - mean) * (g[t] - mean);
    const double std = std::sqrt(var / static_cast<double>(len - 1));
    for (size_t t = b; t < e; ++t) out[t] = static_cast<float>((g[t] - mean) / (std + eps));
  };
  for (int32_t e : episode_ends) {
    normalize(begin, static_cast<size_t>(e) + 1);
    begin = static_cast<size_t>(e) + 1;
  }
  if (begin < n) normalize(begin, n);
  return out;
}

absl::StatusOr<std::vector<double>> EpisodeRewards(const std::vector<float>& rewards,
                                                   const std::vector<int32_t>& episode_ends) {
  RETURN_IF_ERROR(CheckEnds(rewards.size(), episode_ends));
  std::vector<double> out;
  size_t begin = 0;
  for (int32_t e : episode_ends) {
    double sum = 0;
    for (size_t t = begin; t <= static_cast<size_t>(e); ++t) sum += rewards[t];
    out.push_back(sum);
    begin = static_cast<size_t>(e) + 1;
  }
  return out;
}

}  // namespace baton::rl
