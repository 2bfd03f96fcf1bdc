"""FlashAttention 2's public Python API (flash-attn 2.6-2.8), computed by an attnserve server.

    from attnserve.flash_attn import flash_attn_func    # instead of: from flash_attn import ...

Same names, signatures, defaults, shapes and return values as flash_attn.flash_attn_interface,
plus FlashAttention 1.x's flash_attn_unpadded_*func names in 1.x's argument order (dropout_p
positional, return_attn_probs before deterministic). attnserve.install_flash_attn_shim() makes
`import flash_attn` resolve to these. Every function is differentiable in its tensor inputs
(packed qkv / kv included) and traceable by torch.compile: all of them end in the custom
operators of attnserve.torch_ops.

Tensors may live on the CPU or a GPU; results come back on q's device and dtype (float16,
bfloat16 or float32). With return_attn_probs=True a function returns FlashAttention's triple
(out, softmax_lse, S_dmask): softmax_lse in FlashAttention's shape ([batch, heads, seqlen] for
padded calls, [heads, total_q] for varlen ones, [batch, heads, max_seqlen_q] for the 1.x names),
float32, not differentiable; S_dmask is always None, with dropout too (the server never
materialises probabilities or the mask; flash-attn returns them only for testing). max_seqlen
arguments are accepted and unused (the server reads lengths from cu_seqlens). dropout_p and
alibi_slopes (float32 [nheads] or [batch, nheads]) have flash-attn 2.6's semantics; the backward
draws the forward's dropout mask (the server's seed travels with the autograd graph). The
server's CPU device serves them; its GPU kernel families do not yet, and say so in the error.
block_table raises attnserve.UnsupportedOptionError (a NotImplementedError) before anything is
sent.

Keyword-only extras on every function: client (a Client, a target string, or None for
attnserve.set_default_client's or $ATTNSERVE_TARGET's) and timeout (seconds per call).
"""
from typing import Optional, Union

import torch

from .client import Client
from .errors import UnsupportedOptionError
from .torch_ops import varlen_attention

__all__ = [
    "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
    "flash_attn_unpadded_func", "flash_attn_unpadded_kvpacked_func",
    "flash_attn_unpadded_qkvpacked_func", "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ClientArg = Union[Client, str, None]


def _check_options(block_table=None) -> None:
    if block_table is not None:
        raise UnsupportedOptionError("block_table: attnserve has no paged KV cache; pass "
                                     "block_table=None")


def _check_tensor(tensor: torch.Tensor, name: str, dims: int, layout: str) -> None:
    if tensor.dtype not in _DTYPES:
        raise TypeError(f"{name}: dtype {tensor.dtype} is not supported "
                        "(use float16, bfloat16 or float32)")
    if tensor.dim() != dims:
        raise ValueError(f"{name}: expected {dims} dimensions {layout}, got shape "
                         f"{list(tensor.shape)}")


def _cu_seqlens(cu_seqlens) -> torch.Tensor:
    if isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens
    return torch.tensor(cu_seqlens, dtype=torch.int32)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale, causal, window_size,
            softcap, alibi_slopes, deterministic, client, timeout, block_table=None):
    """out [total_q, H, D] and lse [H, total_q] of packed q, k, v [tokens, heads, head_dim]."""
    _check_options(block_table)
    for tensor, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_tensor(tensor, name, 3, "[tokens, heads, head_dim]")
    return varlen_attention(q, k, v, _cu_seqlens(cu_seqlens_q), _cu_seqlens(cu_seqlens_k),
                            softmax_scale, causal, window_size, softcap, deterministic, client,
                            timeout, alibi_slopes, dropout_p)


