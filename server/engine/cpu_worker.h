// Runs requests on the host CPU with the exact reference kernels, one request at a time (the
// kernel itself uses every core), in arrival order.
#pragma once

#include "server/engine/kernel_runner.h"
#include "server/engine/engine_options.h"
#include "server/engine/queue_worker.h"

namespace attnserve::engine {

// The reference family's entry points; also what GPU workers use for what no GPU family does.
extern const KernelFamily kReferenceFamily;

class CpuWorker : public QueueWorker {
 public:
  // `metrics` may be null (unit tests); it must outlive the worker otherwise.
  CpuWorker(devices::DeviceDescription device, const EngineOptions& options,
            metrics::ServerMetrics* metrics);
  ~CpuWorker() override { Stop(); }

  std::vector<std::string> kernel_families() const override { return {kReferenceFamily.name}; }

 private:
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs, int lane) override;
  absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs, int lane) override;

  const kernels::ExecutionContext context_;
};

}  // namespace attnserve::engine
