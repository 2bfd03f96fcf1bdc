#include "server/engine/cuda_worker.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/kernel_families.h"
#include "server/engine/batching.h"
#include "server/engine/cpu_worker.h"
#include "server/engine/cuda_context.h"
#include "server/engine/cuda_grouped_backward.h"
#include "server/engine/cuda_grouped_forward.h"
#include "server/engine/cuda_ipc.h"
#include "server/engine/cuda_resident.h"
#include "server/engine/kernel_routing.h"
#include "server/engine/kernel_launch_status.h"
#include "server/engine/kernel_runner.h"
#include "server/engine/resident_device.h"

namespace attnserve::engine {
namespace {

int ParseComputeCapability(const std::string& cc) {
  const size_t dot = cc.find('.');
  return std::stoi(cc.substr(0, dot)) * 10 + std::stoi(cc.substr(dot + 1));
}

HostBytes Bytes(const std::vector<int32_t>& v) { return {v.data(), v.size() * sizeof(int32_t)}; }

GatheredInput Gathered(const std::vector<Piece>& pieces) {
  GatheredInput gathered;
  for (const Piece& piece : pieces) gathered.push_back({piece.data, piece.size});
  return gathered;
}

int64_t RowBytes(const TensorView& t) {
  return t.shape[1] * t.shape[2] * kernels::DTypeSize(t.dtype);
}

// The built family the router picked, or FAILED_PRECONDITION saying why none can run it
// (only possible when --kernel forces one family).
absl::StatusOr<const kernels::KernelFamilyEntry*> FamilyEntry(const Route& route) {
  if (route.family.empty()) return absl::FailedPreconditionError(route.reason);
  const kernels::KernelFamilyEntry* entry = kernels::FindKernelFamily(route.family);
  if (entry == nullptr) {
    return absl::InternalError(absl::StrCat("kernel family ", route.family, " is not built"));
  }
  return entry;
}

// Where a launch's outputs go: a lone request's output space (its overlays included: every
// input has crossed to the device before an output comes back), none for a batch, whose
// outputs are split out of pinned memory.
template <typename Inputs>
std::vector<char*> DestinationsOf(const std::vector<const Inputs*>& parts) {
  return parts.size() == 1 ? parts[0]->output_space.destinations : std::vector<char*>{};
}

bool Given(const std::vector<char*>& destinations, size_t output) {
  return output < destinations.size() && destinations[output] != nullptr;
}

// A backward's launch set, but for its tensors (the caller's to add): the shapes and offsets of
// the whole (a batch's merged), the request's options, where the outputs go.
BackwardLaunchSet BackwardSetOf(const BackwardInputs& first, const TensorView& q,
                                const TensorView& k, const std::vector<int32_t>& cu_seqlens_q,
                                const std::vector<int32_t>& cu_seqlens_k,
                                const std::vector<char*>& destinations) {
  BackwardLaunchSet set;
  set.q = q;
  set.k = k;
  set.cu_seqlens_q = &cu_seqlens_q;
  set.cu_seqlens_k = &cu_seqlens_k;
  set.options = first.options;
  set.deterministic = first.deterministic;
  set.code_path = first.route.code_path;
  set.destinations = destinations;
  return set;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaWorker>> CudaWorker::Create(devices::DeviceDescription device,
                                                               const EngineOptions& options,
                                                               metrics::ServerMetrics* metrics,
                                                               ContextStore* contexts) {
  if (absl::Status s = CudaStatus(cudaSetDevice(device.ordinal), "cudaSetDevice"); !s.ok()) {
    return s;
  }
  // Keep freed device memory in the pool instead of returning it to the driver after every
  // request: requests of similar sizes then allocate without a driver call.
  cudaMemPool_t pool;
  if (absl::Status s = CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device.ordinal),
                                  "cudaDeviceGetDefaultMemPool");
      !s.ok()) {
    return s;
  }
  uint64_t keep_everything = UINT64_MAX;
  if (absl::Status s = CudaStatus(
          cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything),
          "cudaMemPoolSetAttribute");
      !s.ok()) {
    return s;
  }
  std::vector<std::unique_ptr<CudaLane>> lanes;
  // Several lanes keep the host's copies, the copy engines and the SMs busy at once: while one
  // request is gathered into pinned memory, another's inputs cross PCIe and a third computes.
  for (int i = 0; i < std::max(1, options.cuda_lanes); ++i) {
    absl::StatusOr<std::unique_ptr<CudaLane>> lane = CudaLane::Create(device.ordinal, options.stage_threads_per_lane);
    if (!lane.ok()) return lane.status();
    lanes.push_back(*std::move(lane));
  }
  return std::unique_ptr<CudaWorker>(
      new CudaWorker(std::move(device), options, metrics, contexts, std::move(lanes)));
}

