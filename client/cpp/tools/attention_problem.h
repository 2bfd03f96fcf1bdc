// Random packed-varlen attention problems and their local reference answers, shared by
// attnctl's --check and the C++ end-to-end tests.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnserve/v1/attention.pb.h"

namespace attnserve::tools {

struct ProblemSpec {
  int batch = 2;
  int max_seqlen_q = 128;  // each sequence gets a random length in [max/2, max]
  int max_seqlen_k = 128;
  int num_heads = 4;
  int num_heads_k = 4;
  int head_dim = 64;
  v1::DType dtype = v1::DTYPE_BFLOAT16;
  bool causal = false;
  std::optional<int32_t> window_left;
  std::optional<int32_t> window_right;
  float softcap = 0.0f;
  float softmax_scale = 0.0f;
  uint64_t seed = 1;
};

// Inputs are stored as floats already rounded to the spec's dtype, so the reference sees
// exactly what the server sees.
struct Problem {
  ProblemSpec spec;
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k;
  std::vector<float> q, k, v, dout;
  int64_t total_q() const { return cu_seqlens_q.back(); }
  int64_t total_k() const { return cu_seqlens_k.back(); }

  v1::ForwardRequest MakeForwardRequest() const;
  // out and lse are the forward's answer the backward differentiates.
  v1::BackwardRequest MakeBackwardRequest(const std::vector<float>& out,
                                          const std::vector<float>& lse) const;
};

Problem MakeRandomProblem(const ProblemSpec& spec);
// A problem with exactly these sequence lengths (one pair per sequence, sizes equal); the
// spec's batch and max_seqlen fields are taken from them.
Problem MakeRandomProblem(const ProblemSpec& spec, const std::vector<int32_t>& seqlens_q,
                          const std::vector<int32_t>& seqlens_k);

struct ForwardAnswer {
  std::vector<float> out, lse;
};
struct BackwardAnswer {
  std::vector<float> dq, dk, dv;
};

// The exact CPU reference kernels in float32 on the problem's (rounded) inputs.
ForwardAnswer ReferenceForward(const Problem& problem);
BackwardAnswer ReferenceBackward(const Problem& problem, const std::vector<float>& out,
                                 const std::vector<float>& lse);

struct ErrorStats {
  double max_abs = 0.0;   // largest |got - want|; matching infinities count as 0
  double relative = 0.0;  // ||got - want|| / ||want|| over finite entries
  bool mismatched_nonfinite = false;
};
ErrorStats Compare(const std::vector<float>& got, const std::vector<float>& want);

// Relative-error bound for results in `dtype` (DESIGN.md: bf16 1e-2, fp16 2e-3, fp32 1e-5).
double Tolerance(v1::DType dtype);

}  // namespace attnserve::tools
