"""Local torch attention over packed sequences, the ground truth for the drop-in's tests: torch's
scaled_dot_product_attention one sequence at a time (eager softmax where softcap needs it),
with the masks of attnserve.reference so causal and windows are FlashAttention's
bottom-right-aligned ones."""
import math

import torch
import torch.nn.functional as F

from attnserve import reference


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                     window_size=(-1, -1), softcap=0.0):
    """out [total_q, H, D] of packed q [total_q, H, D], k and v [total_k, H_k, D]."""
    groups = q.shape[1] // k.shape[1]
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs = []
    for b in range(len(bounds_q) - 1):
        rows, cols = slice(bounds_q[b], bounds_q[b + 1]), slice(bounds_k[b], bounds_k[b + 1])
        # [tokens, heads, dim] -> [heads, tokens, dim]; query head h reads kv head h // groups.
        qs = q[rows].transpose(0, 1)
        ks, vs = (t[cols].repeat_interleave(groups, dim=1).transpose(0, 1) for t in (k, v))
        mask = torch.from_numpy(reference.visible_mask(qs.shape[1], ks.shape[1], causal,
                                                       window_size)).to(q.device)
        if softcap:
            scale = softmax_scale or 1.0 / math.sqrt(q.shape[-1])
            scores = softcap * torch.tanh(qs @ ks.transpose(1, 2) * (scale / softcap))
            out = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1) @ vs
        else:
            out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                 scale=softmax_scale)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)
