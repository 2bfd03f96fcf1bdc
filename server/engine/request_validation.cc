#include "server/engine/request_validation.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/engine/error_text.h"

namespace attnserve::engine {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return QuoteList<int64_t>(shape);
}

// The dimensions every attention request shares, read from q and k.
struct Dims {
  int64_t total_q = 0, total_k = 0, num_heads = 0, num_heads_k = 0, head_dim = 0, batch = 0;
};

absl::Status CheckRank3(const TensorView& t, const char* name, const char* layout) {
  if (t.shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".shape: expected rank 3 ", layout,
                                                   ", got ", ShapeString(t.shape)));
  }
  for (int64_t d : t.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ".shape: dimensions must be non-negative, got ", ShapeString(t.shape)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDType(const TensorView& t, const char* name, DType expected,
                        const char* expected_from) {
  if (t.dtype != expected) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".dtype: ", kernels::DTypeName(t.dtype),
                                                   " does not match ", expected_from, " ",
                                                   kernels::DTypeName(expected)));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const TensorView& t, const char* name, const TensorView& like,
                            const char* like_name) {
  if (t.shape != like.shape) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".shape: ", ShapeString(t.shape),
                                                   " must equal ", like_name, ".shape ",
                                                   ShapeString(like.shape)));
  }
  return absl::OkStatus();
}

// Only called once dimensions are bounded by the limits, so the product cannot overflow.
absl::Status CheckByteCount(const TensorView& t, const char* name) {
  int64_t expected = kernels::DTypeSize(t.dtype);
  for (int64_t d : t.shape) expected *= d;
  if (static_cast<int64_t>(t.size_bytes) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".data: expected ", expected, " bytes for shape ", ShapeString(t.shape), " of ",
        kernels::DTypeName(t.dtype), ", got ", t.size_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckOffsets(const std::vector<int32_t>& cu, const char* name, int64_t total) {
  if (cu.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected batch + 1 offsets starting at 0, got none"));
  }
  if (cu[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, "[0] must be 0, got ", cu[0]));
  }
  for (size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(name, "[", i, "] = ", cu[i],
                                                     " is less than ", name, "[", i - 1,
                                                     "] = ", cu[i - 1]));
    }
  }
  if (cu.back() != total) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": last offset ", cu.back(),
                                                   " must equal the token count ", total));
  }
  return absl::OkStatus();
}

// ALiBi slopes: float32 (the codec checked the dtype), [num_heads] or [batch, num_heads],
// exactly their bytes, every slope finite.
absl::Status CheckAlibiSlopes(const OwnedTensor& slopes, const Dims& dims) {
  const std::vector<int64_t> per_head = {dims.num_heads};
  const std::vector<int64_t> per_sequence = {dims.batch, dims.num_heads};
  if (slopes.dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.alibi_slopes.dtype: must be float32, got ", kernels::DTypeName(slopes.dtype)));
  }
  if (slopes.shape != per_head && slopes.shape != per_sequence) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.alibi_slopes.shape: expected [num_heads] = ", ShapeString(per_head),
        " or [batch, num_heads] = ", ShapeString(per_sequence), ", got ",
        ShapeString(slopes.shape)));
  }
  if (slopes.data.size() != slopes.size_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.alibi_slopes.data: ", slopes.data.size(), " bytes, but float32 ",
        ShapeString(slopes.shape), " needs ", slopes.size_bytes()));
  }
  for (size_t i = 0; i < slopes.data.size() / sizeof(float); ++i) {
    float slope;
    std::memcpy(&slope, slopes.data.data() + i * sizeof(float), sizeof(float));
    if (!std::isfinite(slope)) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.alibi_slopes: element ", i, " is ", slope, "; must be finite"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const RequestOptions& o, const Dims& dims) {
  // Written so NaN fails too; p = 1 would drop everything and scale by 1 / 0.
  if (!(o.dropout_p >= 0.0f && o.dropout_p < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.dropout_p must be finite and in [0, 1) (0 = off), got ", o.dropout_p));
  }
  if (o.alibi_slopes) {
    if (absl::Status s = CheckAlibiSlopes(*o.alibi_slopes, dims); !s.ok()) return s;
  }
  if (!std::isfinite(o.softmax_scale) || std::fabs(o.softmax_scale) > kMaxSoftmaxScale) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.softmax_scale must be finite with magnitude at most ",
                     kMaxSoftmaxScale, " (0 = 1/sqrt(head_dim)), got ", o.softmax_scale));
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.softcap must be finite and >= 0, got ", o.softcap));
  }
  if (o.window_left && *o.window_left < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.window_left must be >= 0 (or -1/absent for unbounded), got ", *o.window_left));
  }
  if (o.window_right && *o.window_right < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.window_right must be >= 0 (or -1/absent for unbounded), got ", *o.window_right));
  }
  return absl::OkStatus();
}

absl::Status CheckLimit(int64_t value, int64_t limit, const char* what, const char* flag) {
  if (value > limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " ", value, " exceeds the server's limit ", flag, " = ", limit));
  }
  return absl::OkStatus();
}

