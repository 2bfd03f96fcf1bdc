#include "server/engine/cpu_worker.h"

#include <algorithm>

#include "kernels/reference/reference_attention.h"

namespace attnserve::engine {

const KernelFamily kReferenceFamily = {"reference", kernels::reference::Forward,
                                       kernels::reference::Backward};

CpuWorker::CpuWorker(devices::DeviceDescription device, const EngineOptions& options,
                     metrics::ServerMetrics* metrics, ContextStore* contexts)
    : QueueWorker(std::move(device), options, metrics, contexts),
      context_{options.cpu_threads},
      catalog_(KernelCatalog::Only(options.forced_kernel_family.empty()
                                       ? kReferenceFamily.name
                                       : options.forced_kernel_family)) {
  // One lane by default: the reference kernels already use every core. More lanes (each with
  // fewer threads) suit many small requests.
  StartLanes(std::max(1, options.cpu_lanes));
}

absl::Status CpuWorker::CheckRoute(Direction direction, const TensorView& q,
                                   const RequestOptions& options) const {
  const Route route =
      ChooseRoute({/*compute_capability=*/0, direction, q.dtype, static_cast<int>(q.shape[2]),
                   /*shared_memory_per_block=*/0, options.has_dropout(), options.has_alibi()},
                  catalog_);
  if (route.family.empty()) return absl::FailedPreconditionError(route.reason);
  return absl::OkStatus();
}

absl::StatusOr<ForwardResult> CpuWorker::Execute(const ForwardInputs& inputs, int lane) {
  if (absl::Status s = CheckRoute(Direction::kForward, inputs.q, inputs.options); !s.ok()) {
    return s;
  }
  kernels::ExecutionContext context = context_;
  context.should_stop = LaneStop(lane);
  absl::StatusOr<ForwardResult> result = RunForward(kReferenceFamily, inputs, context);
  if (result.ok()) result->execution.device = device().name;
  return result;
}

absl::StatusOr<BackwardResult> CpuWorker::Execute(const BackwardInputs& inputs, int lane) {
  if (absl::Status s = CheckRoute(Direction::kBackward, inputs.q, inputs.options); !s.ok()) {
    return s;
  }
  kernels::ExecutionContext context = context_;
  context.should_stop = LaneStop(lane);
  absl::StatusOr<BackwardResult> result = RunBackward(kReferenceFamily, inputs, context);
  if (result.ok()) result->execution.device = device().name;
  return result;
}

}  // namespace attnserve::engine