CudaWorker::CudaWorker(devices::DeviceDescription device, const EngineOptions& options,
                       metrics::ServerMetrics* metrics, ContextStore* contexts,
                       std::vector<std::unique_ptr<CudaLane>> lanes)
    : QueueWorker(device, options, metrics, contexts),
      lanes_(std::move(lanes)),
      stage_threads_per_lane_(options.stage_threads_per_lane),
      max_launch_seconds_(options.max_launch_seconds),
      host_threads_(options.cpu_threads),
      cpu_context_{options.cpu_threads},
      compute_capability_(ParseComputeCapability(device.compute_capability)),
      catalog_(options.forced_kernel_family.empty()
                   ? KernelCatalog::Built()
                   : KernelCatalog::Only(options.forced_kernel_family)),
      metrics_(metrics) {
  StartLanes(static_cast<int>(lanes_.size()));
}

CudaWorker::~CudaWorker() { Stop(); }

std::vector<std::string> CudaWorker::kernel_families() const {
  // The families the routing table can pick on this device for some request.
  std::vector<std::string> families;
  for (const CoverageRow& row : coverage()) {
    if (std::find(families.begin(), families.end(), row.family) == families.end()) {
      families.push_back(row.family);
    }
  }
  return families;
}

std::vector<CoverageRow> CudaWorker::coverage() const {
  return CoverageFor(compute_capability_, device().shared_memory_per_block, catalog_);
}

void CudaWorker::OnLaneStart(int lane) { cudaSetDevice(lanes_[lane]->ordinal()); }

absl::StatusOr<ForwardResult> CudaWorker::Execute(const ForwardInputs& inputs, int lane) {
  if (IsResident(inputs)) return ExecuteResident(inputs, lane);
  absl::StatusOr<const kernels::KernelFamilyEntry*> family =
      FamilyEntry(inputs.route);
  if (!family.ok()) return family.status();
  // Empty requests need no device: the reference answers them without copies.
  if ((*family)->runs_on_device && inputs.q.shape[0] > 0) {
    return std::move(RunOnDevice(**family, {&inputs}, lane)[0]);
  }
  // The reference family runs on the host: Execution reports device "cpu".
  absl::StatusOr<ForwardResult> result = RunForward(kReferenceFamily, inputs, cpu_context_);
  if (result.ok()) result->execution.device = "cpu";
  return result;
}

absl::StatusOr<BackwardResult> CudaWorker::Execute(const BackwardInputs& inputs, int lane) {
  if (IsResident(inputs)) return ExecuteResident(inputs, lane);
  absl::StatusOr<const kernels::KernelFamilyEntry*> family =
      FamilyEntry(inputs.route);
  if (!family.ok()) return family.status();
  if ((*family)->runs_on_device && inputs.q.shape[0] > 0 && inputs.k.shape[0] > 0) {
    return std::move(RunOnDevice(**family, {&inputs}, lane)[0]);
  }
  absl::StatusOr<BackwardResult> result = RunBackward(kReferenceFamily, inputs, cpu_context_);
  if (result.ok()) result->execution.device = "cpu";
  return result;
}

absl::StatusOr<ForwardResult> CudaWorker::ExecuteKeeping(const ForwardInputs& inputs, int lane,
                                                         std::unique_ptr<ContextMemory>* kept) {
  absl::StatusOr<const kernels::KernelFamilyEntry*> family =
      FamilyEntry(inputs.route);
  if (!family.ok()) return family.status();
  if (!(*family)->runs_on_device || inputs.q.shape[0] == 0) {
    // Ran on the host: its context is kept there too.
    return QueueWorker::ExecuteKeeping(inputs, lane, kept);
  }
  std::unique_ptr<KeptDeviceMemory> buffer;
  absl::StatusOr<ForwardResult> result =
      std::move(RunOnDevice(**family, {&inputs}, lane, &buffer)[0]);
  if (result.ok() && buffer != nullptr) *kept = ContextInForwardBuffer(std::move(buffer));
  return result;
}

absl::StatusOr<BackwardResult> CudaWorker::ExecuteOnContext(const BackwardInputs& inputs,
                                                           const SavedContext& context,
                                                           int lane) {
  // A host context fills the inputs with host views: the ordinary path reads them.
  if (context.memory->on_host()) return Execute(inputs, lane);
  absl::StatusOr<const kernels::KernelFamilyEntry*> family =
      FamilyEntry(inputs.route);
  if (!family.ok()) return family.status();
  if ((*family)->runs_on_device && inputs.q.shape[0] > 0 && inputs.k.shape[0] > 0) {
    return RunOnContext(**family, inputs, *context.memory, lane);
  }
  // The backward runs on the host: it reads host copies of the context.
  absl::StatusOr<std::unique_ptr<ContextMemory>> host = CopyToHost(context);
  if (!host.ok()) return host.status();
  SavedContext on_host;
  on_host.spec = context.spec;
  on_host.memory = *std::move(host);
  BackwardInputs filled = inputs;
  FillFromContext(on_host, filled);
  return Execute(filled, lane);
}

