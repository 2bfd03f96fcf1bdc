"""Oracles for the backward GPU tests: float64 gradients through autograd with explicit masks,
and PyTorch's own low-precision backward on the same inputs (the error budget our kernels are
held to). Rows that see no key get zero gradients (FlashAttention's lse = +inf convention)."""

import math

import torch
import torch.nn.functional as F

from oracle import _heads_first, _sequences, visible_mask


def _attention_grads(q, k, v, dout, cu_q, cu_k, opts, low_precision):
    total_q, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    dtype = q.dtype if low_precision else torch.float64
    dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=dtype, device=q.device)
    scale = opts.scale(head_dim)
    for _, q0, q1, k0, k1 in _sequences(cu_q, cu_k):
        if q1 == q0 or k1 == k0:
            continue
        mask = visible_mask(q1 - q0, k1 - k0, opts, q.device)
        rows = mask.any(dim=1)
        if not rows.any():
            continue
        # Only rows that see a key take part; the others have zero gradients.
        qb = q[q0:q1][rows].to(dtype).detach().requires_grad_()
        kb = k[k0:k1].to(dtype).detach().requires_grad_()
        vb = v[k0:k1].to(dtype).detach().requires_grad_()
        dob = dout[q0:q1][rows].to(dtype)
        mask = mask[rows]
        qh = qb.transpose(0, 1)
        kh = _heads_first(kb, group)
        vh = _heads_first(vb, group)
        if low_precision and opts.softcap == 0:
            out = F.scaled_dot_product_attention(qh[None], kh[None], vh[None],
                                                 attn_mask=mask[None, None], scale=scale)[0]
        else:
            compute = torch.float32 if low_precision else torch.float64
            s = scale * qh.to(compute) @ kh.to(compute).transpose(1, 2)
            if opts.softcap > 0:
                s = opts.softcap * torch.tanh(s / opts.softcap)
            p = torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1)
            out = p.to(dtype) @ vh
        out.backward(dob.transpose(0, 1).to(out.dtype))
        dq[q0:q1][rows] = qb.grad
        dk[k0:k1] = kb.grad
        dv[k0:k1] = vb.grad
    return dq, dk, dv


def reference_grads(q, k, v, dout, cu_q, cu_k, opts):
    """float64 (dq, dk, dv)."""
    return _attention_grads(q, k, v, dout, cu_q, cu_k, opts, low_precision=False)


def pytorch_low_precision_grads(q, k, v, dout, cu_q, cu_k, opts):
    """PyTorch's backward in q's dtype: SDPA with an explicit mask, or with softcap (which SDPA
    lacks) fp32 scores and a dtype-rounded P V."""
    return _attention_grads(q, k, v, dout, cu_q, cu_k, opts, low_precision=True)
