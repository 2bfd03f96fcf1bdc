#include "server/engine/cpu_worker.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/reference/reference_attention.h"
#include "server/engine/split_backward.h"
#include "server/engine/work_estimate.h"

namespace attnserve::engine {

const KernelFamily kReferenceFamily = {"reference", kernels::reference::Forward,
                                       kernels::reference::Backward};

CpuWorker::CpuWorker(devices::DeviceDescription device, const EngineOptions& options,
                     metrics::ServerMetrics* metrics, ContextStore* contexts)
    : QueueWorker(std::move(device), options, metrics, contexts),
      context_{options.cpu_threads},
      metrics_(metrics),
      max_launch_seconds_(options.max_launch_seconds),
      host_threads_(options.cpu_threads > 0
                        ? options.cpu_threads
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      catalog_(KernelCatalog::Only(options.forced_kernel_family.empty()
                                       ? kReferenceFamily.name
                                       : options.forced_kernel_family)) {
  // One lane by default: the reference kernels already use every core. More lanes (each with
  // fewer threads) suit many small requests.
  StartLanes(std::max(1, options.cpu_lanes));
}

absl::Status CpuWorker::CheckRoute(const Route& route) const {
  if (route.family.empty()) return absl::FailedPreconditionError(route.reason);
  if (route.family != kReferenceFamily.name) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the request was routed to ", route.Name(), ", which ", device().name, " does not run"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardResult> CpuWorker::Execute(const ForwardInputs& inputs, int lane) {
  if (absl::Status s = CheckRoute(inputs.route); !s.ok()) {
    return s;
  }
  kernels::ExecutionContext context = context_;
  context.should_stop = LaneStop(lane);
  absl::StatusOr<ForwardResult> result = RunForward(kReferenceFamily, inputs, context);
  if (result.ok()) result->execution.device = device().name;
  return result;
}

absl::StatusOr<BackwardResult> CpuWorker::Execute(const BackwardInputs& inputs, int lane) {
  if (absl::Status s = CheckRoute(inputs.route); !s.ok()) {
    return s;
  }
  kernels::ExecutionContext context = context_;
  context.should_stop = LaneStop(lane);
  const std::vector<LaunchRange> split = BackwardSplit(inputs);
  absl::StatusOr<BackwardResult> result;
  if (split.empty()) {
    result = RunBackward(kReferenceFamily, inputs, context);
  } else {
    if (metrics_ != nullptr) metrics_->RecordSplitLaunches(device().name, split.size());
    const std::function<bool()>& stop = LaneStop(lane);
    result = RunBackwardInLaunches(kReferenceFamily, inputs, split, context,
                                   [&stop]() -> absl::Status {
                                     if (stop && stop()) {
                                       return absl::CancelledError(
                                           "stopped between launches: its deadline passed or "
                                           "its caller cancelled");
                                     }
                                     return absl::OkStatus();
                                   });
  }
  if (result.ok()) result->execution.device = device().name;
  return result;
}

std::vector<LaunchRange> CpuWorker::BackwardSplit(const BackwardInputs& inputs) const {
  // A backward still arriving runs group by group as it comes (kernel_runner.h); the
  // reference kernel stops part way at its deadline in any case.
  if (inputs.groups != nullptr) return {};
  return PlanLaunchSplit(
      SplitRequestOf(Direction::kBackward, inputs.q, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
                     inputs.options,
                     FamilyThroughput(kReferenceFamily.name, /*compute_capability=*/0,
                                      host_threads_)),
      max_launch_seconds_);
}

}  // namespace attnserve::engine
