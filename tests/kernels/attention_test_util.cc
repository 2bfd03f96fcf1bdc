#include "tests/kernels/attention_test_util.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/reference/half_convert.h"
#include "kernels/reference/reference_attention.h"

namespace attnserve::kernels::test {

using reference::BFloat16ToFloat;
using reference::FloatToBFloat16;
using reference::FloatToHalf;
using reference::HalfToFloat;

Tensor::Tensor(DType dtype, int64_t elements)
    : dtype_(dtype), elements_(elements), bytes_(kOffset + elements * DTypeSize(dtype)) {}

Tensor Tensor::Random(DType dtype, int64_t elements, std::mt19937_64& rng, double amplitude) {
  Tensor t(dtype, elements);
  std::uniform_real_distribution<double> dist(-amplitude, amplitude);
  for (int64_t i = 0; i < elements; ++i) t.Set(i, dist(rng));
  return t;
}

void Tensor::Set(int64_t index, double value) {
  unsigned char* at = bytes_.data() + kOffset + index * DTypeSize(dtype_);
  const float f = static_cast<float>(value);
  if (dtype_ == DType::kFloat32) {
    std::memcpy(at, &f, 4);
  } else {
    const uint16_t h = dtype_ == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
    std::memcpy(at, &h, 2);
  }
}

std::vector<double> Tensor::ToDoubles() const {
  std::vector<double> values(elements_);
  for (int64_t i = 0; i < elements_; ++i) {
    const unsigned char* at = bytes_.data() + kOffset + i * DTypeSize(dtype_);
    if (dtype_ == DType::kFloat32) {
      float f;
      std::memcpy(&f, at, 4);
      values[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, at, 2);
      values[i] = dtype_ == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
    }
  }
  return values;
}

void Tensor::Poison() {
  for (int64_t i = 0; i < elements_; ++i) Set(i, std::numeric_limits<double>::quiet_NaN());
}

std::vector<unsigned char> Tensor::Bytes() const {
  return std::vector<unsigned char>(bytes_.begin() + kOffset, bytes_.end());
}

Case::Case(const Problem& p, uint64_t seed) : problem(p) {
  cu_seqlens_q.push_back(0);
  cu_seqlens_k.push_back(0);
  for (size_t b = 0; b < p.lens_q.size(); ++b) {
    cu_seqlens_q.push_back(cu_seqlens_q.back() + p.lens_q[b]);
    cu_seqlens_k.push_back(cu_seqlens_k.back() + p.lens_k[b]);
  }
  total_q = cu_seqlens_q.back();
  total_k = cu_seqlens_k.back();
  std::mt19937_64 rng(seed);
  // Amplitude 2 gives scores of order 1 after 1/sqrt(d) scaling: softmax neither flat nor one-hot.
  q = Tensor::Random(p.dtype, q_elements(), rng, 2.0);
  k = Tensor::Random(p.dtype, kv_elements(), rng, 2.0);
  v = Tensor::Random(p.dtype, kv_elements(), rng, 1.0);
  dout = Tensor::Random(p.dtype, q_elements(), rng, 1.0);
}

AttentionShape Case::shape() const {
  AttentionShape s;
  s.dtype = problem.dtype;
  s.batch = static_cast<int>(problem.lens_q.size());
  s.total_q = total_q;
  s.total_k = total_k;
  s.num_heads = problem.num_heads;
  s.num_heads_k = problem.num_heads_k;
  s.head_dim = problem.head_dim;
  s.cu_seqlens_q = cu_seqlens_q.data();
  s.cu_seqlens_k = cu_seqlens_k.data();
  return s;
}

AttentionOptions Case::options() const {
  AttentionOptions o = problem.options;
  if (o.softmax_scale == 0.0f) {
    o.softmax_scale = 1.0f / std::sqrt(static_cast<float>(problem.head_dim));
  }
  return o;
}

NaiveProblem Case::naive() const {
  const AttentionOptions o = options();
  NaiveProblem n;
  n.cu_seqlens_q = cu_seqlens_q;
  n.cu_seqlens_k = cu_seqlens_k;
  n.num_heads = problem.num_heads;
  n.num_heads_k = problem.num_heads_k;
  n.head_dim = problem.head_dim;
  n.softmax_scale = o.softmax_scale;
  n.causal = o.causal;
  n.window_left = o.window_left;
  n.window_right = o.window_right;
  n.softcap = o.softcap;
  n.dropout_p = o.dropout_p;
  n.dropout_seed = o.dropout_seed;
  if (o.alibi_slopes != nullptr) {
    // The oracle keys by the launch's sequence index: tests with first_sequence compare
    // kernel runs against each other instead.
    const size_t rows = o.alibi_slopes_stride == 0 ? 1 : cu_seqlens_q.size() - 1;
    n.alibi_slopes.assign(o.alibi_slopes, o.alibi_slopes + rows * problem.num_heads);
    n.alibi_stride = o.alibi_slopes_stride;
  }
  return n;
}

ForwardResult RunForward(const Case& c, int num_threads) {
  ForwardResult r;
  r.out = Tensor(c.problem.dtype, c.q_elements());
  r.lse = Tensor(DType::kFloat32, c.total_q * c.problem.num_heads);
  r.out.Poison();
  r.lse.Poison();
  ForwardParams params;
  params.shape = c.shape();
  params.options = c.options();
  params.q = c.q.data();
  params.k = c.k.data();
  params.v = c.v.data();
  params.out = r.out.data();
  params.lse = static_cast<float*>(r.lse.data());
  r.status = reference::Forward(params, ExecutionContext{num_threads});
  return r;
}

BackwardResult RunBackward(const Case& c, const ForwardResult& forward, int num_threads,
                           bool deterministic) {
  BackwardResult r;
  r.dq = Tensor(c.problem.dtype, c.q_elements());
  r.dk = Tensor(c.problem.dtype, c.kv_elements());
  r.dv = Tensor(c.problem.dtype, c.kv_elements());
  r.dq.Poison();
  r.dk.Poison();
  r.dv.Poison();
  BackwardParams params;
  params.shape = c.shape();
  params.options = c.options();
  params.q = c.q.data();
  params.k = c.k.data();
  params.v = c.v.data();
  params.out = forward.out.data();
  params.dout = c.dout.data();
  params.lse = static_cast<const float*>(forward.lse.data());
  params.dq = r.dq.data();
  params.dk = r.dk.data();
  params.dv = r.dv.data();
  params.deterministic = deterministic;
  r.status = reference::Backward(params, ExecutionContext{num_threads});
  return r;
}

double RelativeError(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return std::numeric_limits<double>::infinity();
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

double MaxLseError(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(got[i]) || std::isinf(want[i])) {
      if (got[i] != want[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double err = std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i]));
    if (!(err <= worst)) worst = err;  // also catches NaN
  }
  return worst;
}

double OutputTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 1e-3;  // unit roundoff 2^-11 ~ 4.9e-4
    case DType::kBFloat16:
      return 8e-3;  // unit roundoff 2^-8 ~ 3.9e-3
    case DType::kFloat32:
      break;
  }
  return 1e-5;
}

Problem RandomProblem(std::mt19937_64& rng, DType dtype) {
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem p;
  p.dtype = dtype;
  const int batch = uniform(1, 4);
  for (int b = 0; b < batch; ++b) {
    // One in five sequences is empty on one side, to keep those paths busy; up to 70 tokens
    // crosses query-block (32) and key-tile (32) boundaries.
    p.lens_q.push_back(uniform(0, 4) == 0 ? 0 : uniform(1, 70));
    p.lens_k.push_back(uniform(0, 4) == 0 ? 0 : uniform(1, 70));
  }
  const int groups[] = {1, 2, 4};
  p.num_heads_k = uniform(1, 3);
  p.num_heads = p.num_heads_k * groups[uniform(0, 2)];
  const int dims[] = {1, 3, 8, 16, 24, 40, 64};
  p.head_dim = dims[uniform(0, 6)];
  p.options.causal = uniform(0, 1) == 1;
  p.options.window_left = uniform(0, 2) == 0 ? uniform(0, 12) : -1;
  p.options.window_right = uniform(0, 2) == 0 ? uniform(0, 12) : -1;
  p.options.softcap = uniform(0, 3) == 0 ? 1.5f : 0.0f;
  if (uniform(0, 3) == 0) p.options.softmax_scale = 0.05f * uniform(1, 10);
  return p;
}

}  // namespace attnserve::kernels::test