kernels::ExecutionContext CudaWorker::DeviceContext(const Route& route, cudaStream_t stream,
                                                    void* workspace,
                                                    size_t workspace_bytes) const {
  kernels::ExecutionContext ctx;
  ctx.stream = stream;
  ctx.workspace = workspace;
  ctx.workspace_bytes = workspace_bytes;
  // The device's capability as the router saw it: under --emulate_compute_capability the
  // families run the emulated architecture's code path.
  ctx.compute_capability = compute_capability_;
  // The family runs the code path placement planned, not one it would pick on its own.
  if (const kernels::KernelFamilyEntry* family = kernels::FindKernelFamily(route.family)) {
    kernels::KernelPlan plan;
    plan.ok = true;
    plan.code_path = route.code_path;
    kernels::PinPlan(*family, plan, &ctx);
  }
  return ctx;
}

DeviceContextFn CudaWorker::DeviceContextMaker(const Route& route) const {
  return [this, route](cudaStream_t stream, void* workspace, size_t bytes) {
    return DeviceContext(route, stream, workspace, bytes);
  };
}

std::vector<absl::StatusOr<ForwardResult>> CudaWorker::ExecuteBatch(
    const std::vector<const ForwardInputs*>& parts, int lane) {
  if (parts.size() == 1 && IsResident(*parts[0])) return {Execute(*parts[0], lane)};
  // Parts of a batch share their route (batching.cc Compatible).
  absl::StatusOr<const kernels::KernelFamilyEntry*> family =
      FamilyEntry(parts[0]->route);
  if (family.ok() && (*family)->runs_on_device && QueryTokens(*parts[0]) > 0) {
    // Nonzero rows in one part mean nonzero rows in the merge.
    return RunOnDevice(**family, parts, lane);
  }
  return QueueWorker::ExecuteBatch(parts, lane);
}

std::vector<absl::StatusOr<BackwardResult>> CudaWorker::ExecuteBatch(
    const std::vector<const BackwardInputs*>& parts, int lane) {
  if (parts.size() == 1 && IsResident(*parts[0])) return {Execute(*parts[0], lane)};
  absl::StatusOr<const kernels::KernelFamilyEntry*> family =
      FamilyEntry(parts[0]->route);
  if (family.ok() && (*family)->runs_on_device && QueryTokens(*parts[0]) > 0 &&
      KeyTokens(*parts[0]) > 0) {
    return RunOnDevice(**family, parts, lane);
  }
  return QueueWorker::ExecuteBatch(parts, lane);
}

