#include "tools/attention_problem.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "attnserve/tensor_codec.h"
#include "kernels/reference/reference_attention.h"

namespace attnserve::tools {
namespace {

std::vector<int32_t> RandomOffsets(int batch, int max_len, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> length(std::max(1, max_len / 2), std::max(1, max_len));
  std::vector<int32_t> cu = {0};
  for (int b = 0; b < batch; ++b) cu.push_back(cu.back() + length(rng));
  return cu;
}

// Normal values rounded to the wire dtype, so local and remote inputs are identical.
std::vector<float> RandomValues(int64_t count, v1::DType dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& x : values) x = normal(rng);
  return *TensorToFloats(*MakeTensor(dtype, {count}, values));
}

v1::Tensor Tensor(v1::DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
  return *MakeTensor(dtype, shape, values);
}

v1::AttentionOptions Options(const ProblemSpec& spec) {
  v1::AttentionOptions options;
  options.set_softmax_scale(spec.softmax_scale);
  options.set_causal(spec.causal);
  if (spec.window_left) options.set_window_left(*spec.window_left);
  if (spec.window_right) options.set_window_right(*spec.window_right);
  options.set_softcap(spec.softcap);
  return options;
}

kernels::AttentionShape KernelShape(const Problem& p) {
  kernels::AttentionShape shape;
  shape.dtype = kernels::DType::kFloat32;
  shape.batch = p.spec.batch;
  shape.total_q = p.total_q();
  shape.total_k = p.total_k();
  shape.num_heads = p.spec.num_heads;
  shape.num_heads_k = p.spec.num_heads_k;
  shape.head_dim = p.spec.head_dim;
  shape.cu_seqlens_q = p.cu_seqlens_q.data();
  shape.cu_seqlens_k = p.cu_seqlens_k.data();
  return shape;
}

kernels::AttentionOptions KernelOptions(const ProblemSpec& spec) {
  kernels::AttentionOptions options;
  options.softmax_scale = spec.softmax_scale != 0.0f
                              ? spec.softmax_scale
                              : 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
  options.causal = spec.causal;
  options.window_left = spec.window_left.value_or(-1);
  options.window_right = spec.window_right.value_or(-1);
  options.softcap = spec.softcap;
  return options;
}

int MaxLength(const std::vector<int32_t>& lengths) {
  return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
}

std::vector<int32_t> Offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int32_t length : lengths) cu.push_back(cu.back() + length);
  return cu;
}

void FillRandomValues(Problem& p, std::mt19937_64& rng) {
  const ProblemSpec& spec = p.spec;
  const int64_t q_count = p.total_q() * spec.num_heads * spec.head_dim;
  const int64_t kv_count = p.total_k() * spec.num_heads_k * spec.head_dim;
  p.q = RandomValues(q_count, spec.dtype, rng);
  p.k = RandomValues(kv_count, spec.dtype, rng);
  p.v = RandomValues(kv_count, spec.dtype, rng);
  p.dout = RandomValues(q_count, spec.dtype, rng);
}

}  // namespace

Problem MakeRandomProblem(const ProblemSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  Problem p;
  p.spec = spec;
  p.cu_seqlens_q = RandomOffsets(spec.batch, spec.max_seqlen_q, rng);
  p.cu_seqlens_k = RandomOffsets(spec.batch, spec.max_seqlen_k, rng);
  FillRandomValues(p, rng);
  return p;
}

Problem MakeRandomProblem(const ProblemSpec& spec, const std::vector<int32_t>& seqlens_q,
                          const std::vector<int32_t>& seqlens_k) {
  std::mt19937_64 rng(spec.seed);
  Problem p;
  p.spec = spec;
  p.spec.batch = static_cast<int>(seqlens_q.size());
  p.spec.max_seqlen_q = MaxLength(seqlens_q);
  p.spec.max_seqlen_k = MaxLength(seqlens_k);
  p.cu_seqlens_q = Offsets(seqlens_q);
  p.cu_seqlens_k = Offsets(seqlens_k);
  FillRandomValues(p, rng);
  return p;
}

