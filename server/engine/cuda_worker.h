// Runs requests on one CUDA device through two lanes (cuda_lane.h), so one request's
// host<->device copies overlap another's kernels, on the best kernel family the device has
// for each request. What no GPU family can do yet runs on the CPU reference kernels (and
// Execution says so).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/engine/cuda_lane.h"
#include "server/engine/engine_options.h"
#include "server/engine/kernel_routing.h"
#include "server/engine/queue_worker.h"

namespace attnserve::engine {

class CudaWorker : public QueueWorker {
 public:
  // Fails if the device cannot be bound or its streams cannot be made.
  static absl::StatusOr<std::unique_ptr<CudaWorker>> Create(devices::DeviceDescription device,
                                                           const EngineOptions& options,
                                                           metrics::ServerMetrics* metrics);
  ~CudaWorker() override;

  std::vector<std::string> kernel_families() const override;

 private:
  CudaWorker(devices::DeviceDescription device, const EngineOptions& options,
             metrics::ServerMetrics* metrics, std::vector<std::unique_ptr<CudaLane>> lanes);

  void OnLaneStart(int lane) override;
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs, int lane) override;
  absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs, int lane) override;
  absl::StatusOr<ForwardResult> RunFlashForward(const ForwardInputs& inputs, CudaLane& lane);
  absl::StatusOr<BackwardResult> RunFlashBackward(const BackwardInputs& inputs, CudaLane& lane);
  // The routing table's family for a request of q's dtype and head_dim on this device.
  std::string FamilyFor(Direction direction, const TensorView& q) const;
  void PublishMemoryUse();

  std::vector<std::unique_ptr<CudaLane>> lanes_;
  const kernels::ExecutionContext cpu_context_;
  const int compute_capability_;  // major * 10 + minor
  metrics::ServerMetrics* const metrics_;
};

}  // namespace attnserve::engine
