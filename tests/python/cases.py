"""Attention problems shared by the Python tests: shapes, options, random inputs, tolerances."""
from dataclasses import dataclass, field
from typing import Dict, Sequence

import numpy as np
from ml_dtypes import bfloat16

from attnserve import reference

DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(bfloat16)}

# Relative Frobenius error against float64 computed from the same rounded inputs (float32
# gradients: relative to the scales of their terms, gradient_error).
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3, np.dtype(bfloat16): 1e-2}
LSE_TOLERANCE = 1e-5  # lse is float32 whatever the input dtype


@dataclass(frozen=True)
class Case:
    name: str
    seqlens_q: Sequence[int]
    seqlens_k: Sequence[int]
    heads: int = 2
    heads_k: int = 2
    dim: int = 32
    options: Dict = field(default_factory=dict)
    q_scale: float = 1.0  # larger queries make softcap and the softmax's sharpness matter

    @property
    def cu_seqlens_q(self):
        return np.concatenate([[0], np.cumsum(self.seqlens_q)]).astype(np.int32)

    @property
    def cu_seqlens_k(self):
        return np.concatenate([[0], np.cumsum(self.seqlens_k)]).astype(np.int32)


CASES = [
    Case("basic", [17, 5, 40], [17, 5, 40], heads=4, heads_k=4),
    Case("several_seqs", [1, 9, 3, 30, 12, 2], [1, 9, 3, 30, 12, 2], dim=16),
    Case("causal_q_shorter", [7, 20, 1], [15, 20, 30], options={"causal": True}),
    # More queries than keys: the first rows of each sequence see no key at all.
    Case("causal_q_longer", [12, 30], [5, 8], dim=16, options={"causal": True}),
    Case("window", [25, 10], [25, 18], options={"window_size": (5, 3)}),
    Case("window_causal", [40, 13], [40, 13], heads=3, heads_k=3, dim=24,
         options={"causal": True, "window_size": (6, 0)}),
    Case("window_left_only", [30], [22], dim=16, options={"window_size": (4, -1)}),
    Case("window_right_only", [10], [16], dim=16, options={"window_size": (-1, 2)}),
    Case("softcap_scale", [20, 33], [20, 33], q_scale=3.0,
         options={"softcap": 5.0, "softmax_scale": 0.3, "causal": True}),
    Case("gqa", [19, 23], [19, 23], heads=8, heads_k=2, options={"causal": True}),
    Case("mqa", [11, 6], [14, 20], heads=4, heads_k=1, dim=64),
    Case("empty_seqs", [0, 10, 5, 0, 7], [8, 0, 12, 0, 7], dim=16),
    Case("head_dim_128", [16], [24], dim=128, options={"causal": True}),
]


def make_inputs(case: Case, dtype, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    """Random q, k, v, dout of the case's shapes, rounded to dtype (never zeros)."""
    total_q, total_k = int(sum(case.seqlens_q)), int(sum(case.seqlens_k))

    def randn(tokens, heads, scale=1.0):
        return (scale * rng.standard_normal((tokens, heads, case.dim))).astype(dtype)

    return {
        "q": randn(total_q, case.heads, case.q_scale),
        "k": randn(total_k, case.heads_k),
        "v": randn(total_k, case.heads_k),
        "dout": randn(total_q, case.heads),
        "cu_seqlens_q": case.cu_seqlens_q,
        "cu_seqlens_k": case.cu_seqlens_k,
    }


def rel_error(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-300))


def forward_errors(result, inputs, options) -> Dict[str, float]:
    """Relative errors of a server forward result; raises AssertionError on a wrong layout."""
    ref_out, ref_lse = reference.attention_forward(
        inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
        **options)
    assert result.out.dtype == inputs["q"].dtype and result.out.shape == ref_out.shape
    assert result.lse.dtype == np.float32 and result.lse.shape == ref_lse.shape
    masked = np.isposinf(ref_lse)
    np.testing.assert_array_equal(np.isposinf(result.lse), masked, "lse +inf rows differ")
    # Rows that see no key are exactly zero by contract.
    assert not np.any(result.out.astype(np.float64).transpose(1, 0, 2)[masked])
    return {"out": rel_error(result.out, ref_out),
            "lse": rel_error(result.lse[~masked], ref_lse[~masked])}


def backward_references(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, **options):
    """The reference dq, dk, dv given out and lse, and their term scales (gradient_error)."""
    args = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    return (reference.attention_backward(*args, **options),
            reference.attention_backward_term_scales(*args, **options))


def gradient_error(actual, ref, term_scale) -> float:
    """Relative Frobenius error of a gradient: 16-bit ones relative to the reference, whose
    size their rounding to 16 bits is relative to; float32 ones relative to term_scale
    (reference.attention_backward_term_scales), since there the rounding of the sums
    dominates, which is relative to their terms. Where the terms cancel (a causal row that sees
    one key: dS = P (dP - D) = 0 up to float32 noise) a bound relative to the result failed
    correct answers (the soak, once in ~2,300 cases; 3 of 1,000 random draws of its 52-query,
    2-key causal softcap problem, up to 2.0e-4 against 1e-5). Where nothing cancels the scale
    is about the gradient's size, so the bound stays about as strict (ref / term_scale norms:
    0.36-0.85 for dq and dk, ~1 for dv on CASES).

    16-bit gradients are relative to the reference, but never to less than a quarter of the term
    scale: a GPU kernel takes D = rowsum(dO o O) from the 16-bit out, as FlashAttention does, so
    where the exact gradient is 0 (every row sees one key: dS = P (dP - D) = 0) it answers
    16-bit rounding noise of its terms, which the GPU soak measured against a reference norm of
    exactly 0 (errors of 1e294). Where nothing cancels, ref / term_scale >= 0.36 keeps the
    reference the denominator, as strict as before."""
    difference = np.asarray(actual, np.float64) - np.asarray(ref, np.float64)
    scale = np.linalg.norm(term_scale)
    if actual.dtype != np.float32:
        scale = max(np.linalg.norm(np.asarray(ref, np.float64)), scale / 4)
    return float(np.linalg.norm(difference) / max(scale, 1e-300))


def backward_errors(result, inputs, out, lse, options) -> Dict[str, float]:
    """Errors (gradient_error) of dq, dk, dv against the reference given the same out and lse."""
    refs, term_scales = backward_references(
        inputs["dout"], inputs["q"], inputs["k"], inputs["v"], out, lse,
        inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], **options)
    errors = {}
    for name, ref, term_scale in zip(("dq", "dk", "dv"), refs, term_scales):
        actual = getattr(result, name)
        assert actual.dtype == inputs["q"].dtype and actual.shape == ref.shape, name
        errors[name] = gradient_error(actual, ref, term_scale)
    return errors


def packed_problem(rng, tokens=(70, 130), heads=4, heads_k=2, dim=32, dtype=np.float32):
    """q, k, v, dout and shared offsets of sequences of `tokens` tokens (GQA by default)."""
    total = sum(tokens)
    q = rng.standard_normal((total, heads, dim)).astype(dtype)
    k, v = (rng.standard_normal((total, heads_k, dim)).astype(dtype) for _ in range(2))
    dout = rng.standard_normal((total, heads, dim)).astype(dtype)
    cu = np.array([0, *np.cumsum(tokens)], np.int32)
    return q, k, v, dout, cu


def assert_same_bits(a, b):
    """Two answers of different transports: the same shape, dtype and bytes."""
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
