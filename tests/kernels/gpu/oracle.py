"""Oracles for the GPU kernel tests: exact float64 attention with explicit masks, and PyTorch's
own low-precision attention on the same inputs (the error budget our kernels are held to).
Semantics: FlashAttention >= 2.1 varlen (shared/DESIGN.md, "Semantics")."""

import dataclasses
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class Options:
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    softmax_scale: float | None = None  # None: 1/sqrt(head_dim)

    def scale(self, head_dim):
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(head_dim)


def visible_mask(len_q, len_k, opts, device):
    """[len_q, len_k] bool: query i sees key j (bottom-right aligned causal / window)."""
    i = torch.arange(len_q, device=device)[:, None]
    j = torch.arange(len_k, device=device)[None, :]
    diagonal = i + (len_k - len_q)
    mask = torch.ones(len_q, len_k, dtype=torch.bool, device=device)
    if opts.causal:
        mask &= j <= diagonal
    if opts.window_right >= 0:
        mask &= j <= diagonal + opts.window_right
    if opts.window_left >= 0:
        mask &= j >= diagonal - opts.window_left
    return mask


def _sequences(cu_q, cu_k):
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cu_q) - 1):
        yield b, cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]


def _heads_first(x, group):
    """[len, Hk, D] -> [H, len, D], each kv head repeated for its `group` query heads."""
    return x.transpose(0, 1).repeat_interleave(group, dim=0)


def reference(q, k, v, cu_q, cu_k, opts):
    """float64 out [total_q, H, D] and lse [H, total_q]; rows that see no key: out 0, lse +inf.
    Also returns the bool row mask [total_q] of rows that see at least one key."""
    total_q, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((num_heads, total_q), math.inf, dtype=torch.float64, device=q.device)
    seen = torch.zeros(total_q, dtype=torch.bool, device=q.device)
    for _, q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        if q1 == q0:
            continue
        mask = visible_mask(q1 - q0, k1 - k0, opts, q.device)
        rows = mask.any(dim=1)
        seen[q0:q1] = rows
        if not rows.any():
            continue
        qb = q[q0:q1].double().transpose(0, 1)
        kb = _heads_first(k[k0:k1].double(), group)
        vb = _heads_first(v[k0:k1].double(), group)
        s = opts.scale(head_dim) * qb @ kb.transpose(1, 2)
        if opts.softcap > 0:
            s = opts.softcap * torch.tanh(s / opts.softcap)
        s = s.masked_fill(~mask, -math.inf)
        lse_b = torch.logsumexp(s, dim=-1)  # -inf on empty rows
        p = torch.exp(s - lse_b[..., None]).nan_to_num(0.0)
        out[q0:q1] = (p @ vb).transpose(0, 1)
        lse[:, q0:q1] = torch.where(rows[None, :], lse_b, math.inf)
    return out, lse, seen


def pytorch_low_precision(q, k, v, cu_q, cu_k, opts):
    """PyTorch's own attention in q's dtype, per sequence: scaled_dot_product_attention with an
    explicit mask, or, with softcap (which SDPA lacks), fp32 scores and dtype-rounded P V.
    Rows that see no key are left 0."""
    total_q, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    out = torch.zeros_like(q)
    scale = opts.scale(head_dim)
    for _, q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        if q1 == q0 or k1 == k0:
            continue
        mask = visible_mask(q1 - q0, k1 - k0, opts, q.device)
        rows = mask.any(dim=1)
        if not rows.any():
            continue
        qb = q[q0:q1].transpose(0, 1)
        kb = _heads_first(k[k0:k1], group)
        vb = _heads_first(v[k0:k1], group)
        if opts.softcap > 0:
            s = scale * qb.float() @ kb.float().transpose(1, 2)
            s = opts.softcap * torch.tanh(s / opts.softcap)
            p = torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1).nan_to_num(0.0)
            ob = (p.to(q.dtype) @ vb).float()
        else:
            ob = F.scaled_dot_product_attention(
                qb[None], kb[None], vb[None], attn_mask=mask[None, None], scale=scale)[0].float()
        ob = torch.where(rows[None, :, None], ob.nan_to_num(0.0), 0.0)
        out[q0:q1] = ob.transpose(0, 1).to(q.dtype)
    return out


def relative_error(x, ref):
    ref_norm = ref.norm().item()
    err = (x.double() - ref).norm().item()
    return err / ref_norm if ref_norm > 0 else err