def _padded(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
            deterministic, return_attn_probs, client, timeout):
    """FlashAttention's padded call: [batch, seqlen, heads, head_dim] tensors as equal-length
    packed sequences."""
    for tensor, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_tensor(tensor, name, 4, "[batch, seqlen, heads, head_dim]")
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k = k.shape[1]
    cu_seqlens_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32)
    cu_seqlens_k = torch.arange(0, (batch + 1) * seqlen_k, seqlen_k, dtype=torch.int32)
    out, lse = varlen_attention(q.reshape(batch * seqlen_q, heads, -1),
                                k.reshape(batch * seqlen_k, *k.shape[2:]),
                                v.reshape(batch * seqlen_k, *v.shape[2:]), cu_seqlens_q,
                                cu_seqlens_k, softmax_scale, causal, window_size, softcap,
                                deterministic, client, timeout, alibi_slopes, dropout_p)
    out = out.view(batch, seqlen_q, heads, -1)
    if not return_attn_probs:
        return out
    lse = lse.view(heads, batch, seqlen_q).transpose(0, 1).contiguous()
    return out, lse, None


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, client: ClientArg = None,
                    timeout: Optional[float] = None):
    """q [batch, seqlen_q, heads, head_dim], k and v [batch, seqlen_k, heads_k, head_dim] (GQA/MQA
    when heads_k divides heads) -> out [batch, seqlen_q, heads, head_dim]; with
    return_attn_probs, (out, softmax_lse [batch, heads, seqlen_q], None)."""
    return _padded(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   deterministic, return_attn_probs, client, timeout)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *,
                              client: ClientArg = None, timeout: Optional[float] = None):
    """qkv [batch, seqlen, 3, heads, head_dim] -> out [batch, seqlen, heads, head_dim]."""
    _check_tensor(qkv, "qkv", 5, "[batch, seqlen, 3, heads, head_dim]")
    return _padded(*qkv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap,
                   alibi_slopes, deterministic, return_attn_probs, client, timeout)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *,
                             client: ClientArg = None, timeout: Optional[float] = None):
    """q [batch, seqlen_q, heads, head_dim], kv [batch, seqlen_k, 2, heads_k, head_dim]."""
    _check_tensor(kv, "kv", 5, "[batch, seqlen_k, 2, heads_k, head_dim]")
    return _padded(q, *kv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap,
                   alibi_slopes, deterministic, return_attn_probs, client, timeout)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *,
                           client: ClientArg = None, timeout: Optional[float] = None):
    """q [total_q, heads, head_dim], k and v [total_k, heads_k, head_dim]; cu_seqlens_q/k int32
    offsets [batch + 1] -> out [total_q, heads, head_dim]; with return_attn_probs,
    (out, softmax_lse [heads, total_q], None)."""
    del max_seqlen_q, max_seqlen_k
    out, lse = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale, causal,
                       window_size, softcap, alibi_slopes, deterministic, client, timeout,
                       block_table)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, client: ClientArg = None,
                                     timeout: Optional[float] = None):
    """qkv [total, 3, heads, head_dim] -> out [total, heads, head_dim]."""
    del max_seqlen
    _check_tensor(qkv, "qkv", 4, "[total, 3, heads, head_dim]")
    out, lse = _varlen(*qkv.unbind(1), cu_seqlens, cu_seqlens, dropout_p, softmax_scale, causal,
                       window_size, softcap, alibi_slopes, deterministic, client, timeout)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False, *,
                                    client: ClientArg = None, timeout: Optional[float] = None):
    """q [total_q, heads, head_dim], kv [total_k, 2, heads_k, head_dim]."""
    del max_seqlen_q, max_seqlen_k
    _check_tensor(kv, "kv", 4, "[total_k, 2, heads_k, head_dim]")
    out, lse = _varlen(q, *kv.unbind(1), cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale,
                       causal, window_size, softcap, alibi_slopes, deterministic, client, timeout)
    return (out, lse, None) if return_attn_probs else out


def _padded_lse(lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """FlashAttention 1.x's lse [batch, heads, max_seqlen] of a varlen lse [heads, total];
    positions past a sequence's end hold +inf, as rows that see no key do."""
    lengths = cu_seqlens.diff().to(torch.int64).cpu()
    batch, heads = lengths.numel(), lse.shape[0]
    padded = lse.new_full((batch, heads, int(max_seqlen)), float("inf"))
    positions = torch.arange(int(max_seqlen)).expand(batch, -1) < lengths[:, None]
    padded.transpose(1, 2)[positions.to(lse.device)] = lse.t()
    return padded


def _unpadded(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, dropout_p, softmax_scale, causal,
              return_attn_probs, deterministic, client, timeout):
    out, lse = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_p, softmax_scale, causal,
                       (-1, -1), 0.0, None, deterministic, client, timeout)
    if not return_attn_probs:
        return out
    return out, _padded_lse(lse, _cu_seqlens(cu_seqlens_q), max_seqlen_q), None


def flash_attn_unpadded_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             dropout_p, softmax_scale=None, causal=False, return_attn_probs=False,
                             deterministic=False, *, client: ClientArg = None,
                             timeout: Optional[float] = None):
    """FlashAttention 1.x's name and argument order for flash_attn_varlen_func."""
    del max_seqlen_k
    return _unpadded(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, dropout_p, softmax_scale,
                     causal, return_attn_probs, deterministic, client, timeout)


def flash_attn_unpadded_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p, softmax_scale=None,
                                       causal=False, return_attn_probs=False, deterministic=False,
                                       *, client: ClientArg = None,
                                       timeout: Optional[float] = None):
    """FlashAttention 1.x's flash_attn_varlen_qkvpacked_func: qkv [total, 3, heads, head_dim]."""
    _check_tensor(qkv, "qkv", 4, "[total, 3, heads, head_dim]")
    return _unpadded(*qkv.unbind(1), cu_seqlens, cu_seqlens, max_seqlen, dropout_p, softmax_scale,
                     causal, return_attn_probs, deterministic, client, timeout)


def flash_attn_unpadded_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, dropout_p, softmax_scale=None, causal=False,
                                      return_attn_probs=False, deterministic=False, *,
                                      client: ClientArg = None, timeout: Optional[float] = None):
    """FlashAttention 1.x's flash_attn_varlen_kvpacked_func: kv [total_k, 2, heads_k, head_dim]."""
    del max_seqlen_k
    _check_tensor(kv, "kv", 4, "[total_k, 2, heads_k, head_dim]")
    return _unpadded(q, *kv.unbind(1), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, dropout_p,
                     softmax_scale, causal, return_attn_probs, deterministic, client, timeout)


def flash_attn_with_kvcache(*args, **kwargs):
    """Present so that `from flash_attn import flash_attn_with_kvcache` (transformers does it)
    imports; attnserve has no KV cache, so calling it raises."""
    raise UnsupportedOptionError("flash_attn_with_kvcache: attnserve has no KV cache (inference "
                                 "decoding); use flash_attn_varlen_func")
