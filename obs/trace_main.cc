// baton-trace: merges the trace files a job wrote with BATON_TRACE=DIR into
// one Chrome trace (obs/trace.h), which Perfetto (ui.perfetto.dev) and
// chrome://tracing open, and draws it as an SVG beside it.
//   baton-trace DIR [OUT.json] [--from MS --to MS] [--cat C1,C2,...] [--arg KEY=VALUE]...
// OUT defaults to DIR/trace.json, the picture to OUT with .svg for .json;
// --from/--to keep the part between those milliseconds of the merged trace;
// --cat and --arg keep only the slices of those categories and with those
// arguments (obs::SelectTrace). A pipeline step's view, as the driver's
// trace shows it (pipeline/trace.h):
//   baton-trace DIR step3.json --cat forward,backward,send,recv --arg step=3
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "obs/trace.h"

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: baton-trace DIR [OUT.json] [--from MS --to MS] [--cat C1,C2,...] "
               "[--arg KEY=VALUE]...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  double from_ms = -1, to_ms = -1;
  std::set<std::string> cats;
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") return Usage();
    if (a == "--cat" && i + 1 < argc) {
      for (absl::string_view c : absl::StrSplit(argv[++i], ',', absl::SkipEmpty())) {
        cats.emplace(c);
      }
      continue;
    }
    if (a == "--arg" && i + 1 < argc) {
      const std::string kv = argv[++i];
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::fprintf(stderr, "baton-trace: --arg needs KEY=VALUE, not '%s'\n", kv.c_str());
        return 2;
      }
      args[kv.substr(0, eq)] = kv.substr(eq + 1);
      continue;
    }
    if ((a == "--from" || a == "--to") && i + 1 < argc) {
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || v < 0) {
        std::fprintf(stderr, "baton-trace: %s needs milliseconds, not '%s'\n", a.c_str(), argv[i]);
        return 2;
      }
      (a == "--from" ? from_ms : to_ms) = v;
      continue;
    }
    positional.push_back(a);
  }
  if (positional.empty() || positional.size() > 2 || (from_ms >= 0) != (to_ms >= 0) ||
      (from_ms >= 0 && to_ms <= from_ms)) {
    return Usage();
  }
  const std::string dir = positional[0];
  const std::string out = positional.size() == 2 ? positional[1] : dir + "/trace.json";
  auto trace = baton::obs::MergeTraces(dir);
  if (!trace.ok()) {
    std::fprintf(stderr, "baton-trace: %s\n", std::string(trace.status().message()).c_str());
    return 1;
  }
  if (from_ms >= 0) *trace = baton::obs::CropTrace(*trace, from_ms * 1000, to_ms * 1000);
  if (!cats.empty() || !args.empty()) {
    *trace = baton::obs::SelectTrace(*trace, [&](const baton::proto::TraceEvent& e) {
      if (!cats.empty() && cats.count(e.cat()) == 0) return false;
      for (const auto& [key, value] : args) {
        const auto it = e.args().find(key);
        if (it == e.args().end() || it->second != value) return false;
      }
      return true;
    });
  }
  std::ofstream(out) << baton::obs::TraceJson(*trace);
  std::string svg = out;
  if (svg.size() > 5 && svg.compare(svg.size() - 5, 5, ".json") == 0) svg.resize(svg.size() - 5);
  svg += ".svg";
  std::ofstream(svg) << baton::obs::TraceSvg(*trace);
  std::fprintf(stderr, "baton-trace: %d events of %d worker(s) written to %s (picture: %s)\n",
               trace->traceevents_size(), trace->workers_size(), out.c_str(), svg.c_str());
  for (const auto& w : trace->workers()) {
    std::fprintf(stderr, "  %s (rank %d): clock offset %.1f us, error %.1f us (%s)\n",
                 w.worker().c_str(), w.rank(), w.clock_offset_us(), w.clock_error_us(),
                 w.clock_method().c_str());
  }
  return 0;
}
