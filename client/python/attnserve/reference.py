"""Float64 numpy reference of FlashAttention 2.6 varlen attention, forward and backward.

Naive and dense per sequence, for tests and demos on small shapes. Semantics (shared/DESIGN.md):
s = scale * q.k^T, then softcap (s = softcap * tanh(s / softcap)), then ALiBi
(s -= slope * |i + sk - sq - j|), masking, softmax (lse is of this undropped softmax), dropout on
the probabilities (kept ones scaled by 1 / (1 - dropout_p)), times v. The dropout mask is the
server's exactly: Philox4x32-10 as kernels/dropout_mask.h specifies (dropout_keep below).
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


_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    """Philox4x32-10 (Random123) of 4 broadcastable uint32 counter arrays under key (k0, k1):
    4 uint32 arrays. Vectorised in uint64 so each 32x32-bit product keeps its high half."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = int(key[0]) & _MASK32, int(key[1]) & _MASK32
    m0, m1, low = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57), np.uint64(_MASK32)
    shift = np.uint64(32)
    for round_index in range(10):
        if round_index:
            k0, k1 = (k0 + 0x9E3779B9) & _MASK32, (k1 + 0xBB67AE85) & _MASK32
        p0, p1 = m0 * c0, m1 * c2  # < 2^64: no wrap-around
        c0, c1, c2, c3 = ((p1 >> shift) ^ c1 ^ np.uint64(k0), p1 & low,
                          (p0 >> shift) ^ c3 ^ np.uint64(k1), p0 & low)
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def dropout_threshold(dropout_p: float) -> int:
    """floor(p * 2^32) clamped to 2^32 - 1, with p rounded to float32 as the wire carries it."""
    p = float(np.float32(dropout_p))
    if p <= 0:
        return 0
    return min(math.floor(p * 2.0 ** 32), _MASK32)


def dropout_keep(seed: int, sequence: int, num_heads: int, seqlen_q: int, seqlen_k: int,
                 dropout_p: float) -> np.ndarray:
    """[num_heads, seqlen_q, seqlen_k] bool: which probabilities of one sequence (its index
    within the request) dropout keeps. Counter = (key column // 4, query row, head, sequence),
    key = the seed's low and high 32 bits; one call decides 4 consecutive key columns."""
    groups = (seqlen_k + 3) // 4
    heads = np.arange(num_heads, dtype=np.uint64)[:, None, None]
    rows = np.arange(seqlen_q, dtype=np.uint64)[None, :, None]
    columns = np.arange(groups, dtype=np.uint64)[None, None, :]
    shape = (num_heads, seqlen_q, groups)
    words = philox4x32_10(
        (np.broadcast_to(columns, shape), np.broadcast_to(rows, shape),
         np.broadcast_to(heads, shape), np.full(shape, sequence, dtype=np.uint64)),
        (seed & _MASK32, (seed >> 32) & _MASK32))
    bits = np.stack(words, axis=-1).reshape(num_heads, seqlen_q, groups * 4)[..., :seqlen_k]
    return bits >= np.uint32(dropout_threshold(dropout_p)) if dropout_p > 0 else \
        np.ones_like(bits, dtype=bool)


def _alibi_bias(alibi_slopes, sequence: int, num_heads: int, seqlen_q: int, seqlen_k: int):
    """[H, sq, sk] float64 -slope * |i + sk - sq - j|, or None without slopes."""
    if alibi_slopes is None:
        return None
    slopes = _f64(alibi_slopes)
    row = slopes if slopes.ndim == 1 else slopes[sequence]
    distance = np.abs(np.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
                      - np.arange(seqlen_k)[None, :])
    return -row.reshape(num_heads, 1, 1) * distance[None]


def _dropout_scale(dropout_p, dropout_seed, sequence, heads, seqlen_q, seqlen_k):
    """[H, sq, sk] factors 0 or 1 / (1 - p), or None without dropout."""
    if not dropout_p:
        return None
    keep = dropout_keep(dropout_seed, sequence, heads, seqlen_q, seqlen_k, dropout_p)
    return keep / (1.0 - float(np.float32(dropout_p)))


def _scale(softmax_scale, head_dim: int) -> float:
    # None or 0 mean 1/sqrt(head_dim), as on the wire.
    return softmax_scale if softmax_scale else 1.0 / math.sqrt(head_dim)


def _sequences(cu_seqlens_q, cu_seqlens_k):
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    for b in range(len(cu_q) - 1):
        yield slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))


def _scores(q, k, scale, softcap, mask, bias=None):
    """Masked scores [H, sq, sk] (-inf where hidden) and tanh(s / softcap) for the backward."""
    s = np.einsum("qhd,khd->hqk", q, k) * scale
    t = None
    if softcap:
        t = np.tanh(s / softcap)
        s = softcap * t
    if bias is not None:
        s = s + bias
    return np.where(mask[None], s, -np.inf), t


