"""register_with_transformers(): attn_implementation="attnserve" in Hugging Face transformers.

    attnserve.register_with_transformers()          # name="attnserve"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnserve")

The attention function goes into transformers' AttentionInterface and FlashAttention 2's mask
function into its AttentionMaskInterface under the same name, so models hand it what they hand
FlashAttention: a 2-D padding mask [batch, kv_len] (None without padding) and the packed-sequence
keyword arguments. It serves, like transformers' FlashAttention path:
- padded batches: the mask's tokens are packed (bert_padding.unpad_input), attended as varlen
  sequences and scattered back;
- packed sequences: cu_seq_lens_q/k (DataCollatorWithFlattening(return_flash_attn_kwargs=True)),
  or position_ids that restart (batch 1, DataCollatorWithFlattening's default);
- otherwise flash_attn_func on the padded tensors, causal bottom-right aligned (decoding with a
  cache included);
- GQA/MQA, `scaling`, `softcap`, and `sliding_window` as FlashAttention's window
  (sliding_window - 1, sliding_window - 1), as transformers maps it.
Attention dropout (a model's attention_dropout in training) goes to the server as flash-attn's
dropout_p (the CPU device serves it; GPU kernel families say they do not yet). output_attentions'
need for probabilities raises UnsupportedOptionError (they are never materialised).

Needs transformers >= 4.53 (AttentionMaskInterface; AttentionInterface came in 4.48). Older
versions build 4-D masks for custom attention, which a varlen server cannot take: use
install_flash_attn_shim() with attn_implementation="flash_attention_2" there.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .bert_padding import index_first_axis, pad_input
from .errors import UnsupportedOptionError
from .flash_attn import flash_attn_func, flash_attn_varlen_func


def _unpad(mask: torch.Tensor):
    """indices of the mask's tokens in the flattened batch, cu_seqlens, max_seqlen."""
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    return indices, cu_seqlens, int(seqlens.max())


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1, *tensor.shape[2:])


def _restarts(position_ids: Optional[torch.Tensor], batch: int, length: int):
    """cu_seqlens of sequences packed into one row, where position_ids restart; else None."""
    if position_ids is None or batch != 1 or length == 1:
        return None
    positions = position_ids.reshape(-1)
    # Packed sequences all restart at the same first position id (0 for most models).
    starts = (positions == positions.min()).nonzero().flatten()
    if starts.numel() <= 1:
        return None
    return torch.cat([starts, starts.new_tensor([positions.numel()])]).to(torch.int32)


def attnserve_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                        dropout: float = 0.0, scaling: Optional[float] = None,
                        sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                        is_causal: Optional[bool] = None,
                        **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention function signature: query [batch, heads, q_len, head_dim], key
    and value [batch, kv_heads, kv_len, head_dim] -> ([batch, q_len, heads, head_dim], None)."""
    if kwargs.get("output_attentions"):
        raise UnsupportedOptionError("output_attentions: attnserve never materialises the "
                                     "attention probabilities; use attn_implementation='eager'")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"attention_mask: expected the 2-D padding mask of transformers' "
                         f"FlashAttention mask function, got shape {list(attention_mask.shape)} "
                         "(transformers >= 4.53 builds it for attnserve)")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [batch, tokens, heads, dim]
    head_dim, v_head_dim = q.shape[-1], v.shape[-1]
    if v_head_dim != head_dim:  # e.g. MLA: the server takes one head_dim, as FlashAttention
        v = F.pad(v, [0, head_dim - v_head_dim])
    batch, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
    window = (-1, -1)
    if sliding_window is not None and kv_len > sliding_window:
        window = (sliding_window - 1, sliding_window - 1)
    options = {"dropout_p": dropout, "softmax_scale": scaling, "window_size": window,
               "causal": is_causal if is_causal is not None else getattr(module, "is_causal", True),
               "softcap": softcap or 0.0}

    if attention_mask is not None:
        indices_k, cu_seqlens_k, max_k = _unpad(attention_mask)
        k, v = index_first_axis(_flat(k), indices_k), index_first_axis(_flat(v), indices_k)
        if q_len == kv_len:
            indices_q, cu_seqlens_q, max_q = indices_k, cu_seqlens_k, max_k
        else:  # a cache holds earlier tokens: the queries are the mask's last q_len columns
            indices_q, cu_seqlens_q, max_q = _unpad(attention_mask[:, -q_len:])
        out = flash_attn_varlen_func(index_first_axis(_flat(q), indices_q), k, v, cu_seqlens_q,
                                     cu_seqlens_k, max_q, max_k, **options)
        out = pad_input(out, indices_q, batch, q_len)
    else:
        cu_seqlens_q, cu_seqlens_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
        if cu_seqlens_q is None or cu_seqlens_k is None:
            cu_seqlens_q = cu_seqlens_k = (_restarts(kwargs.get("position_ids"), batch, q_len)
                                           if q_len == kv_len else None)
        if cu_seqlens_q is not None:
            out = flash_attn_varlen_func(_flat(q), _flat(k), _flat(v), cu_seqlens_q,
                                         cu_seqlens_k, kwargs.get("max_length_q"),
                                         kwargs.get("max_length_k"), **options)
            out = out.view(batch, q_len, *out.shape[1:])
        else:
            out = flash_attn_func(q, k, v, **options)
    if v_head_dim != head_dim:
        out = out[..., :v_head_dim]
    return out, None


def register_with_transformers(name: str = "attnserve") -> None:
    """Makes attn_implementation=name select attnserve in Hugging Face transformers (models that
    support custom attention: those with _supports_attention_backend, Llama, Mistral, Qwen2,
    Gemma2, ... among them). The server is set_default_client's or $ATTNSERVE_TARGET's."""
    from transformers import AttentionInterface
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError as error:
        raise ImportError("attnserve.register_with_transformers needs transformers >= 4.53 "
                          "(AttentionMaskInterface)") from error
    AttentionInterface.register(name, attnserve_attention)
    # FlashAttention 2's: the 2-D padding mask, or None when nothing is padded.
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
