// Shared harness for the kernel tests: random varlen problems, packed tensors stored at odd byte
// addresses (as they arrive from the network), NaN-poisoned outputs, and error norms.
#pragma once

#include <cstdint>
#include <ostream>
#include <random>
#include <utility>
#include <vector>

#include "kernels/attention_params.h"
#include "tests/kernels/naive_attention.h"

namespace attnserve::kernels {
// Lets gtest print DType parameters by name.
inline void PrintTo(DType dtype, std::ostream* os) { *os << DTypeName(dtype); }
}  // namespace attnserve::kernels

namespace attnserve::kernels::test {

// A packed tensor whose data starts one byte into its buffer, so it is never 2- or 4-byte
// aligned. Values round-trip through `dtype` exactly as a client would send them.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, int64_t elements);
  static Tensor Random(DType dtype, int64_t elements, std::mt19937_64& rng, double amplitude);

  void* data() { return bytes_.data() + kOffset; }
  const void* data() const { return bytes_.data() + kOffset; }
  int64_t elements() const { return elements_; }
  DType dtype() const { return dtype_; }

  std::vector<double> ToDoubles() const;
  void Set(int64_t index, double value);
  // Fills every element with NaN so anything a kernel forgets to write shows up.
  void Poison();
  // The raw encoded bytes, for bitwise comparisons.
  std::vector<unsigned char> Bytes() const;

 private:
  static constexpr int kOffset = 1;
  DType dtype_ = DType::kFloat32;
  int64_t elements_ = 0;
  std::vector<unsigned char> bytes_;
};

// A varlen problem: per-sequence lengths, heads and options. options.softmax_scale == 0 here
// means "use 1/sqrt(head_dim)", which the harness resolves before calling a kernel.
struct Problem {
  DType dtype = DType::kFloat32;
  std::vector<int> lens_q;
  std::vector<int> lens_k;
  int num_heads = 1;
  int num_heads_k = 1;
  int head_dim = 8;
  AttentionOptions options;
};

// A float32 problem of these sequence lengths and heads, default options.
inline Problem MakeProblem(std::vector<int> lens_q, std::vector<int> lens_k, int num_heads = 2,
                           int num_heads_k = 1, int head_dim = 16) {
  Problem p;
  p.lens_q = std::move(lens_q);
  p.lens_k = std::move(lens_k);
  p.num_heads = num_heads;
  p.num_heads_k = num_heads_k;
  p.head_dim = head_dim;
  return p;
}

// A problem with random q, k, v (and dout for backward), ready to run.
struct Case {
  Case(const Problem& problem, uint64_t seed);

  AttentionShape shape() const;
  AttentionOptions options() const;  // softmax_scale resolved
  NaiveProblem naive() const;
  int64_t q_elements() const { return total_q * problem.num_heads * problem.head_dim; }
  int64_t kv_elements() const { return total_k * problem.num_heads_k * problem.head_dim; }

  Problem problem;
  std::vector<int32_t> cu_seqlens_q;
  std::vector<int32_t> cu_seqlens_k;
  int64_t total_q = 0;
  int64_t total_k = 0;
  Tensor q, k, v, dout;
};

struct ForwardResult {
  KernelStatus status;
  Tensor out;
  Tensor lse;  // float32 [num_heads, total_q]
};
// Reference forward with poisoned outputs.
ForwardResult RunForward(const Case& c, int num_threads = 0);

struct BackwardResult {
  KernelStatus status;
  Tensor dq, dk, dv;
};
// Reference backward of c.dout given a forward's out and lse, with poisoned outputs.
BackwardResult RunBackward(const Case& c, const ForwardResult& forward, int num_threads = 0,
                           bool deterministic = false);

// ||got - want|| / ||want|| (plain ||got - want|| when want is all zero); +inf on any NaN.
double RelativeError(const std::vector<double>& got, const std::vector<double>& want);

// Largest |got - want| / (1 + |want|) over finite entries; +inf where exactly one side is
// infinite (rows that see no key must give lse = +inf exactly) or on NaN.
double MaxLseError(const std::vector<double>& got, const std::vector<double>& want);

// Relative error an output of `dtype` may carry from its final rounding alone (plus fp32 math).
double OutputTolerance(DType dtype);

// A random problem: 1-4 sequences of 0-70 tokens, GQA groups, odd head dims, random masks.
Problem RandomProblem(std::mt19937_64& rng, DType dtype);

}  // namespace attnserve::kernels::test