def _expand_kv(x, groups):
    # [sk, H_k, D] -> [sk, H, D]: query head h reads kv head h // groups.
    return np.repeat(x, groups, axis=1)


def _reduce_kv(x, groups):
    # Inverse of _expand_kv for gradients: sum over the query heads sharing a kv head.
    sk, heads, dim = x.shape
    return x.reshape(sk, heads // groups, groups, dim).sum(axis=2)


def attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                      window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                      dropout_seed=0):
    """out [total_q, H, D] and lse [H, total_q], both float64. alibi_slopes: [H] or [B, H]."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    total_q, heads, dim = q.shape
    groups = heads // k.shape[1]
    scale = _scale(softmax_scale, dim)
    out = np.zeros_like(q)
    lse = np.full((heads, total_q), np.inf)
    for b, (rows, cols) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k)):
        qs, ks, vs = q[rows], _expand_kv(k[cols], groups), _expand_kv(v[cols], groups)
        mask = visible_mask(len(qs), len(ks), causal, window_size)
        bias = _alibi_bias(alibi_slopes, b, heads, len(qs), len(ks))
        s, _ = _scores(qs, ks, scale, softcap, mask, bias)
        seen = mask.any(axis=1)[None, :, None]  # [1, sq, 1]
        peak = np.where(seen, s.max(axis=2, initial=-np.inf, keepdims=True), 0.0)
        p = np.exp(s - peak)
        total = p.sum(axis=2, keepdims=True)
        p /= np.where(seen, total, 1.0)
        drop = _dropout_scale(dropout_p, dropout_seed, b, heads, len(qs), len(ks))
        out[rows] = np.einsum("hqk,khd->qhd", p if drop is None else p * drop, vs)
        row_lse = np.log(total, out=np.full_like(total, np.inf), where=seen) + peak
        lse[:, rows] = np.where(seen, row_lse, np.inf)[..., 0]
    return out, lse


def attention_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale=None,
                       causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                       dropout_p=0.0, dropout_seed=0):
    """dq, dk, dv (float64) as a FlashAttention backward computes them from out and lse.

    Pass out = lse = None to recompute them exactly; pass a server's own forward results to
    get the gradients that server's backward should return for exactly those inputs.
    """
    return _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, dropout_p, dropout_seed,
                     term_scales=False)


def attention_backward_term_scales(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                   softmax_scale=None, causal=False, window_size=(-1, -1),
                                   softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                                   dropout_seed=0):
    """The scale of each element of dq, dk, dv, arguments as attention_backward's: every sum
    there (dP, D, dP - D, then dS K, dS^T Q, P^T dO) replaced by the root sum of squares of
    its terms, each term a product of its factors' scales.

    Terms of random sign sum to about their root sum of squares, so where nothing cancels the
    scale is about the gradient's size; where the terms cancel (a row that sees one key:
    dP = D exactly, dS = 0) the gradient shrinks to rounding noise and the scale does not. A
    float computation's rounding error is relative to the scale, not to the result.
    """
    return _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, dropout_p, dropout_seed,
                     term_scales=True)


def _backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
              window_size, softcap, alibi_slopes, dropout_p, dropout_seed, term_scales):
    if out is None or lse is None:
        out, lse = attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                                     window_size, softcap, alibi_slopes, dropout_p, dropout_seed)
    dout, q, k, v, out, lse = map(_f64, (dout, q, k, v, out, lse))
    heads, dim = q.shape[1], q.shape[2]
    groups = heads // k.shape[1]
    scale = _scale(softmax_scale, dim)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b, (rows, cols) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k)):
        qs, ks, vs = q[rows], _expand_kv(k[cols], groups), _expand_kv(v[cols], groups)
        mask = visible_mask(len(qs), len(ks), causal, window_size)
        bias = _alibi_bias(alibi_slopes, b, heads, len(qs), len(ks))
        s, t = _scores(qs, ks, scale, softcap, mask, bias)
        # exp(-inf - lse) = 0 covers hidden keys, and lse = +inf covers rows that see no key.
        p = np.exp(s - lse[:, rows, None])
        dos, outs = dout[rows], out[rows]
        # Dropout: out = (Z o P / (1 - p)).V, so dV takes the dropped P and dP the mask; D =
        # rowsum(dO o O) holds for the dropped O, and dS uses the undropped P.
        drop = _dropout_scale(dropout_p, dropout_seed, b, heads, len(qs), len(ks))
        if term_scales:
            # Squares throughout: each sum below is then the sum of its terms' squares, and
            # the gradients' square roots are taken at the end.
            qs, ks, vs, dos, outs, p = (x * x for x in (qs, ks, vs, dos, outs, p))
            drop = None if drop is None else drop * drop
        dropped = p if drop is None else p * drop
        dv[cols] = _reduce_kv(np.einsum("hqk,qhd->khd", dropped, dos), groups)
        dp = np.einsum("qhd,khd->hqk", dos, vs)
        if drop is not None:
            dp *= drop
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
