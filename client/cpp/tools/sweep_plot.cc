#include "tools/sweep_plot.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "tools/load_report.h"

extern char** environ;

namespace attnserve::load {
namespace {

// gnuplot's single-quoted strings escape a quote by doubling it.
std::string GnuplotQuoted(const std::string& text) {
  return absl::StrCat("'", absl::StrReplaceAll(text, {{"'", "''"}}), "'");
}

}  // namespace

std::string GnuplotScript(const std::vector<RunResult>& runs, const std::string& png_path) {
  std::string script = absl::StrCat(
      "# Drawn by attnload --sweep; rerun with: gnuplot <this file>\n"
      "set terminal pngcairo size 960,600 font ',11'\n"
      "set output ",
      GnuplotQuoted(png_path), "\n",
      "set title 'attnload concurrency sweep: latency against throughput'\n"
      "set xlabel 'throughput (requests/s)'\n"
      "set ylabel 'latency (ms)'\n"
      "set grid\n"
      "set key top left\n"
      "set yrange [0:*]\n"
      "$runs << EOD\n"
      "# concurrency throughput_rps p50_ms p99_ms\n");
  for (const RunResult& run : runs) {
    const LatencySummary l = run.latency.Summarize();
    absl::StrAppendFormat(&script, "%d %.6g %.6g %.6g\n", run.concurrency, run.throughput(), l.p50,
                          l.p99);
  }
  absl::StrAppend(&script,
                  "EOD\n"
                  "plot $runs using 2:3 with linespoints pt 7 lw 2 title 'p50', \\\n"
                  "     $runs using 2:4 with linespoints pt 5 lw 2 title 'p99', \\\n"
                  "     $runs using 2:4:(sprintf('c=%d', $1)) with labels offset 0,1 notitle\n");
  return script;
}

absl::Status DrawSweepPlot(const std::vector<RunResult>& runs, const std::string& gnuplot,
                           const std::string& script_path, const std::string& png_path) {
  if (absl::Status s = WriteTextFile(script_path, GnuplotScript(runs, png_path)); !s.ok()) {
    return s;
  }
  std::string program = gnuplot;
  std::string script = script_path;
  char* argv[] = {program.data(), script.data(), nullptr};
  pid_t pid = 0;
  const int spawn_error = posix_spawnp(&pid, program.c_str(), nullptr, nullptr, argv, environ);
  if (spawn_error != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot run '", gnuplot, "' to draw ", png_path, ": ", std::strerror(spawn_error),
        " (install Debian's gnuplot-nox, or point --gnuplot at gnuplot)"));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError("waitpid on gnuplot failed");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(gnuplot, " failed on ", script_path, " (exit status ",
                                            WEXITSTATUS(status), ")"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::load
