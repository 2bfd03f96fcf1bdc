"""Dropout and ALiBi end to end on the CPU device: the server's mask is the float64 reference's
exactly (Philox4x32-10, reference.dropout_keep), its statistics, seeds (the caller's, the
server's pick, a context's), ALiBi per head and per sequence, grouped calls, and bad input."""
import math

import grpc
import numpy as np
import pytest

import attnserve
from attnserve import reference
from server_process import CALL_TIMEOUT_S


def _rel(got, want):
    return np.linalg.norm(np.asarray(got, np.float64) - want) / max(np.linalg.norm(want), 1e-30)


def _problem(rng, lens_q, lens_k, heads=4, heads_k=2, dim=16):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], heads, dim)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], heads_k, dim)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], heads_k, dim)).astype(np.float32)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    return q, k, v, dout, cu_q, cu_k


def _one_hot_values(rng, seqlen_q, seqlen_k, heads):
    """One sequence whose v is the identity (head_dim = seqlen_k): out[i, h, j] is the dropped
    probability of key j itself, so its zeros are exactly the dropped entries."""
    q = rng.standard_normal((seqlen_q, heads, seqlen_k)).astype(np.float32)
    k = rng.standard_normal((seqlen_k, heads, seqlen_k)).astype(np.float32)
    v = np.broadcast_to(np.eye(seqlen_k, dtype=np.float32)[:, None, :],
                        (seqlen_k, heads, seqlen_k)).copy()
    return q, k, v, np.array([0, seqlen_q], np.int32), np.array([0, seqlen_k], np.int32)


def test_the_server_drops_exactly_the_reference_mask(client, rng):
    q, k, v, cu_q, cu_k = _one_hot_values(rng, 37, 64, 3)
    result = client.forward(q, k, v, cu_q, cu_k, dropout_p=0.4, dropout_seed=0x1234_5678_9abc)
    assert result.dropout_seed == 0x1234_5678_9abc
    keep = reference.dropout_keep(result.dropout_seed, 0, 3, 37, 64, 0.4)  # [H, sq, sk]
    np.testing.assert_array_equal(result.out != 0, keep.transpose(1, 0, 2))
    want, want_lse = reference.attention_forward(q, k, v, cu_q, cu_k, dropout_p=0.4,
                                                 dropout_seed=result.dropout_seed)
    assert _rel(result.out, want) <= 1e-5
    undropped_lse = reference.attention_forward(q, k, v, cu_q, cu_k)[1]
    # lse is the undropped softmax's.
    np.testing.assert_allclose(result.lse, undropped_lse, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (5, 3))])
def test_forward_and_backward_with_dropout_match_the_reference(client, rng, causal, window):
    q, k, v, dout, cu_q, cu_k = _problem(rng, [9, 40, 0, 33], [17, 40, 5, 20])
    options = dict(causal=causal, window_size=window, dropout_p=0.25)
    result = client.forward(q, k, v, cu_q, cu_k, dropout_seed=987654321, **options)
    want, want_lse = reference.attention_forward(q, k, v, cu_q, cu_k, dropout_seed=987654321,
                                                 **options)
    assert _rel(result.out, want) <= 1e-5
    grads = client.backward(dout, q, k, v, result.out, result.lse, cu_q, cu_k,
                            dropout_seed=result.dropout_seed, **options)
    wants = reference.attention_backward(dout, q, k, v, result.out, result.lse, cu_q, cu_k,
                                         dropout_seed=987654321, **options)
    for name, got, expected in zip(("dq", "dk", "dv"), (grads.dq, grads.dk, grads.dv), wants):
        assert _rel(got, expected) <= 1e-5, name


def test_keep_rate_is_one_minus_p(client, rng):
    # 1024 rows x 8 heads x 128 keys: about 1e6 draws.
    q, k, v, cu_q, cu_k = _one_hot_values(rng, 1024, 128, 8)
    result = client.forward(q, k, v, cu_q, cu_k, dropout_p=0.3)
    draws = result.out.size
    kept = np.count_nonzero(result.out) / draws
    assert abs(kept - 0.7) <= 5 * math.sqrt(0.3 * 0.7 / draws), kept


