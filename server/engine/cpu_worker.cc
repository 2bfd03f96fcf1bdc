#include "server/engine/cpu_worker.h"

#include "kernels/reference/reference_attention.h"

namespace attnserve::engine {

const KernelFamily kReferenceFamily = {"reference", kernels::reference::Forward,
                                       kernels::reference::Backward};

CpuWorker::CpuWorker(devices::DeviceDescription device, const EngineOptions& options,
                     metrics::ServerMetrics* metrics)
    : QueueWorker(std::move(device), options.batching, metrics), context_{options.cpu_threads} {
  StartLanes(1);  // the reference kernels already use every core
}

absl::StatusOr<ForwardResult> CpuWorker::Execute(const ForwardInputs& inputs, int /*lane*/) {
  absl::StatusOr<ForwardResult> result = RunForward(kReferenceFamily, inputs, context_);
  if (result.ok()) result->execution.device = device().name;
  return result;
}

absl::StatusOr<BackwardResult> CpuWorker::Execute(const BackwardInputs& inputs, int /*lane*/) {
  absl::StatusOr<BackwardResult> result = RunBackward(kReferenceFamily, inputs, context_);
  if (result.ok()) result->execution.device = device().name;
  return result;
}

}  // namespace attnserve::engine
