// Runs requests on one CUDA device: two lanes, each with its own stream and pinned staging
// buffer, so one request's host<->device copies overlap another's kernels. Each request is
// staged through pinned host memory, gets device memory from the device's stream-ordered pool,
// and runs on the best kernel family the device has for it. What no GPU family can do yet runs on the CPU reference kernels (and
// Execution says so).
#pragma once

#include <memory>
#include <vector>

#include "server/engine/engine_options.h"
#include "server/engine/queue_worker.h"

namespace attnserve::engine {

class CudaWorker : public QueueWorker {
 public:
  // Fails if the device cannot be bound or has no stream.
  static absl::StatusOr<std::unique_ptr<CudaWorker>> Create(devices::DeviceDescription device,
                                                           const EngineOptions& options,
                                                           metrics::ServerMetrics* metrics);
  ~CudaWorker() override;

  std::vector<std::string> kernel_families() const override;

 private:
  struct Lane;
  CudaWorker(devices::DeviceDescription device, const EngineOptions& options,
             metrics::ServerMetrics* metrics, std::vector<std::unique_ptr<Lane>> lanes);

  void OnLaneStart(int lane) override;
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs, int lane) override;
  absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs, int lane) override;
  absl::StatusOr<ForwardResult> RunFlashForward(const ForwardInputs& inputs, Lane& lane);
  bool FlashCanRun(const TensorView& q) const;
  void PublishMemoryUse();

  std::vector<std::unique_ptr<Lane>> lanes_;
  const kernels::ExecutionContext cpu_context_;
  const int compute_capability_;  // major * 10 + minor
  metrics::ServerMetrics* const metrics_;
};

}  // namespace attnserve::engine
