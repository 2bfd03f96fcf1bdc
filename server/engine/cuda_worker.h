// Runs requests on one CUDA device: stages each request through pinned host memory, allocates
// device memory from the device's stream-ordered pool, and launches the best kernel family the
// device has for it. What no GPU family can do yet runs on the CPU reference kernels (and
// Execution says so).
#pragma once

#include <memory>

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
  struct DeviceState;
  CudaWorker(devices::DeviceDescription device, const EngineOptions& options,
             metrics::ServerMetrics* metrics, std::unique_ptr<DeviceState> state);

  void OnThreadStart() override;
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs) override;
  absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs) override;
  absl::StatusOr<ForwardResult> RunFlashForward(const ForwardInputs& inputs);
  bool FlashCanRun(const TensorView& q) const;
  void PublishMemoryUse();

  std::unique_ptr<DeviceState> state_;
  const kernels::ExecutionContext cpu_context_;
  const int compute_capability_;  // major * 10 + minor
  metrics::ServerMetrics* const metrics_;
};

}  // namespace attnserve::engine