def test_dropout_is_unbiased_over_seeds(client, rng):
    q, k, v, _, cu_q, cu_k = _problem(rng, [12], [20], heads=2, heads_k=2, dim=8)
    p, runs = 0.3, 200
    mean = sum(client.forward(q, k, v, cu_q, cu_k, dropout_p=p, dropout_seed=seed + 1).out
               for seed in range(runs)) / runs
    undropped, _ = reference.attention_forward(q, k, v, cu_q, cu_k)
    # Each out element is sum_j P_ij Z_ij / (1 - p) v_j: variance p / (1 - p) sum_j (P_ij v_j)^2.
    scores = np.einsum("qhd,khd->hqk", q.astype(np.float64), k) / math.sqrt(8)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    variance = p / (1 - p) * np.einsum("hqk,khd->qhd", probs ** 2, v.astype(np.float64) ** 2)
    assert np.all(np.abs(mean - undropped) <= 5.5 * np.sqrt(variance / runs) + 1e-6)


def test_seeds_same_differ_and_server_picked(client, rng):
    q, k, v, dout, cu_q, cu_k = _problem(rng, [30, 14], [30, 22])
    same = [client.forward(q, k, v, cu_q, cu_k, dropout_p=0.2, dropout_seed=7) for _ in range(2)]
    np.testing.assert_array_equal(same[0].out, same[1].out)
    other = client.forward(q, k, v, cu_q, cu_k, dropout_p=0.2, dropout_seed=8)
    assert not np.array_equal(same[0].out, other.out)
    picked = [client.forward(q, k, v, cu_q, cu_k, dropout_p=0.2) for _ in range(2)]
    assert picked[0].dropout_seed != 0 and picked[0].dropout_seed != picked[1].dropout_seed
    want, _ = reference.attention_forward(q, k, v, cu_q, cu_k, dropout_p=0.2,
                                          dropout_seed=picked[0].dropout_seed)
    assert _rel(picked[0].out, want) <= 1e-5
    # Seeds above 2^63 survive the wire (uint64).
    big = client.forward(q, k, v, cu_q, cu_k, dropout_p=0.2, dropout_seed=(1 << 64) - 3)
    assert big.dropout_seed == (1 << 64) - 3
    assert client.forward(q, k, v, cu_q, cu_k).dropout_seed == 0  # no dropout, no seed


@pytest.mark.parametrize("per_sequence", [False, True], ids=["per_head", "per_sequence"])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (4, 2)),
                                           (True, (6, -1))])
def test_alibi_matches_the_reference(client, rng, per_sequence, causal, window):
    q, k, v, dout, cu_q, cu_k = _problem(rng, [9, 33, 20], [17, 33, 6])
    shape = (3, 4) if per_sequence else (4,)
    slopes = rng.uniform(0.01, 0.6, shape).astype(np.float32)
    options = dict(causal=causal, window_size=window, alibi_slopes=slopes)
    result = client.forward(q, k, v, cu_q, cu_k, **options)
    want, want_lse = reference.attention_forward(q, k, v, cu_q, cu_k, **options)
    assert _rel(result.out, want) <= 1e-5
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(result.lse[finite], want_lse[finite], rtol=1e-5, atol=1e-5)
    grads = client.backward(dout, q, k, v, result.out, result.lse, cu_q, cu_k, **options)
    wants = reference.attention_backward(dout, q, k, v, result.out, result.lse, cu_q, cu_k,
                                         **options)
    for name, got, expected in zip(("dq", "dk", "dv"), (grads.dq, grads.dk, grads.dv), wants):
        assert _rel(got, expected) <= 1e-5, name


def test_a_context_backward_draws_the_forward_s_mask(client, rng):
    q, k, v, dout, cu_q, cu_k = _problem(rng, [25, 18], [31, 18])
    slopes = rng.uniform(0.01, 0.3, (2, 4)).astype(np.float32)
    options = dict(causal=True, dropout_p=0.35, alibi_slopes=slopes)
    result = client.forward(q, k, v, cu_q, cu_k, keep_context=True, **options)
    assert result.context_id and result.dropout_seed != 0
    # The context holds options, slopes and the server's seed: none need be sent again.
    grads = client.backward(dout, q, k, v, result.out, result.lse, cu_q, cu_k,
                            context_id=result.context_id)
    wants = reference.attention_backward(dout, q, k, v, result.out, result.lse, cu_q, cu_k,
                                         dropout_seed=result.dropout_seed, **options)
    for name, got, expected in zip(("dq", "dk", "dv"), (grads.dq, grads.dk, grads.dv), wants):
        assert _rel(got, expected) <= 1e-5, name
    kept = client.forward(q, k, v, cu_q, cu_k, keep_context=True, **options)
    # A seed sent with a context must be the context's.
    _expect_invalid(lambda: client.backward(dout, q, k, v, kept.out, kept.lse, cu_q, cu_k,
                                            context_id=kept.context_id, keep_context=True,
                                            dropout_seed=kept.dropout_seed ^ 1), "dropout_seed")
    assert client.release_context(kept.context_id)