// The parts' tensors are gathered straight into the lane's pinned buffer (no merged copy on
// the host), run as one varlen launch, and each part's rows are copied out of the pinned buffer
// into its own answer: one host copy each way per byte.
std::vector<absl::StatusOr<ForwardResult>> CudaWorker::RunOnDevice(
    const kernels::KernelFamilyEntry& family, const std::vector<const ForwardInputs*>& parts,
    int lane_index, std::unique_ptr<KeptDeviceMemory>* keep) {
  CudaLane& lane = *lanes_[lane_index];
  const ForwardInputs& first = *parts[0];
  const BatchLayout layout = LayOutBatch(parts);
  const int64_t total_q = layout.q_row.back(), total_k = layout.k_row.back();
  TensorView q = first.q, k = first.k;
  q.shape[0] = total_q;
  k.shape[0] = total_k;
  kernels::ForwardParams params;
  params.shape = ShapeOf(q, k, layout.cu_seqlens_q, layout.cu_seqlens_k);
  params.options = ResolveOptions(first.options, params.shape.head_dim);
  const int64_t heads = params.shape.num_heads;
  const int64_t q_row_bytes = RowBytes(first.q);
  const size_t lse_bytes = sizeof(float) * heads * total_q;
  const size_t workspace_bytes = family.forward_workspace_bytes(params);
  const std::vector<char*> destinations = DestinationsOf(parts);
  // Per query row: q and out, and lse's float per head; per key row: k and v.
  const double query_row = 2.0 * q_row_bytes + sizeof(float) * heads;
  const double key_row = 2.0 * static_cast<double>(RowBytes(first.k));
  const std::vector<LaunchRange> split =
      first.groups != nullptr
          ? std::vector<LaunchRange>{}
          : SplitOf(family, Direction::kForward, q, layout.cu_seqlens_q, layout.cu_seqlens_k,
                    first.options, query_row, key_row);
  absl::StatusOr<LaneRun> run;
  if (first.groups != nullptr) {
    // A forward still arriving (it runs alone: one part) runs group by group as it arrives.
    size_t launches = 0;
    const GroupCut cut =
        ArrivalCut(family, Direction::kForward, first, query_row, key_row, lane_index, &launches);
    run = RunForwardInGroups(family, first, lane, DeviceContextMaker(first.route), keep, cut);
    if (cut.cut) RecordSplit(launches);
  } else if (!split.empty()) {
    ForwardLaunchSet set;
    set.q = q;
    set.k = k;
    set.q_data = Gathered(RowPieces(parts, &ForwardInputs::q));
    set.k_data = Gathered(RowPieces(parts, &ForwardInputs::k));
    set.v_data = Gathered(RowPieces(parts, &ForwardInputs::v));
    set.cu_seqlens_q = &layout.cu_seqlens_q;
    set.cu_seqlens_k = &layout.cu_seqlens_k;
    set.options = first.options;
    set.destinations = destinations;
    const GroupLaunches plan =
        PlanSplitLaunches(split, q, k, layout.cu_seqlens_q, layout.cu_seqlens_k);
    const LaunchHooks hooks = StopHooks(lane_index);
    run = RunForwardLaunches(family, set, plan, hooks, lane, DeviceContextMaker(first.route), keep);
    RecordSplit(split.size());
  } else {
    run = lane.Run(
        {Gathered(RowPieces(parts, &ForwardInputs::q)),
         Gathered(RowPieces(parts, &ForwardInputs::k)),
         Gathered(RowPieces(parts, &ForwardInputs::v)), {Bytes(layout.cu_seqlens_q)},
         {Bytes(layout.cu_seqlens_k)}},
        {static_cast<size_t>(total_q * q_row_bytes), lse_bytes}, workspace_bytes,
        [&](const DeviceBuffers& d, cudaStream_t stream) {
          params.q = d.inputs[0];
          params.k = d.inputs[1];
          params.v = d.inputs[2];
          params.shape.cu_seqlens_q_device = reinterpret_cast<const int32_t*>(d.inputs[3]);
          params.shape.cu_seqlens_k_device = reinterpret_cast<const int32_t*>(d.inputs[4]);
          params.out = d.outputs[0];
          params.lse = reinterpret_cast<float*>(d.outputs[1]);
          return KernelLaunchStatus(family, "forward",
                            family.forward(params, DeviceContext(first.route, stream, d.workspace,
                                                                 workspace_bytes)));
        },
        keep, destinations);
  }
  if (!run.ok()) return std::vector<absl::StatusOr<ForwardResult>>(parts.size(), run.status());
  const absl::Time split_start = absl::Now();
  std::vector<absl::StatusOr<ForwardResult>> answers;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t first_row = layout.q_row[i], rows = layout.q_row[i + 1] - first_row;
    ForwardResult result;
    result.out = {first.q.dtype, parts[i]->q.shape, ""};
    result.lse = {DType::kFloat32, {heads, rows}, ""};
    if (!Given(destinations, 0)) {
      result.out.data = RowsOf(run->outputs[0], q_row_bytes, first_row, rows);
    }
    if (!Given(destinations, 1)) {
      result.lse.data = LseColumnsOf(run->outputs[1], heads, total_q, first_row, rows);
    }
    result.execution = Report(family, *run);
    answers.push_back(std::move(result));
  }
  RecordPhases(*run, absl::Now() - split_start);
  return answers;
}

