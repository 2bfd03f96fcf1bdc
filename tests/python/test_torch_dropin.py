"""attnserve.flash_attn_varlen_func against torch's own attention, through the real server:
outputs, autograd gradients, FlashAttention's return values, options it refuses, targets."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnserve  # noqa: E402
from attnserve import UnsupportedOptionError, connections, flash_attn_varlen_func  # noqa: E402
from torch_reference import attention_varlen  # noqa: E402
from torch_threads import one_torch_thread  # noqa: E402,F401  (autouse fixture)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Relative Frobenius error against float64 from the same rounded inputs (shared/DESIGN.md).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}

# (seqlens_q, seqlens_k, heads, heads_k, dim, options, q_scale)
CASES = {
    "plain": ([5, 12, 1], [5, 12, 1], 4, 4, 16, {}, 1.0),
    "causal": ([7, 20], [7, 20], 2, 2, 32, {"causal": True}, 1.0),
    "causal_q_shorter": ([3, 9], [6, 9], 2, 2, 16, {"causal": True}, 1.0),
    "window": ([25, 10], [25, 10], 2, 2, 16, {"window_size": (4, 2)}, 1.0),
    "softcap_scale": ([9, 14], [9, 14], 2, 2, 16,
                      {"softcap": 5.0, "softmax_scale": 0.3, "causal": True}, 3.0),
    "gqa": ([9, 14], [9, 14], 8, 2, 16, {"causal": True}, 1.0),
    "mqa_window": ([11, 6], [11, 6], 4, 1, 16, {"window_size": (3, 0)}, 1.0),
}



def _cu(lengths):
    return torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)


def _problem(name, dtype, seed=None):
    seqlens_q, seqlens_k, heads, heads_k, dim, options, q_scale = CASES[name]
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed())

    def randn(tokens, h, scale=1.0):
        return (scale * torch.randn(tokens, h, dim, generator=gen, dtype=torch.float64)).to(dtype)

    q, dout = randn(sum(seqlens_q), heads, q_scale), randn(sum(seqlens_q), heads)
    k, v = randn(sum(seqlens_k), heads_k), randn(sum(seqlens_k), heads_k)
    return q, k, v, dout, _cu(seqlens_q), _cu(seqlens_k), max(seqlens_q), max(seqlens_k), options


def _rel(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-300))


def _grads(fn, dout, *inputs):
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", CASES)
def test_output_and_gradients_match_sdpa(client, case, dtype):
    q, k, v, dout, cu_q, cu_k, max_q, max_k, options = _problem(case, dtype)
    out, grads = _grads(lambda q, k, v: flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, client=client, **options), dout, q, k, v)
    ref, ref_grads = _grads(lambda q, k, v: attention_varlen(q, k, v, cu_q, cu_k, **options),
                            dout.double(), q.double(), k.double(), v.double())
    assert out.dtype == dtype and out.shape == q.shape
    errors = {"out": _rel(out, ref)}
    for name, grad, ref_grad, x in zip(("dq", "dk", "dv"), grads, ref_grads, (q, k, v)):
        assert grad.dtype == dtype and grad.shape == x.shape, name
        errors[name] = _rel(grad, ref_grad)
    assert max(errors.values()) <= TOLERANCE[dtype], errors


def test_fp32_matches_sdpa_in_fp32(client):
    # Not only the float64 ground truth: torch's fp32 SDPA itself, as a user would compare.
    q, k, v, dout, cu_q, cu_k, max_q, max_k, options = _problem("gqa", torch.float32)
    out, grads = _grads(lambda q, k, v: flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, client=client, **options), dout, q, k, v)
    ref, ref_grads = _grads(lambda q, k, v: attention_varlen(q, k, v, cu_q, cu_k, **options),
                            dout, q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-5)


def test_gradients_through_views_of_a_packed_projection(client):
    # Models slice q, k, v out of one qkv projection: strided views, one shared gradient.
    tokens, heads, dim = 20, 2, 16
    cu = _cu([8, 12])
    qkv = torch.randn(tokens, 3, heads, dim, dtype=torch.float64)
    grads = []
    for attention in (lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, 12, 12,
                                                             causal=True, client=client),
                      lambda q, k, v: attention_varlen(q, k, v, cu, cu, causal=True)):
        leaf = qkv.to(torch.float32).requires_grad_()
        attention(*leaf.unbind(1)).square().sum().backward()
        grads.append(leaf.grad)
    assert _rel(grads[0], grads[1]) <= 1e-5


def test_return_values_are_flash_attn_s(client):
    q, k, v, _, cu_q, cu_k, max_q, max_k, options = _problem("causal", torch.bfloat16, seed=1)
    q.requires_grad_()
    out, lse, probs = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                             return_attn_probs=True, client=client, **options)
    assert probs is None
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.requires_grad
    # FlashAttention's varlen softmax_lse: [num_heads, total_q] float32, natural log.
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    assert not lse.requires_grad
    scores = []
    bounds = cu_q.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        s = torch.einsum("qhd,khd->hqk", q[start:end].double(), k[start:end].double())
        s = s / math.sqrt(q.shape[-1])
        causal = torch.ones(end - start, end - start, dtype=torch.bool).tril()
        scores.append(torch.logsumexp(s.masked_fill(~causal, -math.inf), dim=-1))
    assert _rel(lse, torch.cat(scores, dim=1)) <= 1e-5
    alone = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, client=client, **options)
    assert isinstance(alone, torch.Tensor)
    assert torch.equal(alone, out)


def test_deterministic_backward_is_bitwise_reproducible(client):
    q, k, v, dout, cu_q, cu_k, max_q, max_k, options = _problem("gqa", torch.float32)

    def run():
        return _grads(lambda q, k, v: flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max_q, max_k, deterministic=True, client=client, **options),
            dout, q, k, v)[1]

    for first, second in zip(run(), run()):
        assert torch.equal(first, second)


@pytest.mark.parametrize("option", [{"block_table": torch.zeros(1, 1, dtype=torch.int32)}],
                         ids=["block_table"])
def test_unsupported_options_raise_before_sending(option):
    q, k, v, _, cu_q, cu_k, max_q, max_k, _ = _problem("plain", torch.float16)
    # Nobody listens on port 1: anything sent would fail with AttentionError instead.
    with pytest.raises(UnsupportedOptionError):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, client="127.0.0.1:1",
                               **option)
    assert issubclass(UnsupportedOptionError, NotImplementedError)


def test_unsupported_dtype_raises_type_error(client):
    q, k, v, _, cu_q, cu_k, max_q, max_k, _ = _problem("plain", torch.float64)
    with pytest.raises(TypeError, match="float64"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, client=client)


def test_server_errors_raise_attention_error(client):
    q, k, v, _, cu_q, cu_k, max_q, max_k, _ = _problem("plain", torch.float32)
    with pytest.raises(attnserve.AttentionError, match="cu_seqlens_q"):
        flash_attn_varlen_func(q, k, v, cu_q.flip(0), cu_k, max_q, max_k, client=client)


def test_target_from_the_environment(server, monkeypatch):
    monkeypatch.setenv(connections.TARGET_ENV, server.target)
    attnserve.set_default_client(None)
    q, k, v, _, cu_q, cu_k, max_q, max_k, _ = _problem("plain", torch.float32)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)
    assert _rel(out, attention_varlen(q, k, v, cu_q, cu_k)) <= 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_cuda_tensors_come_back_on_their_device(client, dtype):
    q, k, v, dout, cu_q, cu_k, max_q, max_k, options = _problem("gqa", dtype)
    q, k, v, dout, cu_q, cu_k = (t.cuda() for t in (q, k, v, dout, cu_q, cu_k))
    out, grads = _grads(lambda q, k, v: flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, client=client, **options), dout, q, k, v)
    ref, ref_grads = _grads(lambda q, k, v: attention_varlen(q, k, v, cu_q, cu_k, **options),
                            dout.double(), q.double(), k.double(), v.double())
    for actual, expected in zip((out, *grads), (ref, *ref_grads)):
        assert actual.device == q.device and actual.dtype == dtype
        assert _rel(actual, expected) <= TOLERANCE[dtype]