// Checks q, k, v, the offsets and the options; returns the request's dimensions.
absl::Status CheckQkv(const TensorView& q, const TensorView& k, const TensorView& v,
                      const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                      const RequestOptions& options, const Limits& limits, Dims& dims) {
  if (absl::Status s = CheckRank3(q, "q", "[total_q, num_heads, head_dim]"); !s.ok()) return s;
  if (absl::Status s = CheckRank3(k, "k", "[total_k, num_heads_k, head_dim]"); !s.ok()) return s;
  if (absl::Status s = CheckRank3(v, "v", "[total_k, num_heads_k, head_dim]"); !s.ok()) return s;
  if (absl::Status s = CheckDType(k, "k", q.dtype, "q.dtype"); !s.ok()) return s;
  if (absl::Status s = CheckDType(v, "v", q.dtype, "q.dtype"); !s.ok()) return s;
  dims.total_q = q.shape[0];
  dims.num_heads = q.shape[1];
  dims.head_dim = q.shape[2];
  dims.total_k = k.shape[0];
  dims.num_heads_k = k.shape[1];
  if (dims.head_dim < 1) {
    return absl::InvalidArgumentError("q.shape[2] (head_dim) must be >= 1, got 0");
  }
  if (dims.num_heads < 1) {
    return absl::InvalidArgumentError("q.shape[1] (num_heads) must be >= 1, got 0");
  }
  if (dims.num_heads_k < 1) {
    return absl::InvalidArgumentError("k.shape[1] (num_heads_k) must be >= 1, got 0");
  }
  if (k.shape[2] != dims.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("k.shape[2] (head_dim) ", k.shape[2],
                                                   " must equal q.shape[2] ", dims.head_dim));
  }
  if (absl::Status s = CheckSameShape(v, "v", k, "k"); !s.ok()) return s;
  if (dims.num_heads % dims.num_heads_k != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("q.shape[1] (num_heads) ", dims.num_heads,
                     " must be divisible by k.shape[1] (num_heads_k) ", dims.num_heads_k));
  }
  if (absl::Status s = CheckLimit(dims.head_dim, limits.max_head_dim, "q.shape[2] (head_dim)",
                                  "max_head_dim");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLimit(dims.num_heads, limits.max_num_heads,
                                  "q.shape[1] (num_heads)", "max_num_heads");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLimit(dims.total_q, limits.max_total_tokens,
                                  "q.shape[0] (total_q tokens)", "max_total_tokens");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLimit(dims.total_k, limits.max_total_tokens,
                                  "k.shape[0] (total_k tokens)", "max_total_tokens");
      !s.ok()) {
    return s;
  }
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    if (absl::Status s = CheckByteCount(*t, name); !s.ok()) return s;
  }
  if (absl::Status s = CheckOffsets(cu_q, "cu_seqlens_q", dims.total_q); !s.ok()) return s;
  if (absl::Status s = CheckOffsets(cu_k, "cu_seqlens_k", dims.total_k); !s.ok()) return s;
  if (cu_k.size() != cu_q.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cu_seqlens_k has ", cu_k.size(), " offsets but cu_seqlens_q has ",
                     cu_q.size(), "; both must have batch + 1"));
  }
  dims.batch = static_cast<int64_t>(cu_q.size()) - 1;
  if (absl::Status s = CheckLimit(dims.batch, limits.max_batch, "batch (sequences)", "max_batch");
      !s.ok()) {
    return s;
  }
  return CheckOptions(options, dims);
}

}  // namespace

absl::Status ValidateForward(const ForwardInputs& in, const Limits& limits) {
  Dims dims;
  return CheckQkv(in.q, in.k, in.v, in.cu_seqlens_q, in.cu_seqlens_k, in.options, limits, dims);
}

absl::Status ValidateBackward(const BackwardInputs& in, const Limits& limits) {
  // The engine fills a context's tensors in before validating, so only what the caller
  // should have sent can be missing here.
  for (const auto& [t, name] : {std::pair{&in.dout, "dout"}, {&in.q, "q"}, {&in.k, "k"},
                                {&in.v, "v"}, {&in.out, "out"}, {&in.lse, "lse"}}) {
    if (t->absent()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": missing", in.context_id.empty() && name != std::string("dout")
                                 ? " (send it, or the context_id of a keep_context forward)"
                                 : ""));
    }
  }
  Dims dims;
  if (absl::Status s =
          CheckQkv(in.q, in.k, in.v, in.cu_seqlens_q, in.cu_seqlens_k, in.options, limits, dims);
      !s.ok()) {
    return s;
  }
  for (const auto& [t, name] : {std::pair{&in.dout, "dout"}, {&in.out, "out"}}) {
    if (absl::Status s = CheckDType(*t, name, in.q.dtype, "q.dtype"); !s.ok()) return s;
    if (absl::Status s = CheckSameShape(*t, name, in.q, "q"); !s.ok()) return s;
    if (absl::Status s = CheckByteCount(*t, name); !s.ok()) return s;
  }
  if (absl::Status s = CheckDType(in.lse, "lse", DType::kFloat32, "the required"); !s.ok()) {
    return s;
  }
  const std::vector<int64_t> lse_shape = {dims.num_heads, dims.total_q};
  if (in.lse.shape != lse_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("lse.shape: expected [num_heads, total_q] = ", ShapeString(lse_shape),
                     ", got ", ShapeString(in.lse.shape)));
  }
  if (absl::Status s = CheckByteCount(in.lse, "lse"); !s.ok()) return s;
  // The mask must be the forward's: its seed is not guessable.
  if (in.options.has_dropout() && in.options.dropout_seed == 0) {
    return absl::InvalidArgumentError(
        "dropout_seed: required (nonzero) when options.dropout_p > 0; send the forward's "
        "ForwardResponse.dropout_seed, or the context_id of a keep_context forward");
  }
  return absl::OkStatus();
}

}  // namespace attnserve::engine
