#include "kernels/flash/flash_capi.h"

#include <cstring>
#include <string>

#include "kernels/attention_params.h"
#include "kernels/flash/flash_attention.h"

namespace {

using attnserve::kernels::DType;

int Fail(const std::string& message, char* err, size_t errlen) {
  if (err != nullptr && errlen > 0) {
    const size_t n = message.size() < errlen - 1 ? message.size() : errlen - 1;
    std::memcpy(err, message.data(), n);
    err[n] = '\0';
  }
  return 1;
}

}  // namespace

extern "C" int attn_flash_capi_version(void) { return ATTN_FLASH_CAPI_VERSION; }

extern "C" int attn_flash_forward(const AttnFwdArgs* a, char* err, size_t errlen) {
  if (a == nullptr) return Fail("flash: args is null", err, errlen);
  attnserve::kernels::ForwardParams p;
  switch (a->dtype) {
    case ATTN_DTYPE_FLOAT16:
      p.shape.dtype = DType::kFloat16;
      break;
    case ATTN_DTYPE_BFLOAT16:
      p.shape.dtype = DType::kBFloat16;
      break;
    case ATTN_DTYPE_FLOAT32:
      p.shape.dtype = DType::kFloat32;
      break;
    default:
      return Fail("flash: unknown dtype " + std::to_string(a->dtype), err, errlen);
  }
  p.shape.batch = a->batch;
  p.shape.total_q = a->total_q;
  p.shape.total_k = a->total_k;
  p.shape.num_heads = a->num_heads;
  p.shape.num_heads_k = a->num_heads_k;
  p.shape.head_dim = a->head_dim;
  p.shape.cu_seqlens_q = a->cu_seqlens_q_host;
  p.shape.cu_seqlens_k = a->cu_seqlens_k_host;
  p.shape.cu_seqlens_q_device = a->cu_seqlens_q_device;
  p.shape.cu_seqlens_k_device = a->cu_seqlens_k_device;
  p.shape.max_seqlen_q = a->max_seqlen_q;
  p.shape.max_seqlen_k = a->max_seqlen_k;
  p.options.softmax_scale = a->softmax_scale;
  p.options.causal = a->causal != 0;
  p.options.window_left = a->window_left;
  p.options.window_right = a->window_right;
  p.options.softcap = a->softcap;
  p.q = a->q;
  p.k = a->k;
  p.v = a->v;
  p.out = a->out;
  p.lse = a->lse;
  attnserve::kernels::ExecutionContext ctx;
  ctx.stream = a->stream;
  const attnserve::kernels::KernelStatus status = attnserve::kernels::flash::Forward(p, ctx);
  if (!status.ok) return Fail(status.message, err, errlen);
  return 0;
}
