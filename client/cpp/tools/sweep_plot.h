// The concurrency sweep's plot: latency (p50, p99) against throughput, drawn by gnuplot
// (Debian's gnuplot-nox; scripts/setup.sh installs it) from a script written beside the PNG,
// so the plot can be restyled and redrawn by hand.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/load_result.h"

namespace attnserve::load {

// The gnuplot script that draws `runs` into `png_path`.
std::string GnuplotScript(const std::vector<RunResult>& runs, const std::string& png_path);

// Writes `script_path` and runs `gnuplot` on it to produce `png_path`.
absl::Status DrawSweepPlot(const std::vector<RunResult>& runs, const std::string& gnuplot,
                           const std::string& script_path, const std::string& png_path);

}  // namespace attnserve::load