v1::ForwardRequest Problem::MakeForwardRequest() const {
  v1::ForwardRequest request;
  *request.mutable_q() = Tensor(spec.dtype, {total_q(), spec.num_heads, spec.head_dim}, q);
  *request.mutable_k() = Tensor(spec.dtype, {total_k(), spec.num_heads_k, spec.head_dim}, k);
  *request.mutable_v() = Tensor(spec.dtype, {total_k(), spec.num_heads_k, spec.head_dim}, v);
  request.mutable_cu_seqlens_q()->Assign(cu_seqlens_q.begin(), cu_seqlens_q.end());
  request.mutable_cu_seqlens_k()->Assign(cu_seqlens_k.begin(), cu_seqlens_k.end());
  *request.mutable_options() = Options(spec);
  return request;
}

v1::BackwardRequest Problem::MakeBackwardRequest(const std::vector<float>& out,
                                                 const std::vector<float>& lse) const {
  const std::vector<int64_t> q_shape = {total_q(), spec.num_heads, spec.head_dim};
  const std::vector<int64_t> kv_shape = {total_k(), spec.num_heads_k, spec.head_dim};
  v1::BackwardRequest request;
  *request.mutable_dout() = Tensor(spec.dtype, q_shape, dout);
  *request.mutable_q() = Tensor(spec.dtype, q_shape, q);
  *request.mutable_k() = Tensor(spec.dtype, kv_shape, k);
  *request.mutable_v() = Tensor(spec.dtype, kv_shape, v);
  *request.mutable_out() = Tensor(spec.dtype, q_shape, out);
  *request.mutable_lse() = Tensor(v1::DTYPE_FLOAT32, {spec.num_heads, total_q()}, lse);
  request.mutable_cu_seqlens_q()->Assign(cu_seqlens_q.begin(), cu_seqlens_q.end());
  request.mutable_cu_seqlens_k()->Assign(cu_seqlens_k.begin(), cu_seqlens_k.end());
  *request.mutable_options() = Options(spec);
  return request;
}

ForwardAnswer ReferenceForward(const Problem& p) {
  ForwardAnswer answer;
  answer.out.resize(p.q.size());
  answer.lse.resize(static_cast<size_t>(p.spec.num_heads) * p.total_q());
  kernels::ForwardParams params;
  params.shape = KernelShape(p);
  params.options = KernelOptions(p.spec);
  params.q = p.q.data();
  params.k = p.k.data();
  params.v = p.v.data();
  params.out = answer.out.data();
  params.lse = answer.lse.data();
  kernels::reference::Forward(params, {});
  return answer;
}

BackwardAnswer ReferenceBackward(const Problem& p, const std::vector<float>& out,
                                 const std::vector<float>& lse) {
  BackwardAnswer answer;
  answer.dq.resize(p.q.size());
  answer.dk.resize(p.k.size());
  answer.dv.resize(p.v.size());
  kernels::BackwardParams params;
  params.shape = KernelShape(p);
  params.options = KernelOptions(p.spec);
  params.q = p.q.data();
  params.k = p.k.data();
  params.v = p.v.data();
  params.out = out.data();
  params.dout = p.dout.data();
  params.lse = lse.data();
  params.dq = answer.dq.data();
  params.dk = answer.dk.data();
  params.dv = answer.dv.data();
  kernels::reference::Backward(params, {});
  return answer;
}

ErrorStats Compare(const std::vector<float>& got, const std::vector<float>& want) {
  ErrorStats stats;
  if (got.size() != want.size()) {
    stats.mismatched_nonfinite = true;
    return stats;
  }
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want[i]) || !std::isfinite(got[i])) {
      if (!(got[i] == want[i])) stats.mismatched_nonfinite = true;
      continue;
    }
    const double d = static_cast<double>(got[i]) - want[i];
    stats.max_abs = std::max(stats.max_abs, std::abs(d));
    diff2 += d * d;
    ref2 += static_cast<double>(want[i]) * want[i];
  }
  stats.relative = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return stats;
}

double Tolerance(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
      return 2e-3;
    case v1::DTYPE_BFLOAT16:
      return 1e-2;
    default:
      return 1e-5;
  }
}

}  // namespace attnserve::tools
