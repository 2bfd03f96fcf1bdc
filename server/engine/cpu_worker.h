// Runs requests on the host CPU with the exact reference kernels, by default one request at a
// time (the kernel itself uses every core). A backward estimated past --max_launch_seconds runs
// as several launches (launch_split.h, split_backward.h), as on a GPU, so both devices answer
// it the same way.
#pragma once

#include "server/engine/kernel_runner.h"
#include "server/engine/engine_options.h"
#include "server/engine/kernel_routing.h"
#include "server/engine/launch_split.h"
#include "server/engine/queue_worker.h"

namespace attnserve::engine {

// The reference family's entry points; also what GPU workers use for what no GPU family does.
extern const KernelFamily kReferenceFamily;

class CpuWorker : public QueueWorker {
 public:
  // `metrics` and `contexts` may be null (unit tests); they must outlive the worker otherwise.
  CpuWorker(devices::DeviceDescription device, const EngineOptions& options,
            metrics::ServerMetrics* metrics, ContextStore* contexts = nullptr);
  ~CpuWorker() override { Stop(); }

  std::vector<std::string> kernel_families() const override { return {kReferenceFamily.name}; }
  KernelCatalog catalog() const override { return catalog_; }
  std::vector<CoverageRow> coverage() const override {
    return CoverageFor(/*compute_capability=*/0, /*shared_memory_per_block=*/0, catalog_);
  }

 private:
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs, int lane) override;
  absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs, int lane) override;
  // OK when the job's route (chosen once, by placement) is the reference family; under
  // --kernel=<a GPU family>, FAILED_PRECONDITION with the router's reason.
  absl::Status CheckRoute(const Route& route) const;

  // The launches a backward runs as (PlanLaunchSplit), empty when it runs as one.
  std::vector<LaunchRange> BackwardSplit(const BackwardInputs& inputs) const;

  const kernels::ExecutionContext context_;
  metrics::ServerMetrics* const metrics_;
  const double max_launch_seconds_;  // 0: never split
  // Threads the reference kernels give one request (--cpu_threads, 0 resolved to every core),
  // for the rate a backward's launches are sized by: a batch is cut no finer than it runs.
  const int host_threads_;
  const KernelCatalog catalog_;
};

}  // namespace attnserve::engine