std::vector<absl::StatusOr<BackwardResult>> CudaWorker::RunOnDevice(
    const kernels::KernelFamilyEntry& family, const std::vector<const BackwardInputs*>& parts,
    int lane_index) {
  CudaLane& lane = *lanes_[lane_index];
  const BackwardInputs& first = *parts[0];
  const BatchLayout layout = LayOutBatch(parts);
  const int64_t total_q = layout.q_row.back(), total_k = layout.k_row.back();
  TensorView q = first.q, k = first.k;
  q.shape[0] = total_q;
  k.shape[0] = total_k;
  kernels::BackwardParams params;
  params.shape = ShapeOf(q, k, layout.cu_seqlens_q, layout.cu_seqlens_k);
  params.options = ResolveOptions(first.options, params.shape.head_dim);
  params.deterministic = first.deterministic;
  const int64_t q_row_bytes = RowBytes(first.q), k_row_bytes = RowBytes(first.k);
  const size_t workspace_bytes = family.backward_workspace_bytes(params, first.route.code_path);
  const std::vector<char*> destinations = DestinationsOf(parts);
  // Per query row: dout, q, out, dq, and lse's float per head; per key row: k, v, dk, dv.
  const double query_row = 4.0 * q_row_bytes + sizeof(float) * q.shape[1];
  const double key_row = 4.0 * k_row_bytes;
  if (first.groups != nullptr) {
    // A backward still arriving (it runs alone: one part) runs group by group as it arrives.
    size_t launches = 0;
    const GroupCut cut =
        ArrivalCut(family, Direction::kBackward, first, query_row, key_row, lane_index, &launches);
    std::vector<absl::StatusOr<BackwardResult>> answers = {BackwardAnswer(
        family, first,
        RunBackwardInGroups(family, first, lane, DeviceContextMaker(first.route), nullptr, cut))};
    if (cut.cut) RecordSplit(launches);
    return answers;
  }
  const std::vector<LaunchRange> split =
      SplitOf(family, Direction::kBackward, q, layout.cu_seqlens_q, layout.cu_seqlens_k,
              first.options, query_row, key_row);
  absl::StatusOr<LaneRun> run;
  if (!split.empty()) {
    BackwardLaunchSet set =
        BackwardSetOf(first, q, k, layout.cu_seqlens_q, layout.cu_seqlens_k, destinations);
    set.tensors = {Gathered(RowPieces(parts, &BackwardInputs::dout)),
                   Gathered(RowPieces(parts, &BackwardInputs::q)),
                   Gathered(RowPieces(parts, &BackwardInputs::k)),
                   Gathered(RowPieces(parts, &BackwardInputs::v)),
                   Gathered(RowPieces(parts, &BackwardInputs::out)), Gathered(LsePieces(parts))};
    run = RunBackwardSplit(family, first.route, set, split, lane_index, nullptr);
  } else {
    run = lane.Run(
        {Gathered(RowPieces(parts, &BackwardInputs::dout)),
         Gathered(RowPieces(parts, &BackwardInputs::q)),
         Gathered(RowPieces(parts, &BackwardInputs::k)),
         Gathered(RowPieces(parts, &BackwardInputs::v)),
         Gathered(RowPieces(parts, &BackwardInputs::out)), Gathered(LsePieces(parts)),
         {Bytes(layout.cu_seqlens_q)}, {Bytes(layout.cu_seqlens_k)}},
        {static_cast<size_t>(total_q * q_row_bytes), static_cast<size_t>(total_k * k_row_bytes),
         static_cast<size_t>(total_k * k_row_bytes)},
        workspace_bytes,
        [&](const DeviceBuffers& d, cudaStream_t stream) {
          params.dout = d.inputs[0];
          params.q = d.inputs[1];
          params.k = d.inputs[2];
          params.v = d.inputs[3];
          params.out = d.inputs[4];
          params.lse = reinterpret_cast<const float*>(d.inputs[5]);
          params.shape.cu_seqlens_q_device = reinterpret_cast<const int32_t*>(d.inputs[6]);
          params.shape.cu_seqlens_k_device = reinterpret_cast<const int32_t*>(d.inputs[7]);
          params.dq = d.outputs[0];
          params.dk = d.outputs[1];
          params.dv = d.outputs[2];
          return KernelLaunchStatus(family, "backward",
                            family.backward(params, DeviceContext(first.route, stream, d.workspace,
                                                                  workspace_bytes)));
        },
        /*keep=*/nullptr, destinations);
  }
  if (!run.ok()) return std::vector<absl::StatusOr<BackwardResult>>(parts.size(), run.status());
  const absl::Time split_start = absl::Now();
  std::vector<absl::StatusOr<BackwardResult>> answers;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t q_first = layout.q_row[i], q_rows = layout.q_row[i + 1] - q_first;
    const int64_t k_first = layout.k_row[i], k_rows = layout.k_row[i + 1] - k_first;
    BackwardResult result;
    result.dq = {first.q.dtype, parts[i]->q.shape, ""};
    result.dk = {first.k.dtype, parts[i]->k.shape, ""};
    result.dv = {first.v.dtype, parts[i]->v.shape, ""};
    if (!Given(destinations, 0)) {
      result.dq.data = RowsOf(run->outputs[0], q_row_bytes, q_first, q_rows);
    }
    if (!Given(destinations, 1)) {
      result.dk.data = RowsOf(run->outputs[1], k_row_bytes, k_first, k_rows);
    }
    if (!Given(destinations, 2)) {
      result.dv.data = RowsOf(run->outputs[2], k_row_bytes, k_first, k_rows);
    }
    result.execution = Report(family, *run);
    answers.push_back(std::move(result));
  }
  RecordPhases(*run, absl::Now() - split_start);
  return answers;
}

