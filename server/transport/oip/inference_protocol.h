// Everything the Open Inference Protocol frontends (gRPC InferenceServiceImpl, REST /v2) share:
// model statistics, the shared-memory registry, the protocol metrics and the dispatcher onto
// the engine. One per server.
#pragma once

#include <memory>
#include <utility>

#include "server/engine/engine.h"
#include "server/metrics/protocol_metrics.h"
#include "server/transport/oip/infer_dispatcher.h"
#include "server/transport/oip/model_statistics.h"
#include "server/transport/oip/shared_memory_regions.h"

namespace attnserve::transport::oip {

class InferenceProtocol {
 public:
  // `engine` and `registry` must outlive this.
  InferenceProtocol(engine::Engine* engine, prometheus::Registry& registry,
                    SharedMemoryOptions shared_memory)
      : metrics_(registry),
        shared_memory_(WithPageLock(std::move(shared_memory), engine)),
        dispatcher_(engine, &metrics_, &shared_memory_, &statistics_) {}

  InferDispatcher* dispatcher() { return &dispatcher_; }

 private:
  // System regions are page-locked through the engine's host buffers (on a GPU host lanes then
  // read and write them in place), unless the caller chose otherwise.
  static SharedMemoryOptions WithPageLock(SharedMemoryOptions options, engine::Engine* engine) {
    if (!options.page_lock) {
      options.page_lock = [engine](void* data, size_t bytes) {
        return engine->host_buffers().PageLock(data, bytes);
      };
    }
    return options;
  }

  metrics::ProtocolMetrics metrics_;
  ModelStatistics statistics_;
  SharedMemoryRegions shared_memory_;
  InferDispatcher dispatcher_;
};

}  // namespace attnserve::transport::oip
