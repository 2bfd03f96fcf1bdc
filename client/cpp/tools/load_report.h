// attnload's output: the human-readable report, JSON and CSV files, and the sweep's markdown
// table. Pure formatting: nothing here measures or sends anything.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/load_config.h"
#include "tools/load_result.h"
#include "tools/raw_socket_peer.h"
#include "tools/workload.h"

namespace attnserve::load {

// What was run against what, and over which transport (e.g. "data channel (4 connection(s))"):
// a few lines printed before the results.
std::string DescribeLoad(const LoadConfig& config, const std::vector<WorkItem>& pool,
                         const v1::ServerInfo& server, const std::string& transport);

std::string FormatRun(const RunResult& run);
// The raw socket's rates and each run's payload rate as a multiple of them.
std::string FormatRawSocket(const RawSocketResult& raw, const std::vector<RunResult>& runs);

// {"target": ..., "runs": [{...}, ...]}: the configuration and one object per run.
std::string RunsToJson(const LoadConfig& config, const std::vector<RunResult>& runs,
                       const std::optional<RawSocketResult>& raw = std::nullopt);
// A header and one row per run.
std::string RunsToCsv(const std::vector<RunResult>& runs);
// The sweep's table in markdown: one row per concurrency level.
std::string RunsToMarkdown(const std::vector<RunResult>& runs);

absl::Status WriteTextFile(const std::string& path, const std::string& contents);

}  // namespace attnserve::load
