"""FlashAttention's flash_attn_varlen_func over attnserve: a drop-in torch autograd function.

    from attnserve import flash_attn_varlen_func     # instead of: from flash_attn import ...

The forward calls the server's Forward; the backward calls its Backward with the forward's out
and lse, as FlashAttention's own backward uses them. Tensors may live on the CPU or a GPU:
they travel through host memory, and results come back on the input's device and dtype.
Needs torch (pip install attnserve[torch]); the rest of the package does not.
"""
from typing import Optional, Tuple, Union

import numpy as np
import torch
from ml_dtypes import bfloat16

from . import connections
from .client import Client
from .errors import UnsupportedOptionError

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _to_numpy(tensor: torch.Tensor, name: str) -> np.ndarray:
    if tensor.dtype not in _DTYPES:
        raise TypeError(f"{name}: dtype {tensor.dtype} is not supported "
                        "(use float16, bfloat16 or float32)")
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        # numpy has no bfloat16; ml_dtypes' has the same bits. int16 because older torch
        # cannot hand uint16 to numpy.
        return tensor.view(torch.int16).numpy().view(bfloat16)
    return tensor.numpy()


def _to_torch(array: np.ndarray, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Response arrays are read-only views of the message; torch wants memory it may write.
    if array.dtype == bfloat16:
        tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array.copy())
    return tensor.to(device=like.device, dtype=dtype)


def _offsets(cu_seqlens) -> np.ndarray:
    if isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens.detach().cpu().numpy()
    return np.asarray(cu_seqlens)


class FlashAttnVarlenFunc(torch.autograd.Function):
    """out, lse = Forward(q, k, v); dq, dk, dv = Backward(dout, q, k, v, out, lse)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, options, deterministic, client,
                timeout):
        offsets_q, offsets_k = _offsets(cu_seqlens_q), _offsets(cu_seqlens_k)
        result = client.forward(_to_numpy(q, "q"), _to_numpy(k, "k"), _to_numpy(v, "v"),
                                offsets_q, offsets_k, timeout=timeout, **options)
        out = _to_torch(result.out, q, q.dtype)
        lse = _to_torch(result.lse, q, torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.offsets = (offsets_q, offsets_k)
        ctx.call = (options, deterministic, client, timeout)
        # FlashAttention's backward ignores lse's gradient too.
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        options, deterministic, client, timeout = ctx.call
        tensors = [_to_numpy(t, name) for t, name in
                   ((dout.to(q.dtype), "dout"), (q, "q"), (k, "k"), (v, "v"), (out, "out"),
                    (lse, "lse"))]
        result = client.backward(*tensors, *ctx.offsets, deterministic=deterministic,
                                 timeout=timeout, **options)
        return (_to_torch(result.dq, q, q.dtype), _to_torch(result.dk, k, k.dtype),
                _to_torch(result.dv, v, v.dtype), None, None, None, None, None, None)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *,
                           client: Union[Client, str, None] = None,
                           timeout: Optional[float] = None):
    """FlashAttention 2's flash_attn_varlen_func, computed by an attnserve server.

    q [total_q, num_heads, head_dim], k and v [total_k, num_heads_k, head_dim] (float16,
    bfloat16 or float32, on any device); cu_seqlens_q/k int32 offsets [batch + 1]. Returns out
    [total_q, num_heads, head_dim] on q's device and dtype, differentiable in q, k and v. With
    return_attn_probs=True returns (out, softmax_lse, None): softmax_lse [num_heads, total_q]
    float32 as FlashAttention's, but the attention probabilities are never materialised (the
    server does not return them), so the third value is None.

    max_seqlen_q/k are accepted for compatibility; the server reads lengths from cu_seqlens.
    dropout_p > 0, alibi_slopes and block_table raise UnsupportedOptionError.

    Keyword-only extras: client (a Client, a target string, or None for
    attnserve.set_default_client's or $ATTNSERVE_TARGET's) and timeout (seconds, overriding the
    client's deadline for each call).
    """
    del max_seqlen_q, max_seqlen_k
    if dropout_p:
        raise UnsupportedOptionError(f"dropout_p={dropout_p}: attnserve has no attention "
                                     "dropout; pass dropout_p=0.0")
    if alibi_slopes is not None:
        raise UnsupportedOptionError("alibi_slopes: attnserve does not support ALiBi yet")
    if block_table is not None:
        raise UnsupportedOptionError("block_table: attnserve has no paged KV cache")
    options = {"softmax_scale": softmax_scale, "causal": bool(causal),
               "window_size": tuple(int(w) for w in window_size), "softcap": float(softcap)}
    out, lse = FlashAttnVarlenFunc.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, options,
                                         bool(deterministic), connections.resolve(client),
                                         timeout)
    return (out, lse, None) if return_attn_probs else out
