// attnload's load generator: calls over gRPC or the data channel (tools/load_transport.h), a
// pool of pre-built requests, and either a closed loop (N calls always in flight) or an open
// loop (calls sent on a schedule of R per second, constant or Poisson), with warmup, live
// progress and --check verification.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/client.h"
#include "tools/load_config.h"
#include "tools/load_result.h"
#include "tools/load_transport.h"
#include "tools/workload.h"

namespace attnserve::load {

class LoadRunner {
 public:
  // Connects the clients, checks that the server answers, builds the request pool, and opens
  // the transport --transport chooses.
  static absl::StatusOr<std::unique_ptr<LoadRunner>> Create(const LoadConfig& config);

  // One measured run: closed loop at `concurrency`, or open loop when config.rate > 0.
  RunResult Run(int concurrency);

  const std::vector<WorkItem>& pool() const { return pool_; }
  const v1::ServerInfo& server_info() const { return server_info_; }
  const LoadTransport& transport() const { return *transport_; }

 private:
  explicit LoadRunner(const LoadConfig& config) : config_(config) {}

  LoadConfig config_;
  std::vector<std::unique_ptr<Client>> clients_;
  // Declared after clients_, so destroyed before them: a gRPC transport uses them.
  std::unique_ptr<LoadTransport> transport_;
  std::vector<WorkItem> pool_;
  v1::ServerInfo server_info_;
};

}  // namespace attnserve::load