absl::StatusOr<BackwardResult> CudaWorker::RunOnContext(const kernels::KernelFamilyEntry& family,
                                                        const BackwardInputs& inputs,
                                                        const ContextMemory& context,
                                                        int lane_index) {
  CudaLane& lane = *lanes_[lane_index];
  // Only dout comes in and dq, dk, dv go out: the rest lies in the context.
  const double query_row = 2.0 * RowBytes(inputs.q), key_row = 2.0 * RowBytes(inputs.k);
  if (inputs.groups != nullptr) {
    // dout still arriving: it runs group by group as it arrives.
    size_t launches = 0;
    const GroupCut cut = ArrivalCut(family, Direction::kBackward, inputs, query_row, key_row,
                                    lane_index, &launches);
    absl::StatusOr<BackwardResult> answer = BackwardAnswer(
        family, inputs,
        RunBackwardInGroups(family, inputs, lane, DeviceContextMaker(inputs.route), &context, cut));
    if (cut.cut) RecordSplit(launches);
    return answer;
  }
  kernels::BackwardParams params;
  // Host offsets (the context's spec, filled in) for the shape's maxima; device ones below.
  params.shape = ShapeOf(inputs.q, inputs.k, inputs.cu_seqlens_q, inputs.cu_seqlens_k);
  params.options = ResolveOptions(inputs.options, params.shape.head_dim);
  params.deterministic = inputs.deterministic;
  const size_t q_bytes = inputs.q.size_bytes, k_bytes = inputs.k.size_bytes;
  const size_t workspace_bytes = family.backward_workspace_bytes(params, inputs.route.code_path);
  const std::vector<char*>& destinations = inputs.output_space.destinations;
  const std::vector<LaunchRange> split =
      SplitOf(family, Direction::kBackward, inputs.q, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
              inputs.options, query_row, key_row);
  if (!split.empty()) {
    BackwardLaunchSet set = BackwardSetOf(inputs, inputs.q, inputs.k, inputs.cu_seqlens_q,
                                          inputs.cu_seqlens_k, destinations);
    set.tensors = {{HostBytes{inputs.dout.data, inputs.dout.size_bytes}}};
    return BackwardAnswer(family, inputs,
                          RunBackwardSplit(family, inputs.route, set, split, lane_index, &context));
  }
  absl::StatusOr<LaneRun> run = lane.Run(
      {{HostBytes{inputs.dout.data, inputs.dout.size_bytes}}}, {q_bytes, k_bytes, k_bytes},
      workspace_bytes, [&](const DeviceBuffers& d, cudaStream_t stream) {
        params.dout = d.inputs[0];
        params.q = context.address(ContextTensor::kQ);
        params.k = context.address(ContextTensor::kK);
        params.v = context.address(ContextTensor::kV);
        params.out = context.address(ContextTensor::kOut);
        params.lse = reinterpret_cast<const float*>(context.address(ContextTensor::kLse));
        params.shape.cu_seqlens_q_device =
            reinterpret_cast<const int32_t*>(context.address(ContextTensor::kCuSeqlensQ));
        params.shape.cu_seqlens_k_device =
            reinterpret_cast<const int32_t*>(context.address(ContextTensor::kCuSeqlensK));
        params.dq = d.outputs[0];
        params.dk = d.outputs[1];
        params.dv = d.outputs[2];
        return KernelLaunchStatus(family, "backward",
                          family.backward(params, DeviceContext(inputs.route, stream, d.workspace,
                                                                workspace_bytes)));
      },
      /*keep=*/nullptr, destinations);
  return BackwardAnswer(family, inputs, run);
}

absl::StatusOr<BackwardResult> CudaWorker::BackwardAnswer(const kernels::KernelFamilyEntry& family,
                                                          const BackwardInputs& inputs,
                                                          const absl::StatusOr<LaneRun>& run) {
  if (!run.ok()) return run.status();
  const absl::Time split_start = absl::Now();
  BackwardResult result;
  result.dq = {inputs.q.dtype, inputs.q.shape, ""};
  result.dk = {inputs.k.dtype, inputs.k.shape, ""};
  result.dv = {inputs.v.dtype, inputs.v.shape, ""};
  const std::vector<char*>& destinations = inputs.output_space.destinations;
  const size_t sizes[] = {inputs.q.size_bytes, inputs.k.size_bytes, inputs.v.size_bytes};
  OwnedTensor* tensors[] = {&result.dq, &result.dk, &result.dv};
  for (size_t i = 0; i < 3; ++i) {
    if (!Given(destinations, i)) tensors[i]->data.assign(run->outputs[i], sizes[i]);
  }
  result.execution = Report(family, *run);
  RecordPhases(*run, absl::Now() - split_start);
  return result;
}

