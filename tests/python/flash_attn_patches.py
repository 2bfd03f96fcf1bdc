"""The attention cores of two monkey patches written for FlashAttention, as their projects have
them (imports at the top, FlashAttention's calls and argument order), for test_flash_attn_shim
to import under attnserve's shim: LLaVA's llama_flash_attn_monkey_patch (1.x name with the 2.x
fallback, unpad -> varlen qkvpacked -> pad) and FastChat's llama2_flash_attn_monkey_patch
(flash_attn_func without a mask, unpad q and stacked kv -> varlen kvpacked -> pad with one,
GQA-ready). Importing this module needs `flash_attn` importable."""
import torch
from flash_attn import __version__ as flash_attn_version
from flash_attn.bert_padding import pad_input, unpad_input
from flash_attn.flash_attn_interface import flash_attn_func, flash_attn_varlen_kvpacked_func

try:  # LLaVA: FlashAttention 1.x's name first, 2.x's otherwise
    from flash_attn.flash_attn_interface import flash_attn_unpadded_qkvpacked_func
except ImportError:
    from flash_attn.flash_attn_interface import (
        flash_attn_varlen_qkvpacked_func as flash_attn_unpadded_qkvpacked_func)

assert flash_attn_version >= "2.1.0"  # FastChat's llama2 patch needs flash-attn 2


def llava_attention(query_states, key_states, value_states, key_padding_mask):
    """q, k, v [bsz, num_heads, q_len, head_dim]; key_padding_mask [bsz, q_len] or None ->
    [bsz, q_len, num_heads * head_dim]."""
    bsz, num_heads, q_len, head_dim = query_states.shape
    qkv = torch.stack([query_states, key_states, value_states], dim=2)
    qkv = qkv.transpose(1, 3)  # [bsz, q_len, 3, num_heads, head_dim]
    if key_padding_mask is None:
        qkv = qkv.reshape(-1, 3, num_heads, head_dim)
        cu_q_lens = torch.arange(0, (bsz + 1) * q_len, step=q_len, dtype=torch.int32,
                                 device=qkv.device)
        max_s = q_len
        output = flash_attn_unpadded_qkvpacked_func(qkv, cu_q_lens, max_s, 0.0,
                                                    softmax_scale=None, causal=True)
        return output.view(bsz, q_len, -1)
    qkv = qkv.reshape(bsz, q_len, -1)
    qkv, indices, cu_q_lens, max_s = unpad_input(qkv, key_padding_mask)
    qkv = qkv.view(-1, 3, num_heads, head_dim)
    output_unpad = flash_attn_unpadded_qkvpacked_func(qkv, cu_q_lens, max_s, 0.0,
                                                      softmax_scale=None, causal=True)
    output_unpad = output_unpad.reshape(-1, num_heads * head_dim)
    return pad_input(output_unpad, indices, bsz, q_len)


def fastchat_llama2_attention(q, k, v, attention_mask):
    """q [bsz, q_len, num_heads, head_dim], k and v [bsz, kv_len, num_kv_heads, head_dim];
    attention_mask [bsz, kv_len] or None -> [bsz, q_len, num_heads * head_dim]."""
    bsz, q_len, num_heads, head_dim = q.shape
    if attention_mask is None:
        return flash_attn_func(q, k, v, 0.0, softmax_scale=None, causal=True).view(bsz, q_len, -1)
    q, indices, cu_q_lens, max_s = unpad_input(q, attention_mask[:, -q_len:])
    kv, _, cu_k_lens, max_k = unpad_input(torch.stack((k, v), dim=2), attention_mask)
    output_unpad = flash_attn_varlen_kvpacked_func(q, kv, cu_q_lens, cu_k_lens, max_s, max_k, 0.0,
                                                   softmax_scale=None, causal=True)
    output_unpad = output_unpad.reshape(-1, num_heads * head_dim)
    return pad_input(output_unpad, indices, bsz, q_len)
