#include "server/engine/transport_ceiling_engine.h"

#include <utility>

#include "absl/status/status.h"
#include "server/engine/request_validation.h"

namespace attnserve::engine {
namespace {

// A tensor of `shape` and `dtype`, every byte zero.
OwnedTensor Zeros(DType dtype, std::vector<int64_t> shape) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  OwnedTensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.data.assign(static_cast<size_t>(elements) * kernels::DTypeSize(dtype), '\0');
  return tensor;
}

ExecutionReport CeilingReport() {
  ExecutionReport report;
  report.device = "none";
  report.kernel = TransportCeilingEngine::kFamily;
  report.code_path = TransportCeilingEngine::kFamily;  // no kernel, so no path within it
  return report;
}

}  // namespace

TransportCeilingEngine::TransportCeilingEngine(std::unique_ptr<Engine> inner)
    : inner_(std::move(inner)) {}

absl::Status TransportCeilingEngine::Enqueue(ForwardJob job) {
  if (absl::Status s = ValidateForward(job.inputs, limits()); !s.ok()) return s;
  const TensorView& q = job.inputs.q;
  ForwardResult result;
  result.out = Zeros(q.dtype, q.shape);
  result.lse = Zeros(DType::kFloat32, {q.shape[1], q.shape[0]});
  result.execution = CeilingReport();
  job.done(std::move(result));
  return absl::OkStatus();
}

absl::Status TransportCeilingEngine::Enqueue(BackwardJob job) {
  if (!job.inputs.context_id.empty()) {
    return absl::FailedPreconditionError(
        "context_id: this server runs with --transport_ceiling and keeps no contexts");
  }
  if (absl::Status s = ValidateBackward(job.inputs, limits()); !s.ok()) return s;
  const BackwardInputs& in = job.inputs;
  BackwardResult result;
  result.dq = Zeros(in.q.dtype, in.q.shape);
  result.dk = Zeros(in.k.dtype, in.k.shape);
  result.dv = Zeros(in.v.dtype, in.v.shape);
  result.execution = CeilingReport();
  job.done(std::move(result));
  return absl::OkStatus();
}

}  // namespace attnserve::engine
