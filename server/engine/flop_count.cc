#include "server/engine/flop_count.h"

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

}  // namespace attnserve::engine
