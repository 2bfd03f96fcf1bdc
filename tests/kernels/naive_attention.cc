#include "tests/kernels/naive_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/dropout_mask.h"

namespace attnserve::kernels::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool Visible(const NaiveProblem& p, int64_t sq, int64_t sk, int64_t i, int64_t j) {
  const int64_t diagonal = i + sk - sq;
  if (p.causal && j > diagonal) return false;
  if (p.window_left >= 0 && j < diagonal - p.window_left) return false;
  if (p.window_right >= 0 && j > diagonal + p.window_right) return false;
  return true;
}

// The dropout factor of (sequence b, head h, row i, key j): 0 or 1 / (1 - p), one Philox call
// per element (slow and plain on purpose).
double DropoutFactor(const NaiveProblem& p, int b, int h, int64_t i, int64_t j) {
  if (p.dropout_p <= 0.0f) return 1.0;
  const Philox4 bits = DropoutBits(p.dropout_seed, b, h, static_cast<uint32_t>(i),
                                   static_cast<uint32_t>(j));
  const bool keep = bits.v[j % 4] >= DropoutThreshold(p.dropout_p);
  return keep ? 1.0 / (1.0 - static_cast<double>(p.dropout_p)) : 0.0;
}

// Softmax row of query row `row` (global index) of head h against keys of its sequence:
// fills raw (scale * q.k before softcap), p (probabilities) and returns lse.
double SoftmaxRow(const NaiveProblem& p, const std::vector<double>& q,
                  const std::vector<double>& k, int b, int64_t q0, int64_t sq, int64_t k0,
                  int64_t sk, int64_t i, int h, std::vector<double>& raw,
                  std::vector<double>& probs) {
  const double slope =
      p.alibi_slopes.empty() ? 0.0 : p.alibi_slopes[static_cast<size_t>(b) * p.alibi_stride + h];
  const int d = p.head_dim;
  const int kv_head = h / (p.num_heads / p.num_heads_k);
  raw.assign(sk, 0.0);
  probs.assign(sk, 0.0);
  std::vector<double> score(sk, -kInf);
  double max_score = -kInf;
  for (int64_t j = 0; j < sk; ++j) {
    if (!Visible(p, sq, sk, i, j)) continue;
    double dot = 0.0;
    for (int c = 0; c < d; ++c) {
      dot += q[((q0 + i) * p.num_heads + h) * d + c] *
             k[((k0 + j) * p.num_heads_k + kv_head) * d + c];
    }
    raw[j] = p.softmax_scale * dot;
    score[j] = p.softcap > 0 ? p.softcap * std::tanh(raw[j] / p.softcap) : raw[j];
    score[j] -= slope * std::abs(static_cast<double>(i + sk - sq - j));
    max_score = std::max(max_score, score[j]);
  }
  if (max_score == -kInf) return kInf;
  double sum = 0.0;
  for (int64_t j = 0; j < sk; ++j) {
    if (score[j] != -kInf) sum += std::exp(score[j] - max_score);
  }
  for (int64_t j = 0; j < sk; ++j) {
    if (score[j] != -kInf) probs[j] = std::exp(score[j] - max_score) / sum;
  }
  return max_score + std::log(sum);
}

}  // namespace

NaiveForwardResult NaiveForward(const NaiveProblem& p, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v) {
  const int64_t total_q = p.cu_seqlens_q.back();
  const int d = p.head_dim;
  NaiveForwardResult result;
  result.out.assign(total_q * p.num_heads * d, 0.0);
  result.lse.assign(total_q * p.num_heads, kInf);
  std::vector<double> raw, probs;
  for (size_t b = 0; b + 1 < p.cu_seqlens_q.size(); ++b) {
    const int64_t q0 = p.cu_seqlens_q[b], sq = p.cu_seqlens_q[b + 1] - q0;
    const int64_t k0 = p.cu_seqlens_k[b], sk = p.cu_seqlens_k[b + 1] - k0;
    for (int h = 0; h < p.num_heads; ++h) {
      const int kv_head = h / (p.num_heads / p.num_heads_k);
      for (int64_t i = 0; i < sq; ++i) {
        result.lse[h * total_q + q0 + i] =
            SoftmaxRow(p, q, k, static_cast<int>(b), q0, sq, k0, sk, i, h, raw, probs);
        for (int64_t j = 0; j < sk; ++j) {
          const double dropped = probs[j] * DropoutFactor(p, static_cast<int>(b), h, i, j);
          for (int c = 0; c < d; ++c) {
            result.out[((q0 + i) * p.num_heads + h) * d + c] +=
                dropped * v[((k0 + j) * p.num_heads_k + kv_head) * d + c];
          }
        }
      }
    }
  }
  return result;
}

NaiveGradients NaiveBackward(const NaiveProblem& p, const std::vector<double>& q,
                             const std::vector<double>& k, const std::vector<double>& v,
                             const std::vector<double>& out, const std::vector<double>& dout) {
  const int d = p.head_dim;
  NaiveGradients g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  std::vector<double> raw, probs;
  for (size_t b = 0; b + 1 < p.cu_seqlens_q.size(); ++b) {
    const int64_t q0 = p.cu_seqlens_q[b], sq = p.cu_seqlens_q[b + 1] - q0;
    const int64_t k0 = p.cu_seqlens_k[b], sk = p.cu_seqlens_k[b + 1] - k0;
    for (int h = 0; h < p.num_heads; ++h) {
      const int kv_head = h / (p.num_heads / p.num_heads_k);
      for (int64_t i = 0; i < sq; ++i) {
        if (SoftmaxRow(p, q, k, static_cast<int>(b), q0, sq, k0, sk, i, h, raw, probs) == kInf) {
          continue;
        }
        const int64_t qi = ((q0 + i) * p.num_heads + h) * d;
        double delta = 0.0;
        for (int c = 0; c < d; ++c) delta += dout[qi + c] * out[qi + c];
        for (int64_t j = 0; j < sk; ++j) {
          if (probs[j] == 0.0) continue;
          const int64_t kj = ((k0 + j) * p.num_heads_k + kv_head) * d;
          const double factor = DropoutFactor(p, static_cast<int>(b), h, i, j);
          double dp = 0.0;
          for (int c = 0; c < d; ++c) dp += dout[qi + c] * v[kj + c];
          dp *= factor;  // out = (factor o P).V
          double ds = probs[j] * (dp - delta);  // d loss / d score
          if (p.softcap > 0) {
            const double t = std::tanh(raw[j] / p.softcap);
            ds *= 1.0 - t * t;  // d score / d raw
          }
          ds *= p.softmax_scale;  // d raw / d (q.k)
          for (int c = 0; c < d; ++c) {
            g.dq[qi + c] += ds * k[kj + c];
            g.dk[kj + c] += ds * q[qi + c];
            g.dv[kj + c] += factor * probs[j] * dout[qi + c];
          }
        }
      }
    }
  }
  return g;
}

}  // namespace attnserve::kernels::test