absl::StatusOr<ForwardResult> CudaWorker::ForwardAnswer(const kernels::KernelFamilyEntry& family,
                                                        const ForwardInputs& inputs,
                                                        const absl::StatusOr<LaneRun>& run) {
  if (!run.ok()) return run.status();
  const absl::Time split_start = absl::Now();
  const int64_t heads = inputs.q.shape[1], total_q = inputs.q.shape[0];
  ForwardResult result;
  result.out = {inputs.q.dtype, inputs.q.shape, ""};
  result.lse = {DType::kFloat32, {heads, total_q}, ""};
  const std::vector<char*>& destinations = inputs.output_space.destinations;
  if (!Given(destinations, 0)) result.out.data.assign(run->outputs[0], inputs.q.size_bytes);
  if (!Given(destinations, 1)) result.lse.data.assign(run->outputs[1], result.lse.size_bytes());
  result.execution = Report(family, *run);
  RecordPhases(*run, absl::Now() - split_start);
  return result;
}

absl::StatusOr<std::shared_ptr<ForeignDeviceMemory>> CudaWorker::OpenForeignMemory(
    const std::string& ipc_handle, uint64_t byte_size) {
  return OpenIpcMemory(device().ordinal, ipc_handle, byte_size);
}

namespace {

// Why a request whose tensors lie in device memory cannot take `family`'s route.
absl::Status HostFamilyRefused(const kernels::KernelFamilyEntry& family, const TensorView& q) {
  return absl::FailedPreconditionError(absl::StrCat(
      "tensors in CUDA shared memory need a GPU kernel family, and this request (",
      kernels::DTypeName(q.dtype), ", head_dim ", q.shape[2], ") routes to ", family.name,
      ", which runs on the host: send its tensors in the request or in system shared memory"));
}

}  // namespace

absl::StatusOr<ForwardResult> CudaWorker::ExecuteResident(const ForwardInputs& inputs, int lane) {
  absl::StatusOr<const kernels::KernelFamilyEntry*> family =
      FamilyEntry(inputs.route);
  if (!family.ok()) return family.status();
  if (!(*family)->runs_on_device) return HostFamilyRefused(**family, inputs.q);
  if (inputs.q.shape[0] == 0) {  // no query rows: out and lse have no bytes
    ForwardResult empty;
    empty.out = {inputs.q.dtype, inputs.q.shape, ""};
    empty.lse = {DType::kFloat32, {inputs.q.shape[1], 0}, ""};
    empty.execution.device = device().name;
    empty.execution.kernel = (*family)->name;
    return empty;
  }
  // Only the outputs may cross the host link (when they go to host memory): out and lse.
  const std::vector<LaunchRange> split = SplitOf(
      **family, Direction::kForward, inputs.q, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
      inputs.options, static_cast<double>(RowBytes(inputs.q) + sizeof(float) * inputs.q.shape[1]),
      0);
  if (!split.empty()) {
    RecordSplit(split.size());
    return ForwardAnswer(
        **family, inputs,
        RunResidentForwardLaunches(**family, inputs, split, StopHooks(lane), *lanes_[lane],
                                   DeviceContextMaker(inputs.route)));
  }
  return ForwardAnswer(**family, inputs,
                       RunResidentForward(**family, inputs, *lanes_[lane],
                                          DeviceContextMaker(inputs.route)));
}

absl::StatusOr<BackwardResult> CudaWorker::ExecuteResident(const BackwardInputs& inputs,
                                                           int lane) {
  absl::StatusOr<const kernels::KernelFamilyEntry*> family =
      FamilyEntry(inputs.route);
  if (!family.ok()) return family.status();
  if (!(*family)->runs_on_device) return HostFamilyRefused(**family, inputs.q);
  if (inputs.q.shape[0] > 0 && inputs.k.shape[0] > 0) {
    // Only the outputs may cross the host link (when they go to host memory): dq, dk, dv.
    const std::vector<LaunchRange> split =
        SplitOf(**family, Direction::kBackward, inputs.q, inputs.cu_seqlens_q,
                inputs.cu_seqlens_k, inputs.options, RowBytes(inputs.q), 2.0 * RowBytes(inputs.k));
    if (!split.empty()) {
      RecordSplit(split.size());
      return BackwardAnswer(
          **family, inputs,
          RunResidentBackwardLaunches(**family, inputs, split, StopHooks(lane), *lanes_[lane],
                                      DeviceContextMaker(inputs.route)));
    }
    return BackwardAnswer(
        **family, inputs,
        RunResidentBackward(**family, inputs, *lanes_[lane], DeviceContextMaker(inputs.route)));
  }
  // No query sees a key: every gradient is zero.
  BackwardResult zeros;
  OwnedTensor* tensors[] = {&zeros.dq, &zeros.dk, &zeros.dv};
  const TensorView* likes[] = {&inputs.q, &inputs.k, &inputs.v};
  const OutputSpace& space = inputs.output_space;
  for (size_t i = 0; i < 3; ++i) {
    *tensors[i] = {likes[i]->dtype, likes[i]->shape, ""};
    if (!Given(space.destinations, i)) {
      tensors[i]->data.assign(likes[i]->size_bytes, '\0');
    } else if (space.device >= 0) {
      if (absl::Status s = ZeroDeviceBytes(space.destinations[i], likes[i]->size_bytes,
                                           space.device);
          !s.ok()) {
        return s;
      }
    } else {
      std::memset(space.destinations[i], 0, likes[i]->size_bytes);
    }
  }
  zeros.execution.device = device().name;
  zeros.execution.kernel = (*family)->name;
  return zeros;
}