def test_grouped_calls_answer_as_whole_ones(server, client, rng):
    # 4 sequences of 8 heads x 128 fp32 over the data channel: 17 MiB, run in 4 groups.
    q, k, v, dout, cu_q, cu_k = _problem(rng, [352] * 4, [352] * 4, heads=8, heads_k=8, dim=128)
    slopes = rng.uniform(0.01, 0.2, (4, 8)).astype(np.float32)
    options = dict(causal=True, dropout_p=0.2, alibi_slopes=slopes, dropout_seed=4242)
    grouped = client.forward(q, k, v, cu_q, cu_k, **options)
    with attnserve.Client(server.target, timeout=CALL_TIMEOUT_S, transport="grpc") as whole:
        unsplit = whole.forward(q, k, v, cu_q, cu_k, **options)
        unsplit_grads = whole.backward(dout, q, k, v, unsplit.out, unsplit.lse, cu_q, cu_k,
                                       **options)
    np.testing.assert_array_equal(grouped.out, unsplit.out)
    np.testing.assert_array_equal(grouped.lse, unsplit.lse)
    grads = client.backward(dout, q, k, v, grouped.out, grouped.lse, cu_q, cu_k, **options)
    for got, expected in zip((grads.dq, grads.dk, grads.dv),
                             (unsplit_grads.dq, unsplit_grads.dk, unsplit_grads.dv)):
        np.testing.assert_array_equal(got, expected)
    # And sequence 3 alone is not sequence 3 of the request: the mask is keyed by the index.
    last = slice(cu_q[3], cu_q[4])
    alone = client.forward(q[last], k[last], v[last], [0, 352], [0, 352], causal=True,
                           dropout_p=0.2, alibi_slopes=slopes[3:], dropout_seed=4242)
    assert not np.array_equal(alone.out, grouped.out[last])


def _expect_invalid(call, field):
    with pytest.raises(attnserve.AttentionError, match=field) as error:
        call()
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("p", [1.0, -0.1, float("nan"), float("inf")])
def test_bad_dropout_p_is_refused(client, rng, p):
    q, k, v, dout, cu_q, cu_k = _problem(rng, [4], [4])
    _expect_invalid(lambda: client.forward(q, k, v, cu_q, cu_k, dropout_p=p), "dropout_p")


@pytest.mark.parametrize("slopes", [np.ones(3, np.float32), np.ones((2, 4), np.float32),
                                    np.ones((1, 1, 4), np.float32), np.ones(4, np.float16),
                                    np.array([0.1, np.nan, 0.1, 0.1], np.float32),
                                    np.array([0.1, 0.1, np.inf, 0.1], np.float32)],
                         ids=["short", "wrong_batch", "rank3", "float16", "nan", "inf"])
def test_bad_alibi_slopes_are_refused(client, rng, slopes):
    q, k, v, dout, cu_q, cu_k = _problem(rng, [4], [4])
    _expect_invalid(lambda: client.forward(q, k, v, cu_q, cu_k, alibi_slopes=slopes),
                    "alibi_slopes")
    _expect_invalid(lambda: client.backward(dout, q, k, v, q, np.zeros((4, 4), np.float32),
                                            cu_q, cu_k, alibi_slopes=slopes), "alibi_slopes")


def test_a_dropout_backward_needs_the_seed(client, rng):
    q, k, v, dout, cu_q, cu_k = _problem(rng, [4], [4])
    result = client.forward(q, k, v, cu_q, cu_k, dropout_p=0.5)
    _expect_invalid(lambda: client.backward(dout, q, k, v, result.out, result.lse, cu_q, cu_k,
                                            dropout_p=0.5), "dropout_seed")


def test_server_info_says_who_serves_dropout_and_alibi(client):
    routes = [route for device in client.server_info().devices for route in device.routes]
    assert routes and all(route.dropout and route.alibi for route in routes
                          if route.family == "reference")
    assert all("dropout" in route.reason for route in routes if route.family == "reference")
