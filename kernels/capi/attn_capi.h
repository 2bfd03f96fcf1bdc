/* C ABI over every GPU kernel family built in (kernels/kernel_families.h: "flash", "fallback",
   "cublas"), for callers without C++ (Python's ctypes on torch tensors' data_ptr()s in the same
   process, in tests and benchmarks). Every pointer but the host cu_seqlens is a device pointer
   of the current CUDA device. */
#ifndef ATTNSERVE_KERNELS_CAPI_ATTN_CAPI_H_
#define ATTNSERVE_KERNELS_CAPI_ATTN_CAPI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_CAPI_VERSION 5

/* AttnFwdArgs.disabled_paths bits: code paths a family must not take even where built and
   fitting, so a test or benchmark runs the next path down on the same device. */
#define ATTN_PATH_SM90_FORWARD 1u  /* flash's wgmma forward on Hopper: sm80 runs instead */
#define ATTN_PATH_SM90_BACKWARD 2u /* flash's wgmma dK/dV backward on Hopper: sm80 runs instead */

enum AttnDType { ATTN_DTYPE_FLOAT16 = 0, ATTN_DTYPE_BFLOAT16 = 1, ATTN_DTYPE_FLOAT32 = 2 };

typedef struct AttnFwdArgs {
  int32_t dtype; /* AttnDType */
  int32_t batch;
  int64_t total_q;
  int64_t total_k;
  int32_t num_heads;
  int32_t num_heads_k;
  int32_t head_dim;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
  int32_t causal;       /* 0 or 1 */
  int32_t window_left;  /* -1 = unbounded */
  int32_t window_right; /* -1 = unbounded */
  float softmax_scale;  /* > 0, already resolved */
  float softcap;        /* 0 = off */
  const int32_t* cu_seqlens_q_device;
  const int32_t* cu_seqlens_k_device;
  const int32_t* cu_seqlens_q_host; /* optional (NULL): checked against max_seqlen when given */
  const int32_t* cu_seqlens_k_host;
  const void* q;   /* [total_q, num_heads, head_dim] */
  const void* k;   /* [total_k, num_heads_k, head_dim] */
  const void* v;   /* [total_k, num_heads_k, head_dim] */
  void* out;       /* [total_q, num_heads, head_dim] */
  float* lse;      /* [num_heads, total_q] */
  void* stream;    /* cudaStream_t; NULL = default stream */
  int32_t compute_capability; /* code path to run (major*10+minor), 0 = the device's own */
  void* workspace;            /* forward scratch of attn_forward_workspace_bytes() bytes */
  size_t workspace_bytes;
  uint32_t disabled_paths; /* ATTN_PATH_* bits; 0 = every path */
  /* Dropout and ALiBi (AttentionOptions in kernels/attention_params.h, the mask's contract in
     kernels/dropout_mask.h). A family that cannot serve them fails with a message. */
  float dropout_p;              /* in [0, 1); 0 = off */
  uint64_t dropout_seed;        /* the Philox key; nonzero when dropout_p > 0 */
  const float* alibi_slopes;    /* device float32 slopes; NULL = off */
  int32_t alibi_slopes_stride;  /* 0: [num_heads]; num_heads: [batch, num_heads] */
  int32_t first_sequence;       /* the request's index of this launch's sequence 0 */
} AttnFwdArgs;

/* The backward: the forward's shape and options (fwd.out is the forward's output, fwd.lse its
   lse, both read only) plus the gradients. */
typedef struct AttnBwdArgs {
  AttnFwdArgs fwd;
  const void* dout; /* [total_q, num_heads, head_dim] */
  void* dq;         /* [total_q, num_heads, head_dim] */
  void* dk;         /* [total_k, num_heads_k, head_dim] */
  void* dv;         /* [total_k, num_heads_k, head_dim] */
  int32_t deterministic;   /* 0 or 1 */
  void* workspace;         /* device scratch of attn_backward_workspace_bytes() bytes */
  size_t workspace_bytes;
} AttnBwdArgs;

int attn_capi_version(void);

/* The GPU families built into this library, comma-separated, e.g. "flash,fallback,cublas". */
const char* attn_capi_families(void);

/* Bytes of device workspace attn_forward / attn_backward need for these args; 0 for an unknown
   family or dtype. */
size_t attn_forward_workspace_bytes(const char* family, const AttnFwdArgs* args);
size_t attn_backward_workspace_bytes(const char* family, const AttnBwdArgs* args);

/* Launch family's forward on args->stream (backward on args->fwd.stream). Return 0 on success;
   otherwise nonzero with a NUL-terminated message in err (truncated to errlen bytes; err may be
   NULL), e.g. for an unknown family or what the family cannot run. */
int attn_forward(const char* family, const AttnFwdArgs* args, char* err, size_t errlen);
int attn_backward(const char* family, const AttnBwdArgs* args, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSERVE_KERNELS_CAPI_ATTN_CAPI_H_ */
