// Runs a command to completion for end-to-end tests of the command-line tools.
#pragma once

#include <string>
#include <vector>

namespace attnserve::testing {

struct ProcessResult {
  // The exit status, or -1 when the process died from a signal or ran past its time.
  int exit_code = -1;
  std::string output;  // stdout and stderr, interleaved
};

// Runs argv[0] with argv[1..] and waits up to `timeout_seconds` (killing it after that).
ProcessResult RunProcess(const std::vector<std::string>& argv, int timeout_seconds = 60);

}  // namespace attnserve::testing
