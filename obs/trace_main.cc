// baton-trace: merges the trace files a job wrote with BATON_TRACE=DIR into
// one Chrome trace (obs/trace.h), which Perfetto (ui.perfetto.dev) and
// chrome://tracing open.
//   baton-trace DIR [OUT]   OUT defaults to DIR/trace.json; a picture of it
//                           goes beside, as OUT with .svg for .json
#include <cstdio>
#include <fstream>
#include <string>

#include "obs/trace.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: baton-trace DIR [OUT.json]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::string out = argc == 3 ? argv[2] : dir + "/trace.json";
  auto trace = baton::obs::MergeTraces(dir);
  if (!trace.ok()) {
    std::fprintf(stderr, "baton-trace: %s\n", std::string(trace.status().message()).c_str());
    return 1;
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
