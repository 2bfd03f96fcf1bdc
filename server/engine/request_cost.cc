#include "server/engine/request_cost.h"

namespace attnserve::engine {
namespace {

double ForwardFlops(const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                    const TensorView& q, bool causal) {
  double pairs = 0;
  for (size_t b = 1; b < cu_q.size(); ++b) {
    pairs += static_cast<double>(cu_q[b] - cu_q[b - 1]) * (cu_k[b] - cu_k[b - 1]);
  }
  const double flops = 4.0 * pairs * static_cast<double>(q.shape[1]) * q.shape[2];
  return causal ? flops / 2 : flops;
}

}  // namespace

double AttentionFlops(const ForwardInputs& in) {
  return ForwardFlops(in.cu_seqlens_q, in.cu_seqlens_k, in.q, in.options.causal);
}

double AttentionFlops(const BackwardInputs& in) {
  return 2.5 * ForwardFlops(in.cu_seqlens_q, in.cu_seqlens_k, in.q, in.options.causal);
}

int64_t DeviceBytes(const ForwardInputs& in) {
  const int64_t lse = sizeof(float) * in.q.shape[0] * in.q.shape[1];
  return 2 * in.q.size_bytes + in.k.size_bytes + in.v.size_bytes + lse;
}

int64_t DeviceBytes(const BackwardInputs& in) {
  const int64_t inputs = in.dout.size_bytes + in.q.size_bytes + in.k.size_bytes +
                         in.v.size_bytes + in.out.size_bytes + in.lse.size_bytes;
  const int64_t outputs = in.q.size_bytes + in.k.size_bytes + in.v.size_bytes;
  return inputs + outputs + in.lse.size_bytes;  // scratch: one float per query row and head
}

}  // namespace attnserve::engine
