#include "kernels/capi/attn_capi.h"

#include <cstring>
#include <string>

#include "kernels/attention_params.h"
#include "kernels/kernel_families.h"

// disabled_paths passes through unchanged, so the two sets of bits must agree.
static_assert(ATTN_PATH_SM90_FORWARD == attnserve::kernels::kPathSm90Forward);
static_assert(ATTN_PATH_SM90_BACKWARD == attnserve::kernels::kPathSm90Backward);

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

// Shape and options of the C arguments; false (with a message) for an unknown dtype.
bool FillShape(const AttnFwdArgs* a, attnserve::kernels::AttentionShape* shape,
               attnserve::kernels::AttentionOptions* options, std::string* message) {
  attnserve::kernels::AttentionShape& s = *shape;
  switch (a->dtype) {
    case ATTN_DTYPE_FLOAT16:
      s.dtype = DType::kFloat16;
      break;
    case ATTN_DTYPE_BFLOAT16:
      s.dtype = DType::kBFloat16;
      break;
    case ATTN_DTYPE_FLOAT32:
      s.dtype = DType::kFloat32;
      break;
    default:
      *message = "unknown dtype " + std::to_string(a->dtype);
      return false;
  }
  s.batch = a->batch;
  s.total_q = a->total_q;
  s.total_k = a->total_k;
  s.num_heads = a->num_heads;
  s.num_heads_k = a->num_heads_k;
  s.head_dim = a->head_dim;
  s.cu_seqlens_q = a->cu_seqlens_q_host;
  s.cu_seqlens_k = a->cu_seqlens_k_host;
  s.cu_seqlens_q_device = a->cu_seqlens_q_device;
  s.cu_seqlens_k_device = a->cu_seqlens_k_device;
  s.max_seqlen_q = a->max_seqlen_q;
  s.max_seqlen_k = a->max_seqlen_k;
  options->softmax_scale = a->softmax_scale;
  options->causal = a->causal != 0;
  options->window_left = a->window_left;
  options->window_right = a->window_right;
  options->softcap = a->softcap;
  options->dropout_p = a->dropout_p;
  options->dropout_seed = a->dropout_seed;
  options->alibi_slopes_device = a->alibi_slopes;
  options->alibi_slopes_stride = a->alibi_slopes_stride;
  options->first_sequence = a->first_sequence;
  return true;
}

// Pointers and mode of the C backward arguments (shape and options come from FillShape).
attnserve::kernels::BackwardParams BackwardOf(const AttnBwdArgs* a) {
  attnserve::kernels::BackwardParams p;
  p.q = a->fwd.q;
  p.k = a->fwd.k;
  p.v = a->fwd.v;
  p.out = a->fwd.out;
  p.lse = a->fwd.lse;
  p.dout = a->dout;
  p.dq = a->dq;
  p.dk = a->dk;
  p.dv = a->dv;
  p.deterministic = a->deterministic != 0;
  return p;
}

// The GPU family called `name`; nullptr with a message naming the built ones otherwise.
const attnserve::kernels::KernelFamilyEntry* DeviceFamily(const char* name,
                                                          std::string* message) {
  const attnserve::kernels::KernelFamilyEntry* family =
      name == nullptr ? nullptr : attnserve::kernels::FindKernelFamily(name);
  if (family == nullptr || !family->runs_on_device) {
    *message = std::string("unknown GPU kernel family '") + (name ? name : "(null)") +
               "'; built: " + attn_capi_families();
    return nullptr;
  }
  return family;
}

attnserve::kernels::ForwardParams ForwardOf(const AttnFwdArgs* a) {
  attnserve::kernels::ForwardParams p;
  p.q = a->q;
  p.k = a->k;
  p.v = a->v;
  p.out = a->out;
  p.lse = a->lse;
  return p;
}

attnserve::kernels::ExecutionContext ContextOf(const AttnFwdArgs* a, void* workspace,
                                               size_t workspace_bytes) {
  attnserve::kernels::ExecutionContext ctx;
  ctx.stream = a->stream;
  ctx.workspace = workspace;
  ctx.workspace_bytes = workspace_bytes;
  ctx.compute_capability = a->compute_capability;
  ctx.disabled_paths = a->disabled_paths;
  return ctx;
}

}  // namespace

extern "C" int attn_capi_version(void) { return ATTN_CAPI_VERSION; }

extern "C" const char* attn_capi_families(void) {
  static const std::string names = [] {
    std::string joined;
    for (const auto& family : attnserve::kernels::BuiltKernelFamilies()) {
      if (!family.runs_on_device) continue;
      if (!joined.empty()) joined += ",";
      joined += family.name;
    }
    return joined;
  }();
  return names.c_str();
}

extern "C" size_t attn_forward_workspace_bytes(const char* name, const AttnFwdArgs* a) {
  std::string message;
  const auto* family = DeviceFamily(name, &message);
  if (family == nullptr || a == nullptr) return 0;
  attnserve::kernels::ForwardParams p = ForwardOf(a);
  if (!FillShape(a, &p.shape, &p.options, &message)) return 0;
  return family->forward_workspace_bytes(p);
}

extern "C" int attn_forward(const char* name, const AttnFwdArgs* a, char* err, size_t errlen) {
  std::string message;
  const auto* family = DeviceFamily(name, &message);
  if (family == nullptr) return Fail(message, err, errlen);
  if (a == nullptr) return Fail("args is null", err, errlen);
  attnserve::kernels::ForwardParams p = ForwardOf(a);
  if (!FillShape(a, &p.shape, &p.options, &message)) return Fail(message, err, errlen);
  const attnserve::kernels::KernelStatus status =
      family->forward(p, ContextOf(a, a->workspace, a->workspace_bytes));
  if (!status.ok) return Fail(status.message, err, errlen);
  return 0;
}

extern "C" size_t attn_backward_workspace_bytes(const char* name, const AttnBwdArgs* a) {
  std::string message;
  const auto* family = DeviceFamily(name, &message);
  if (family == nullptr || a == nullptr) return 0;
  attnserve::kernels::BackwardParams p = BackwardOf(a);
  if (!FillShape(&a->fwd, &p.shape, &p.options, &message)) return 0;
  return family->backward_workspace_bytes(p, /*code_path=*/{});  // whichever path runs
}

extern "C" int attn_backward(const char* name, const AttnBwdArgs* a, char* err, size_t errlen) {
  std::string message;
  const auto* family = DeviceFamily(name, &message);
  if (family == nullptr) return Fail(message, err, errlen);
  if (a == nullptr) return Fail("args is null", err, errlen);
  attnserve::kernels::BackwardParams p = BackwardOf(a);
  if (!FillShape(&a->fwd, &p.shape, &p.options, &message)) return Fail(message, err, errlen);
  const attnserve::kernels::KernelStatus status =
      family->backward(p, ContextOf(&a->fwd, a->workspace, a->workspace_bytes));
  if (!status.ok) return Fail(status.message, err, errlen);
  return 0;
}
