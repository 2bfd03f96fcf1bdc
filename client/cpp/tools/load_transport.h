// How attnload sends the pool's calls: gRPC (the Client's asynchronous calls over K channels)
// or the data channel (one DataChannelClient session of N connections, shared by all calls:
// it is thread-safe, and its calls block, so they run on worker threads, one per call in
// flight). With keep_context a backward is the step a training loop takes: a Forward that
// keeps its context, then the backward on it that sends only dout (in full if the server no
// longer holds the context).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/client.h"
#include "attnserve/data_channel_client.h"
#include "tools/workload.h"

namespace attnserve::load {

class LoadTransport {
 public:
  // Runs once per call with its outcome, the request and answer tensor bytes it moved, and a
  // check of the answer against the item's reference (callable only during `done`).
  using Done = std::function<void(const absl::Status& status, int64_t payload_bytes,
                                  const std::function<absl::Status()>& verify)>;
  virtual ~LoadTransport() = default;

  // Start a call and return at once; `done` runs on another thread and may start calls.
  virtual void Forward(const WorkItem& item, Done done) = 0;
  virtual void Backward(const WorkItem& item, Done done) = 0;
  // e.g. "grpc (2 connections)".
  virtual std::string Describe() const = 0;
  // "grpc", "data" or "shm".
  virtual std::string Name() const = 0;
};

// `clients` must outlive the transport. `shared_memory`: their calls go through shared memory
// (ClientOptions::shared_memory), named "shm".
std::unique_ptr<LoadTransport> MakeGrpcTransport(
    const std::vector<std::unique_ptr<Client>>& clients, bool keep_context,
    bool shared_memory = false);
absl::StatusOr<std::unique_ptr<LoadTransport>> OpenDataTransport(
    const DataChannelOptions& options, bool keep_context);

}  // namespace attnserve::load
