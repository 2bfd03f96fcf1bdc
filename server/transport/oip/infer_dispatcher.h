// Runs an Open Inference Protocol inference on the engine, the same for the gRPC and the REST
// frontend: the model by name, inputs read from shared-memory regions where the request says so,
// decoding onto a Forward or Backward job, and on completion the outputs encoded (or written to
// their regions), the model's statistics and the protocol metrics recorded. Authentication,
// concurrency slots, deadlines and the wire format stay with the frontends.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/engine.h"
#include "server/metrics/protocol_metrics.h"
#include "server/transport/oip/infer_request.h"
#include "server/transport/oip/model_statistics.h"
#include "server/transport/oip/shared_memory_regions.h"

namespace attnserve::transport::oip {

// Reads the optional parameter `name` as an integer ≥ 0; INVALID_ARGUMENT naming `field`.
absl::StatusOr<uint64_t> UnsignedParameter(const Parameters& parameters, const std::string& name,
                                           const std::string& field, uint64_t fallback);

class InferDispatcher {
 public:
  // Everything must outlive the dispatcher.
  InferDispatcher(engine::Engine* engine, metrics::ProtocolMetrics* metrics,
                  SharedMemoryRegions* shared_memory, ModelStatistics* statistics);

  // On OK, `done` is called exactly once, later, with the answer or the error; otherwise it is
  // never called and the caller answers with the returned status. `request` is kept (with any
  // shared-memory region it uses) until `done` has returned. `protocol`: "grpc" or "http".
  absl::Status Dispatch(std::shared_ptr<InferRequest> request, engine::JobControl control,
                        const std::string& protocol,
                        std::function<void(absl::StatusOr<InferAnswer>)> done);

  engine::Engine& engine() const { return *engine_; }
  SharedMemoryRegions& shared_memory() const { return *shared_memory_; }
  const ModelStatistics& statistics() const { return *statistics_; }

 private:
  struct Call;
  absl::Status Prepare(Call& call);
  void NoteRegion(Call& call, const MappedRegion& region, const char* direction, uint64_t bytes);
  absl::Status PlaceOutputs(const Call& call,
                            const std::vector<std::pair<const char*, uint64_t>>& outputs,
                            engine::OutputSpace* space) const;
  void Complete(const std::shared_ptr<Call>& call, absl::StatusOr<InferAnswer> answer,
                int64_t queue_us, int64_t compute_us);

  engine::Engine* const engine_;
  metrics::ProtocolMetrics* const metrics_;
  SharedMemoryRegions* const shared_memory_;
  ModelStatistics* const statistics_;
};

}  // namespace attnserve::transport::oip
