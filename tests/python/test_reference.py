"""The float64 reference against a direct per-row formulation and finite differences, and the
float32 gradient check built on its term scales (cases.gradient_error)."""
import math

import numpy as np
import pytest
from ml_dtypes import bfloat16

from attnserve import reference
from cases import CASES, TOLERANCE, backward_references, gradient_error, make_inputs, \
    rel_error


def _visible(i, j, sq, sk, causal, window_size):
    # Straight from the contract in shared/DESIGN.md, one (query, key) pair at a time.
    left, right = window_size
    diagonal = i + sk - sq
    if causal and j > diagonal:
        return False
    if left >= 0 and j < diagonal - left:
        return False
    if right >= 0 and j > diagonal + right:
        return False
    return True


def _direct_forward(q, k, v, cu_q, cu_k, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    total_q, heads, dim = q.shape
    groups = heads // k.shape[1]
    scale = softmax_scale or 1.0 / math.sqrt(dim)
    out, lse = np.zeros_like(q), np.full((heads, total_q), np.inf)
    for b in range(len(cu_q) - 1):
        sq, sk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        for h in range(heads):
            for i in range(sq):
                keys = [j for j in range(sk) if _visible(i, j, sq, sk, causal, window_size)]
                if not keys:
                    continue
                row = cu_q[b] + i
                s = np.array([scale * q[row, h] @ k[cu_k[b] + j, h // groups] for j in keys])
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                weights = np.exp(s - s.max())
                values = np.stack([v[cu_k[b] + j, h // groups] for j in keys])
                out[row, h] = weights @ values / weights.sum()
                lse[h, row] = s.max() + math.log(weights.sum())
    return out, lse


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_matches_direct_formulation(case, rng):
    inputs = make_inputs(case, np.float64, rng)
    args = [inputs[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
    out, lse = reference.attention_forward(*args, **case.options)
    expected_out, expected_lse = _direct_forward(*args, **case.options)
    np.testing.assert_allclose(out, expected_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isposinf(lse), np.isposinf(expected_lse))
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12)


def test_visible_mask_is_bottom_right_aligned():
    # 3 queries, 2 keys, causal: the first query sees nothing, the last sees every key.
    np.testing.assert_array_equal(reference.visible_mask(3, 2, causal=True),
                                  [[False, False], [True, False], [True, True]])
    np.testing.assert_array_equal(reference.visible_mask(2, 4, window_size=(1, 0)),
                                  [[False, True, True, False], [False, False, True, True]])


def test_rows_without_keys_are_zero_with_infinite_lse(rng):
    q = rng.standard_normal((5, 2, 8))
    kv = rng.standard_normal((0, 2, 8))
    out, lse = reference.attention_forward(q, kv, kv, [0, 5], [0, 0])
    assert not out.any() and np.all(np.isposinf(lse))
    dq, dk, dv = reference.attention_backward(q, q, kv, kv, None, None, [0, 5], [0, 0])
    assert not dq.any() and dk.shape == dv.shape == (0, 2, 8)


def _loss(inputs, options, **replaced):
    args = {**inputs, **replaced}
    out, _ = reference.attention_forward(args["q"], args["k"], args["v"], args["cu_seqlens_q"],
                                         args["cu_seqlens_k"], **options)
    return float(np.sum(out * inputs["dout"]))


@pytest.mark.parametrize("case", [c for c in CASES if c.name in
                                  ("causal_q_longer", "window", "softcap_scale", "gqa", "mqa")],
                         ids=lambda c: c.name)
def test_backward_matches_finite_differences(case, rng):
    inputs = make_inputs(case, np.float64, rng)
    grads = dict(zip(("q", "k", "v"), reference.attention_backward(
        inputs["dout"], inputs["q"], inputs["k"], inputs["v"], None, None,
        inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], **case.options)))
    eps = 1e-6
    for name, grad in grads.items():
        for _ in range(6):
            index = tuple(rng.integers(0, n) for n in grad.shape)
            plus, minus = inputs[name].copy(), inputs[name].copy()
            plus[index] += eps
            minus[index] -= eps
            numeric = (_loss(inputs, case.options, **{name: plus})
                       - _loss(inputs, case.options, **{name: minus})) / (2 * eps)
            assert grad[index] == pytest.approx(numeric, rel=1e-5, abs=1e-7), (name, index)


def test_backward_from_given_out_and_lse_equals_recomputed(rng):
    case = next(c for c in CASES if c.name == "softcap_scale")
    inputs = make_inputs(case, np.float64, rng)
    args = [inputs[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
    out, lse = reference.attention_forward(*args, **case.options)
    given = reference.attention_backward(inputs["dout"], *args[:3], out, lse, *args[3:],
                                         **case.options)
    recomputed = reference.attention_backward(inputs["dout"], *args[:3], None, None, *args[3:],
                                              **case.options)
    for a, b in zip(given, recomputed):
        np.testing.assert_array_equal(a, b)


def test_term_scales_are_root_sums_of_squares(rng):
    # One query, two keys, one head: each scale straight from its definition.
    q, dout = rng.standard_normal((1, 1, 4)), rng.standard_normal((1, 1, 4))
    k, v = rng.standard_normal((2, 1, 4)), rng.standard_normal((2, 1, 4))
    out, lse = reference.attention_forward(q, k, v, [0, 1], [0, 2])
    dq, dk, dv = reference.attention_backward_term_scales(dout, q, k, v, out, lse, [0, 1], [0, 2])
    scale = 0.5  # 1 / sqrt(4)
    p = np.exp(scale * k[:, 0] @ q[0, 0] - lse[0, 0])  # [keys]
    ds_squared = p**2 * ((v[:, 0]**2) @ dout[0, 0]**2 + dout[0, 0]**2 @ out[0, 0]**2)
    np.testing.assert_allclose(dq[0, 0], scale * np.sqrt(ds_squared @ k[:, 0]**2), rtol=1e-12)
    np.testing.assert_allclose(dk[:, 0], scale * np.sqrt(np.outer(ds_squared, q[0, 0]**2)),
                               rtol=1e-12)
    np.testing.assert_allclose(dv[:, 0], np.sqrt(np.outer(p**2, dout[0, 0]**2)), rtol=1e-12)


def test_float32_gradient_error_forgives_cancellation(rng):
    # One query that sees one key: out = v, so dS = P (dP - D) cancels and dq is 0 but for
    # float64 rounding; a float32 backward returns float32 rounding noise of the terms there,
    # which failed the bound relative to the result.
    q, k, v, dout = (rng.standard_normal((1, 2, 16)).astype(np.float32) for _ in range(4))
    out, lse = reference.attention_forward(q, k, v, [0, 1], [0, 1], softcap=5.0)
    out, lse = out.astype(np.float32), lse.astype(np.float32)
    (dq, _, _), (dq_scale, _, _) = backward_references(dout, q, k, v, out, lse, [0, 1], [0, 1],
                                                       softcap=5.0)
    assert np.abs(dq).max() < 1e-6 * np.abs(dq_scale).max()
    noisy = (dq + 1e-7 * dq_scale * rng.choice([-1, 1], dq.shape)).astype(np.float32)
    assert rel_error(noisy, dq) > 1e-2
    assert gradient_error(noisy, dq, dq_scale) <= 1e-6


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_float32_gradient_error_catches_wrong_gradients(case, rng):
    inputs = make_inputs(case, np.float32, rng)
    args = [inputs[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
    out, lse = (x.astype(np.float32) for x in reference.attention_forward(*args, **case.options))
    refs, scales = backward_references(inputs["dout"], *args[:3], out, lse, *args[3:],
                                       **case.options)
    tolerance = TOLERANCE[np.dtype(np.float32)]
    for name, ref, scale in zip(("dq", "dk", "dv"), refs, scales):
        assert gradient_error(ref.astype(np.float32), ref, scale) <= tolerance / 10, name
        # 0.1% off everywhere, or 1% off in the largest element alone.
        assert gradient_error((ref * 1.001).astype(np.float32), ref, scale) > tolerance, name
        one_off = ref.copy()
        one_off.flat[np.argmax(np.abs(ref))] *= 1.01
        assert gradient_error(one_off.astype(np.float32), ref, scale) > tolerance, name


@pytest.mark.parametrize("dtype", [np.float16, bfloat16], ids=["fp16", "bf16"])
def test_16_bit_gradient_error_forgives_cancellation_and_stays_relative_elsewhere(dtype, rng):
    # Rows that each see one key (causal, window_left 0): the exact dq is 0, and a GPU kernel's
    # D from the 16-bit out leaves 16-bit noise of the terms (the GPU soak's 1e294 errors).
    q, k, v, dout = (rng.standard_normal((12, 2, 16)).astype(dtype) for _ in range(4))
    cu = [0, 12]
    out, lse = reference.attention_forward(q, k, v, cu, cu, causal=True, window_size=(0, 0))
    (dq, _, _), (dq_scale, _, _) = backward_references(dout, q, k, v, out, lse, cu, cu,
                                                       causal=True, window_size=(0, 0))
    assert np.abs(dq).max() == 0.0
    unit = 2.0 ** -8 if dtype is bfloat16 else 2.0 ** -11  # unit roundoff
    noisy = (dq + unit * dq_scale * rng.choice([-1, 1], dq.shape)).astype(dtype)
    tolerance = 2 * TOLERANCE[np.dtype(dtype)]  # gradients get twice the outputs' bound
    assert gradient_error(noisy, dq, dq_scale) <= tolerance
    # Where nothing cancels the reference stays the denominator: 3 tolerances off fails.
    inputs = make_inputs(CASES[0], dtype, rng)
    args = [inputs[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
    out, lse = reference.attention_forward(*args, **CASES[0].options)
    refs, scales = backward_references(inputs["dout"], *args[:3], out, lse, *args[3:],
                                       **CASES[0].options)
    for name, ref, scale in zip(("dq", "dk", "dv"), refs, scales):
        assert gradient_error((ref * (1 + 3 * tolerance)).astype(dtype), ref, scale) > tolerance, \
            name
