#include "tools/workload.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attnserve/tensor_codec.h"

namespace attnserve::load {
namespace {

// lse is float32 whatever the inputs' dtype; allow float32 accumulation-order differences.
constexpr double kLseTolerance = 1e-4;

absl::Status CheckTensor(const char* name, const v1::Tensor& tensor, const std::vector<float>& want,
                         double tolerance) {
  absl::StatusOr<std::vector<float>> got = TensorToFloats(tensor);
  if (!got.ok()) return absl::DataLossError(absl::StrCat(name, ": ", got.status().message()));
  if (got->size() != want.size()) {
    return absl::DataLossError(
        absl::StrCat(name, " has ", got->size(), " values, want ", want.size()));
  }
  const tools::ErrorStats stats = tools::Compare(*got, want);
  if (stats.mismatched_nonfinite) {
    return absl::DataLossError(absl::StrCat(name, ": non-finite values differ"));
  }
  if (stats.relative > tolerance) {
    return absl::DataLossError(absl::StrFormat("%s: relative error %.3g > tolerance %.3g", name,
                                               stats.relative, tolerance));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t VisiblePairs(int64_t seqlen_q, int64_t seqlen_k, bool causal) {
  if (!causal) return seqlen_q * seqlen_k;
  int64_t pairs = 0;
  for (int64_t i = 0; i < seqlen_q; ++i) {
    pairs += std::clamp<int64_t>(i + seqlen_k - seqlen_q + 1, 0, seqlen_k);
  }
  return pairs;
}

double ForwardFlops(const std::vector<int32_t>& cu_seqlens_q,
                    const std::vector<int32_t>& cu_seqlens_k, int num_heads, int head_dim,
                    bool causal) {
  double pairs = 0;
  for (size_t b = 0; b + 1 < cu_seqlens_q.size() && b + 1 < cu_seqlens_k.size(); ++b) {
    pairs += static_cast<double>(VisiblePairs(cu_seqlens_q[b + 1] - cu_seqlens_q[b],
                                              cu_seqlens_k[b + 1] - cu_seqlens_k[b], causal));
  }
  return 4.0 * head_dim * num_heads * pairs;
}

std::vector<SequenceLengths> SampleShapes(const ShapeSpec& shape, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto draw = [&rng](IntRange range) {
    return std::uniform_int_distribution<int>(range.min, range.max)(rng);
  };
  std::vector<SequenceLengths> requests(count);
  for (SequenceLengths& r : requests) {
    const int batch = draw(shape.batch);
    for (int b = 0; b < batch; ++b) {
      r.q.push_back(draw(shape.seqlen_q));
      r.k.push_back(shape.separate_k ? draw(shape.seqlen_k) : r.q.back());
    }
  }
  return requests;
}

std::vector<SequenceLengths> SelectRequests(const std::vector<SequenceLengths>& all, int count) {
  if (static_cast<int64_t>(all.size()) <= count) return all;
  std::vector<SequenceLengths> chosen;
  for (int i = 0; i < count; ++i) chosen.push_back(all[all.size() * i / count]);
  return chosen;
}

absl::StatusOr<std::vector<WorkItem>> BuildPool(const std::vector<SequenceLengths>& shapes,
                                                const WorkloadOptions& options, Client& client) {
  std::vector<WorkItem> pool;
  pool.reserve(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    tools::ProblemSpec spec;
    spec.num_heads = options.heads;
    spec.num_heads_k = options.heads_k;
    spec.head_dim = options.head_dim;
    spec.dtype = options.dtype;
    spec.causal = options.causal;
    spec.seed = options.seed + i;
    const tools::Problem problem = tools::MakeRandomProblem(spec, shapes[i].q, shapes[i].k);
    WorkItem item;
    item.tokens = problem.total_q();
    item.forward_flops = ForwardFlops(problem.cu_seqlens_q, problem.cu_seqlens_k, spec.num_heads,
                                      spec.head_dim, spec.causal);
    auto forward = std::make_shared<v1::ForwardRequest>(problem.MakeForwardRequest());
    if (options.forward && options.references)
      item.forward_answer = tools::ReferenceForward(problem);
    if (options.backward) {
      std::vector<float> out, lse;
      absl::StatusOr<v1::ForwardResponse> served = client.Forward(*forward);
      if (served.ok()) {
        absl::StatusOr<std::vector<float>> served_out = TensorToFloats(served->out());
        absl::StatusOr<std::vector<float>> served_lse = TensorToFloats(served->lse());
        if (served_out.ok() && served_lse.ok() && served_out->size() == problem.q.size()) {
          out = std::move(*served_out);
          lse = std::move(*served_lse);
        }
      }
      if (out.empty()) {
        tools::ForwardAnswer local =
            item.forward_answer ? *item.forward_answer : tools::ReferenceForward(problem);
        out = std::move(local.out);
        lse = std::move(local.lse);
      }
      auto backward = std::make_shared<v1::BackwardRequest>(problem.MakeBackwardRequest(out, lse));
      if (options.references) {
        // The reference differentiates exactly what the server receives: out rounded to dtype.
        absl::StatusOr<std::vector<float>> sent_out = TensorToFloats(backward->out());
        if (!sent_out.ok()) return sent_out.status();
        item.backward_answer = tools::ReferenceBackward(problem, *sent_out, lse);
      }
      item.backward = std::move(backward);
    }
    // Set after the pool's own forward above, which must leave no context behind.
    forward->set_keep_context(options.keep_context);
    if (options.forward) item.forward = std::move(forward);
    pool.push_back(std::move(item));
  }
  return pool;
}

absl::Status VerifyForward(const WorkItem& item, const v1::ForwardResponse& response) {
  if (!item.forward_answer) return absl::FailedPreconditionError("no forward reference");
  const v1::DType dtype = item.forward->q().dtype();
  if (absl::Status s =
          CheckTensor("out", response.out(), item.forward_answer->out, tools::Tolerance(dtype));
      !s.ok()) {
    return s;
  }
  return CheckTensor("lse", response.lse(), item.forward_answer->lse, kLseTolerance);
}

absl::Status VerifyBackward(const WorkItem& item, const v1::BackwardResponse& response) {
  if (!item.backward_answer) return absl::FailedPreconditionError("no backward reference");
  const double tolerance = tools::Tolerance(item.backward->q().dtype());
  const tools::BackwardAnswer& want = *item.backward_answer;
  if (absl::Status s = CheckTensor("dq", response.dq(), want.dq, tolerance); !s.ok()) return s;
  if (absl::Status s = CheckTensor("dk", response.dk(), want.dk, tolerance); !s.ok()) return s;
  return CheckTensor("dv", response.dv(), want.dv, tolerance);
}

}  // namespace attnserve::load
