// Runs requests on one CUDA device through several lanes (cuda_lane.h), so one request's
// host<->device copies overlap another's kernels, on the best kernel family the device has for
// each request; a batch's parts are gathered straight into pinned memory and split out of it.
// What no GPU family can do yet runs on the CPU reference kernels (and Execution says so).
// A kept forward's context stays in device memory (cuda_context.h), and a backward on it sends
// only dout across PCIe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernel_families.h"
#include "server/engine/cuda_grouped_backward.h"
#include "server/engine/cuda_grouped_forward.h"
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
                                                           metrics::ServerMetrics* metrics,
                                                           ContextStore* contexts);
  ~CudaWorker() override;

  std::vector<std::string> kernel_families() const override;
  std::vector<CoverageRow> coverage() const override;
  KernelCatalog catalog() const override { return catalog_; }
  absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> OpenForeignMemory(
      const std::string& ipc_handle, uint64_t byte_size) override;

 private:
  CudaWorker(devices::DeviceDescription device, const EngineOptions& options,
             metrics::ServerMetrics* metrics, ContextStore* contexts,
             std::vector<std::unique_ptr<CudaLane>> lanes);

  void OnLaneStart(int lane) override;
  // Device faults (cuda_worker_faults.cc): a real trapped kernel for --inject_device_fault,
  // and the reset of the device's context that puts it back in service.
  absl::Status InjectFault(int lane) override;
  absl::Status ResetDevice() override;
  absl::StatusOr<ForwardResult> Execute(const ForwardInputs& inputs, int lane) override;
  absl::StatusOr<BackwardResult> Execute(const BackwardInputs& inputs, int lane) override;
  std::vector<absl::StatusOr<ForwardResult>> ExecuteBatch(
      const std::vector<const ForwardInputs*>& parts, int lane) override;
  std::vector<absl::StatusOr<BackwardResult>> ExecuteBatch(
      const std::vector<const BackwardInputs*>& parts, int lane) override;
  absl::StatusOr<ForwardResult> ExecuteKeeping(const ForwardInputs& inputs, int lane,
                                               std::unique_ptr<ContextMemory>* kept) override;
  absl::StatusOr<BackwardResult> ExecuteOnContext(const BackwardInputs& inputs,
                                                  const SavedContext& context,
                                                  int lane) override;
  // Gathers the parts in, runs a GPU family on the lane's stream as one launch, splits the
  // outputs into each part's answer. With `keep` (one part only), the launch buffer is kept
  // there: the part's saved context. Work estimated past --max_launch_seconds runs as several
  // launches (launch_split.h), and `lane`'s stop condition is checked between them.
  std::vector<absl::StatusOr<ForwardResult>> RunOnDevice(
      const kernels::KernelFamilyEntry& family, const std::vector<const ForwardInputs*>& parts,
      int lane, std::unique_ptr<KeptDeviceMemory>* keep = nullptr);
  // A backward whose q, k, v, out, lse and offsets are a context in this device's memory:
  // only dout is copied in.
  absl::StatusOr<BackwardResult> RunOnContext(const kernels::KernelFamilyEntry& family,
                                              const BackwardInputs& inputs,
                                              const ContextMemory& context, int lane);
  std::vector<absl::StatusOr<BackwardResult>> RunOnDevice(
      const kernels::KernelFamilyEntry& family, const std::vector<const BackwardInputs*>& parts,
      int lane);
  // The launches a request of these offsets runs as on this device (launch_split.h); empty:
  // one. Row bytes: what crosses the host link per query and per key row.
  // `first`, `end`: only those sequences (end -1: to the last).
  std::vector<LaunchRange> SplitOf(const kernels::KernelFamilyEntry& family, Direction direction,
                                   const TensorView& q, const std::vector<int32_t>& cu_seqlens_q,
                                   const std::vector<int32_t>& cu_seqlens_k,
                                   const RequestOptions& options, double query_row_bytes,
                                   double key_row_bytes, int32_t first = 0,
                                   int32_t end = -1) const;
  // The same for a request arriving group by group (`in.groups`): when the whole exceeds the
  // slice, each group cut where it alone does, and the stop check between launches on `lane`;
  // else nothing (a launch per group, as before). `launches` receives the count.
  template <typename Inputs>
  GroupCut ArrivalCut(const kernels::KernelFamilyEntry& family, Direction direction,
                      const Inputs& in, double query_row_bytes, double key_row_bytes, int lane,
                      size_t* launches) const;
  // Runs between the launches of a split request on `lane`: CANCELLED once every request in
  // the launch passed its deadline or lost its caller (QueueWorker turns it into
  // DEADLINE_EXCEEDED when the deadline passed, as for the CPU device's stop).
  LaunchHooks StopHooks(int lane) const;
  // A backward cut into `split`'s launches on `lane`, stopping between them; `context`: the
  // device context it reads, or null.
  absl::StatusOr<LaneRun> RunBackwardSplit(const kernels::KernelFamilyEntry& family,
                                           const Route& route,
                                           const BackwardLaunchSet& set,
                                           const std::vector<LaunchRange>& split, int lane,
                                           const ContextMemory* context);
  void RecordSplit(size_t launches);
  // One backward's answer from its run: dq, dk, dv at their destinations or in the lane's
  // pinned memory (copied into the result).
  absl::StatusOr<BackwardResult> BackwardAnswer(const kernels::KernelFamilyEntry& family,
                                                const BackwardInputs& inputs,
                                                const absl::StatusOr<LaneRun>& run);
  // The same for one forward: out and lse.
  absl::StatusOr<ForwardResult> ForwardAnswer(const kernels::KernelFamilyEntry& family,
                                              const ForwardInputs& inputs,
                                              const absl::StatusOr<LaneRun>& run);
  // Requests whose tensors lie in this device's memory (cuda_resident.h).
  absl::StatusOr<ForwardResult> ExecuteResident(const ForwardInputs& inputs, int lane);
  absl::StatusOr<BackwardResult> ExecuteResident(const BackwardInputs& inputs, int lane);
  ExecutionReport Report(const kernels::KernelFamilyEntry& family, const LaneRun& run) const;
  void RecordPhases(const LaneRun& run, absl::Duration stage_out);
  // The launch context of a job's route: the routed compute capability, and the planned code
  // path pinned (kernels/kernel_families.h PinPlan) so the family runs that path.
  kernels::ExecutionContext DeviceContext(const Route& route, cudaStream_t stream,
                                          void* workspace, size_t workspace_bytes) const;
  DeviceContextFn DeviceContextMaker(const Route& route) const;
  void PublishMemoryUse();

  std::vector<std::unique_ptr<CudaLane>> lanes_;
  const int stage_threads_per_lane_;  // to make the lanes again after a reset
  const double max_launch_seconds_;   // 0: never split
  const int host_threads_;            // --cpu_threads, for the rate table
  const kernels::ExecutionContext cpu_context_;
  const int compute_capability_;  // major * 10 + minor, as routed (possibly emulated)
  const KernelCatalog catalog_;    // built families, or the one --kernel forces
  metrics::ServerMetrics* const metrics_;
  std::atomic<int64_t> memory_published_ms_{0};  // when PublishMemoryUse last asked the driver
};

}  // namespace attnserve::engine
