/* C ABI over attnserve::kernels::flash::Forward and Backward, for callers without C++ (Python's
   ctypes on torch tensors' data_ptr()s in the same process). Every pointer but the host
   cu_seqlens is a device pointer of the current CUDA device. */
#ifndef ATTNSERVE_KERNELS_FLASH_FLASH_CAPI_H_
#define ATTNSERVE_KERNELS_FLASH_FLASH_CAPI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_FLASH_CAPI_VERSION 2

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
  void* workspace;         /* device scratch of attn_flash_backward_workspace_bytes() bytes */
  size_t workspace_bytes;
} AttnBwdArgs;

int attn_flash_capi_version(void);

/* Bytes of device workspace attn_flash_backward needs for these args. */
size_t attn_flash_backward_workspace_bytes(const AttnBwdArgs* args);

/* Launches the backward on args->fwd.stream; returns like attn_flash_forward. */
int attn_flash_backward(const AttnBwdArgs* args, char* err, size_t errlen);

/* Launches the forward on args->stream. Returns 0 on success; otherwise nonzero with a
   NUL-terminated message in err (truncated to errlen bytes; err may be NULL). */
int attn_flash_forward(const AttnFwdArgs* args, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* ATTNSERVE_KERNELS_FLASH_FLASH_CAPI_H_ */