std::vector<LaunchRange> CudaWorker::SplitOf(const kernels::KernelFamilyEntry& family,
                                             Direction direction, const TensorView& q,
                                             const std::vector<int32_t>& cu_seqlens_q,
                                             const std::vector<int32_t>& cu_seqlens_k,
                                             const RequestOptions& options,
                                             double query_row_bytes, double key_row_bytes,
                                             int32_t first, int32_t end) const {
  SplitRequest request =
      SplitRequestOf(direction, q, cu_seqlens_q, cu_seqlens_k, options,
                     FamilyThroughput(family.name, compute_capability_, host_threads_));
  request.query_row_bytes = query_row_bytes;
  request.key_row_bytes = key_row_bytes;
  if (end < 0) end = static_cast<int32_t>(cu_seqlens_q.size()) - 1;
  return PlanLaunchSplit(request, max_launch_seconds_, first, end);
}

template <typename Inputs>
GroupCut CudaWorker::ArrivalCut(const kernels::KernelFamilyEntry& family, Direction direction,
                                const Inputs& in, double query_row_bytes, double key_row_bytes,
                                int lane, size_t* launches) const {
  GroupCut cut;
  if (SplitOf(family, direction, in.q, in.cu_seqlens_q, in.cu_seqlens_k, in.options,
              query_row_bytes, key_row_bytes)
          .empty()) {
    return cut;
  }
  cut.cut = [this, &family, direction, &in, query_row_bytes, key_row_bytes](int32_t first,
                                                                             int32_t end) {
    return SplitOf(family, direction, in.q, in.cu_seqlens_q, in.cu_seqlens_k, in.options,
                   query_row_bytes, key_row_bytes, first, end);
  };
  cut.before_launch = StopHooks(lane).before_launch;
  cut.launches = launches;
  return cut;
}

absl::StatusOr<LaneRun> CudaWorker::RunBackwardSplit(const kernels::KernelFamilyEntry& family,
                                                     const Route& route,
                                                     const BackwardLaunchSet& set,
                                                     const std::vector<LaunchRange>& split,
                                                     int lane, const ContextMemory* context) {
  const GroupLaunches plan =
      PlanSplitLaunches(split, set.q, set.k, *set.cu_seqlens_q, *set.cu_seqlens_k);
  RecordSplit(split.size());
  return RunBackwardLaunches(family, set, plan, StopHooks(lane), *lanes_[lane],
                             DeviceContextMaker(route), context);
}

LaunchHooks CudaWorker::StopHooks(int lane) const {
  LaunchHooks hooks;
  const std::function<bool()>& stop = LaneStop(lane);
  hooks.before_launch = [&stop]() -> absl::Status {
    if (stop && stop()) {
      return absl::CancelledError(
          "stopped between launches: its deadline passed or its caller cancelled");
    }
    return absl::OkStatus();
  };
  return hooks;
}

void CudaWorker::RecordSplit(size_t launches) {
  if (metrics_ != nullptr) metrics_->RecordSplitLaunches(device().name, launches);
}

ExecutionReport CudaWorker::Report(const kernels::KernelFamilyEntry& family,
                                   const LaneRun& run) const {
  ExecutionReport report;
  report.device = device().name;
  report.kernel = family.name;
  report.compute_us = static_cast<int64_t>(run.kernel_ms * 1000);
  return report;
}

void CudaWorker::RecordPhases(const LaneRun& run, absl::Duration stage_out) {
  PublishMemoryUse();
  if (metrics_ == nullptr) return;
  metrics_->RecordLaunchPhase(device().name, "stage_in", run.stage_in_seconds);
  metrics_->RecordLaunchPhase(device().name, "device", run.device_seconds);
  metrics_->RecordLaunchPhase(device().name, "stage_out", absl::ToDoubleSeconds(stage_out));
}

void CudaWorker::PublishMemoryUse() {
  if (metrics_ == nullptr) return;
  // At most every 100 ms: the driver call cost small requests a few percent.
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  int64_t last = memory_published_ms_.load(std::memory_order_relaxed);
  if (now_ms - last < 100 ||
      !memory_published_ms_.compare_exchange_strong(last, now_ms, std::memory_order_relaxed)) {
    return;
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    metrics_->SetDeviceMemoryUsed(device().name, static_cast<double>(total_bytes - free_bytes));
  }
}

}  // namespace attnserve::engine
