"""Float64 numpy reference of FlashAttention >= 2.1 varlen attention, forward and backward.

Naive and dense per sequence, for tests and demos on small shapes. Semantics (shared/DESIGN.md):
s = scale * q.k^T, then softcap (s = softcap * tanh(s / softcap)), then masking, softmax, times v.
Query i of a sequence with sq queries and sk keys sees key j iff j <= i + sk - sq when causal,
and i + sk - sq - window_left <= j <= i + sk - sq + window_right with a window (a negative
bound is unbounded). Query head h reads kv head h // (num_heads // num_heads_k). A row that
sees no key gets out = 0, lse = +inf and zero gradients.
"""
import math

import numpy as np


def _f64(array) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def visible_mask(seqlen_q: int, seqlen_k: int, causal: bool = False,
                 window_size=(-1, -1)) -> np.ndarray:
    """[seqlen_q, seqlen_k] bool: which keys each query of one sequence may attend to."""
    left, right = window_size
    if causal:
        right = 0  # as FlashAttention does: causal is the window (left, 0)
    # Bottom-right alignment: the last query sits on the diagonal of the last key.
    diagonal = np.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    key = np.arange(seqlen_k)[None, :]
    mask = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if right >= 0:
        mask &= key <= diagonal + right
    if left >= 0:
        mask &= key >= diagonal - left
    return mask


def _scale(softmax_scale, head_dim: int) -> float:
    # None or 0 mean 1/sqrt(head_dim), as on the wire.
    return softmax_scale if softmax_scale else 1.0 / math.sqrt(head_dim)


def _sequences(cu_seqlens_q, cu_seqlens_k):
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    for b in range(len(cu_q) - 1):
        yield slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))


def _scores(q, k, scale, softcap, mask):
    """Masked scores [H, sq, sk] (-inf where hidden) and tanh(s / softcap) for the backward."""
    s = np.einsum("qhd,khd->hqk", q, k) * scale
    t = None
    if softcap:
        t = np.tanh(s / softcap)
        s = softcap * t
    return np.where(mask[None], s, -np.inf), t


def _expand_kv(x, groups):
    # [sk, H_k, D] -> [sk, H, D]: query head h reads kv head h // groups.
    return np.repeat(x, groups, axis=1)


def _reduce_kv(x, groups):
    # Inverse of _expand_kv for gradients: sum over the query heads sharing a kv head.
    sk, heads, dim = x.shape
    return x.reshape(sk, heads // groups, groups, dim).sum(axis=2)


def attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                      window_size=(-1, -1), softcap=0.0):
    """out [total_q, H, D] and lse [H, total_q], both float64."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    total_q, heads, dim = q.shape
    groups = heads // k.shape[1]
    scale = _scale(softmax_scale, dim)
    out = np.zeros_like(q)
    lse = np.full((heads, total_q), np.inf)
    for rows, cols in _sequences(cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = q[rows], _expand_kv(k[cols], groups), _expand_kv(v[cols], groups)
        mask = visible_mask(len(qs), len(ks), causal, window_size)
        s, _ = _scores(qs, ks, scale, softcap, mask)
        seen = mask.any(axis=1)[None, :, None]  # [1, sq, 1]
        peak = np.where(seen, s.max(axis=2, initial=-np.inf, keepdims=True), 0.0)
        p = np.exp(s - peak)
        total = p.sum(axis=2, keepdims=True)
        p /= np.where(seen, total, 1.0)
        out[rows] = np.einsum("hqk,khd->qhd", p, vs)
        row_lse = np.log(total, out=np.full_like(total, np.inf), where=seen) + peak
        lse[:, rows] = np.where(seen, row_lse, np.inf)[..., 0]
    return out, lse


def attention_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale=None,
                       causal=False, window_size=(-1, -1), softcap=0.0):
    """dq, dk, dv (float64) as a FlashAttention backward computes them from out and lse.

    Pass out = lse = None to recompute them exactly; pass a server's own forward results to
    get the gradients that server's backward should return for exactly those inputs.
    """
    return _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                     causal, window_size, softcap, term_scales=False)


def attention_backward_term_scales(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                   softmax_scale=None, causal=False, window_size=(-1, -1),
                                   softcap=0.0):
    """The scale of each element of dq, dk, dv, arguments as attention_backward's: every sum
    there (dP, D, dP - D, then dS K, dS^T Q, P^T dO) replaced by the root sum of squares of
    its terms, each term a product of its factors' scales.

    Terms of random sign sum to about their root sum of squares, so where nothing cancels the
    scale is about the gradient's size; where the terms cancel (a row that sees one key:
    dP = D exactly, dS = 0) the gradient shrinks to rounding noise and the scale does not. A
    float computation's rounding error is relative to the scale, not to the result.
    """
    return _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                     causal, window_size, softcap, term_scales=True)


def _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
              window_size, softcap, term_scales):
    if out is None or lse is None:
        out, lse = attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                                     window_size, softcap)
    dout, q, k, v, out, lse = map(_f64, (dout, q, k, v, out, lse))
    heads, dim = q.shape[1], q.shape[2]
    groups = heads // k.shape[1]
    scale = _scale(softmax_scale, dim)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for rows, cols in _sequences(cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = q[rows], _expand_kv(k[cols], groups), _expand_kv(v[cols], groups)
        mask = visible_mask(len(qs), len(ks), causal, window_size)
        s, t = _scores(qs, ks, scale, softcap, mask)
        # exp(-inf - lse) = 0 covers hidden keys, and lse = +inf covers rows that see no key.
        p = np.exp(s - lse[:, rows, None])
        dos, outs = dout[rows], out[rows]
        if term_scales:
            # Squares throughout: each sum below is then the sum of its terms' squares, and
            # the gradients' square roots are taken at the end.
            qs, ks, vs, dos, outs, p = (x * x for x in (qs, ks, vs, dos, outs, p))
        dv[cols] = _reduce_kv(np.einsum("hqk,qhd->khd", p, dos), groups)
        dp = np.einsum("qhd,khd->hqk", dos, vs)
        delta = np.einsum("qhd,qhd->hq", dos, outs)
        ds = p * (dp + delta[..., None] if term_scales else dp - delta[..., None])
        if t is not None:
            dtanh = 1.0 - t * t  # d(softcap * tanh(x / softcap)) / dx
            ds *= dtanh * dtanh if term_scales else dtanh
        factor = scale * scale if term_scales else scale
        dq[rows] = factor * np.einsum("hqk,khd->qhd", ds, ks)
        dk[cols] = _reduce_kv(factor * np.einsum("hqk,qhd->khd", ds, qs), groups)
    if term_scales:
        return np.sqrt(dq), np.sqrt(dk), np.sqrt(dv)
    return dq, dk, dv
