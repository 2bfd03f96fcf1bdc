"""flash_attn.bert_padding's helpers: between padded [batch, seqlen, ...] tensors with a 2-D
attention mask and the packed [tokens, ...] layout with cu_seqlens that the varlen functions take.

unpad_input returns 4 values (states, indices, cu_seqlens, max_seqlen_in_batch) as flash-attn
before 2.7 did, which is what the patches of LLaVA, FastChat and InternVL unpack, or 5 (adding
seqused, the per-sequence count of tokens selected by attention_mask alone) as flash-attn 2.7 and
later do. UNPAD_INPUT_RETURNS chooses; it starts from $ATTNSERVE_UNPAD_INPUT_RETURNS (4 when
unset) and install_flash_attn_shim(unpad_input_returns=...) sets it.

Gathers and scatters are index_select / index_copy, whose gradients torch derives, so they are
differentiable and traceable by torch.compile.
"""
import os

import torch
import torch.nn.functional as F

__all__ = ["index_first_axis", "index_put_first_axis", "pad_input", "unpad_input"]

UNPAD_INPUT_RETURNS_ENV = "ATTNSERVE_UNPAD_INPUT_RETURNS"


def _returns_from_env() -> int:
    value = os.environ.get(UNPAD_INPUT_RETURNS_ENV, "").strip() or "4"
    if value not in ("4", "5"):
        raise ValueError(f"${UNPAD_INPUT_RETURNS_ENV}={value!r}: expected 4 or 5")
    return int(value)


UNPAD_INPUT_RETURNS = _returns_from_env()


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """input[indices] along the first axis: [first, ...] -> [len(indices), ...]."""
    flat = input.reshape(input.shape[0], -1)
    return flat.index_select(0, indices).reshape(-1, *input.shape[1:])


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor,
                         first_axis_dim: int) -> torch.Tensor:
    """Zeros [first_axis_dim, ...] with values' rows at indices."""
    flat = values.reshape(values.shape[0], -1)
    output = flat.new_zeros(first_axis_dim, flat.shape[1]).index_copy(0, indices, flat)
    return output.reshape(first_axis_dim, *values.shape[1:])


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor,
                unused_mask: torch.Tensor = None):
    """hidden_states [batch, seqlen, ...], attention_mask [batch, seqlen] (1 = token) ->
    states [tokens, ...], indices [tokens] into the flattened batch, cu_seqlens [batch + 1] int32,
    max_seqlen_in_batch (int), and with UNPAD_INPUT_RETURNS = 5 seqused [batch] int32.
    unused_mask (flash-attn 2.7's) marks tokens kept in the packed layout but not attended."""
    selected = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    states = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    result = (states, indices, cu_seqlens, int(seqlens.max()))
    if UNPAD_INPUT_RETURNS == 5:
        result += (attention_mask.sum(dim=-1, dtype=torch.int32),)
    return result


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int,
              seqlen: int) -> torch.Tensor:
    """The inverse of unpad_input: states [tokens, ...] -> [batch, seqlen, ...], zeros at
    padding."""
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.reshape(batch, seqlen, *hidden_states.shape[1:])
