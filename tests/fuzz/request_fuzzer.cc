// libFuzzer target: wire bytes -> ForwardRequest/BackwardRequest -> Decode -> Validate, and
// for requests the validator accepts, the CPU reference kernel. The first byte picks the RPC.
// Tensor bytes are copied into exactly-sized buffers so ASan catches a kernel that reads past
// what the validator promised it.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "attnserve/v1/attention.pb.h"
#include "kernels/reference/half_convert.h"
#include "kernels/reference/reference_attention.h"
#include "server/engine/kernel_runner.h"
#include "server/engine/request_validation.h"
#include "server/transport/grpc/proto_codec.h"

namespace {

using attnserve::engine::DType;
using attnserve::engine::TensorView;

// Small limits keep accepted requests cheap, so the fuzzer spends its time on new inputs.
attnserve::engine::Limits FuzzLimits() {
  attnserve::engine::Limits limits;
  limits.max_message_bytes = 1 << 20;
  limits.max_total_tokens = 256;
  limits.max_head_dim = 64;
  limits.max_num_heads = 8;
  limits.max_batch = 16;
  return limits;
}

// Above this many score-times-head_dim steps an input is validated but not run: no single
// input may take more than a few milliseconds under ASan.
constexpr int64_t kMaxWork = 1'000'000;
// Inputs with every element within this bound cannot overflow fp32 scores (64 * 1e3 * 1e3 *
// |scale| <= 1e3), so their outputs must be finite.
constexpr float kFiniteBound = 1e3f;

const attnserve::kernels::ExecutionContext kSingleThread{/*num_threads=*/1};
const attnserve::engine::KernelFamily kReference = {
    "reference", attnserve::kernels::reference::Forward, attnserve::kernels::reference::Backward};

// Owns exactly-sized copies of a view's bytes and repoints the view at them.
class ExactBuffers {
 public:
  void Rebase(TensorView& view) {
    buffers_.emplace_back(new char[view.size_bytes]);
    if (view.size_bytes != 0) std::memcpy(buffers_.back().get(), view.data, view.size_bytes);
    view.data = buffers_.back().get();
  }

 private:
  std::vector<std::unique_ptr<char[]>> buffers_;
};

float Element(const char* data, DType dtype, size_t i) {
  uint16_t half;
  float value;
  switch (dtype) {
    case DType::kFloat16:
      std::memcpy(&half, data + 2 * i, 2);
      return attnserve::kernels::reference::HalfToFloat(half);
    case DType::kBFloat16:
      std::memcpy(&half, data + 2 * i, 2);
      return attnserve::kernels::reference::BFloat16ToFloat(half);
    case DType::kFloat32:
      break;
  }
  std::memcpy(&value, data + 4 * i, 4);
  return value;
}

size_t Count(const TensorView& t) { return t.size_bytes / attnserve::kernels::DTypeSize(t.dtype); }

float MaxAbs(const char* data, DType dtype, size_t n) {
  float max_abs = 0;
  for (size_t i = 0; i < n; ++i) {
    const float x = Element(data, dtype, i);
    if (!(std::fabs(x) <= max_abs)) max_abs = std::isnan(x) ? INFINITY : std::fabs(x);
  }
  return max_abs;
}

int64_t Work(const TensorView& q, const TensorView& k) {
  return q.shape[0] * k.shape[0] * q.shape[1] * q.shape[2];
}

void FuzzForward(const uint8_t* data, size_t size) {
  attnserve::v1::ForwardRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  auto inputs = attnserve::transport::DecodeForward(request);
  if (!inputs.ok()) return;
  if (!attnserve::engine::ValidateForward(*inputs, FuzzLimits()).ok()) return;
  if (Work(inputs->q, inputs->k) > kMaxWork) return;
  ExactBuffers buffers;
  for (TensorView* t : {&inputs->q, &inputs->k, &inputs->v}) buffers.Rebase(*t);
  auto result = attnserve::engine::RunForward(kReference, *inputs, kSingleThread);
  if (!result.ok()) std::abort();  // validated inputs must run

  float input_bound = 0;
  for (const TensorView* t : {&inputs->q, &inputs->k, &inputs->v}) {
    input_bound = std::fmax(input_bound, MaxAbs(t->data, t->dtype, Count(*t)));
  }
  const auto& o = inputs->options;
  if (!(input_bound <= kFiniteBound && std::fabs(o.softmax_scale) <= kFiniteBound)) return;
  // out is a convex combination of v's rows (or 0): finite and no larger than max|v|.
  const float v_bound = MaxAbs(inputs->v.data, inputs->v.dtype, Count(inputs->v));
  const float out_bound = MaxAbs(result->out.data.data(), result->out.dtype, Count(inputs->q));
  if (!(out_bound <= v_bound * 1.01f + 1e-6f)) std::abort();
  // lse is finite, or +inf for a row that sees no key; never NaN or -inf.
  const size_t lse_count = result->lse.data.size() / sizeof(float);
  for (size_t i = 0; i < lse_count; ++i) {
    const float lse = Element(result->lse.data.data(), DType::kFloat32, i);
    if (std::isnan(lse) || lse == -INFINITY) std::abort();
  }
}

void FuzzBackward(const uint8_t* data, size_t size) {
  attnserve::v1::BackwardRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  auto inputs = attnserve::transport::DecodeBackward(request);
  if (!inputs.ok()) return;
  if (!attnserve::engine::ValidateBackward(*inputs, FuzzLimits()).ok()) return;
  if (Work(inputs->q, inputs->k) > kMaxWork) return;
  ExactBuffers buffers;
  for (TensorView* t : {&inputs->dout, &inputs->q, &inputs->k, &inputs->v, &inputs->out,
                        &inputs->lse}) {
    buffers.Rebase(*t);
  }
  // Client-supplied lse and out need not be consistent, so gradients may be inf or NaN; the
  // kernel must still run, within bounds.
  if (!attnserve::engine::RunBackward(kReference, *inputs, kSingleThread).ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] & 1) {
    FuzzBackward(data + 1, size - 1);
  } else {
    FuzzForward(data + 1, size - 1);
  }
  return 0;
}
