"""The torch drop-in on the data channel with saved contexts, against the in-process server of
fake_data_server.py: gradients, a backward that sends only dout, the full resend when the context
is gone, contexts released when no backward will come, and none kept without autograd."""
import gc
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnserve  # noqa: E402
from attnserve import flash_attn_varlen_func  # noqa: E402
from fake_data_server import FakeDataServer  # noqa: E402
from torch_reference import attention_varlen  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _problem(dtype, seqlens=(9, 14), heads=4, heads_k=2, dim=16):
    gen = torch.Generator().manual_seed(torch.seed())
    total = sum(seqlens)

    def randn(h):
        return torch.randn(total, h, dim, generator=gen, dtype=torch.float64).to(dtype)

    cu = torch.tensor([0, *np.cumsum(seqlens)], dtype=torch.int32)
    return randn(heads), randn(heads_k), randn(heads_k), randn(heads), cu, max(seqlens)


def _rel(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-300))


def _run(client, q, k, v, dout, cu, max_len):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attn_varlen_func(*leaves, cu, cu, max_len, max_len, causal=True, client=client)
    out.backward(dout)
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", TOLERANCE, ids=["fp32", "bf16", "fp16"])
def test_gradients_via_the_data_channel_and_a_context(dtype):
    q, k, v, dout, cu, max_len = _problem(dtype)
    with FakeDataServer() as server, attnserve.Client(server.target, timeout=30) as client:
        out, grads = _run(client, q, k, v, dout, cu, max_len)
        assert client.active_transport() == "data_channel"
        kinds = [(kind, bool(context)) for kind, _, context in server.requests]
        assert kinds == [("forward", False), ("backward", True)]
        assert server.requests[1][1] == dout.numel() * dout.element_size()  # dout only
        assert not server.contexts and "Backward" not in server.grpc_calls
    assert not server.violations
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = attention_varlen(*leaves, cu, cu, causal=True)
    ref.backward(dout.double())
    assert out.dtype == dtype and _rel(out, ref) <= TOLERANCE[dtype]
    for grad, leaf in zip(grads, leaves):
        assert grad.dtype == dtype and _rel(grad, leaf.grad) <= TOLERANCE[dtype]


def test_lost_context_falls_back_to_a_full_backward():
    q, k, v, dout, cu, max_len = _problem(torch.float32)
    with FakeDataServer(forget_contexts=True) as server, \
            attnserve.Client(server.target, timeout=30) as client:
        _, grads = _run(client, q, k, v, dout, cu, max_len)
        assert [bool(context) for _, _, context in server.requests] == [False, True, False]
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    attention_varlen(*leaves, cu, cu, causal=True).backward(dout.double())
    for grad, leaf in zip(grads, leaves):
        assert _rel(grad, leaf.grad) <= 1e-5


def test_no_context_without_autograd():
    q, k, v, _, cu, max_len = _problem(torch.float32)
    with FakeDataServer() as server, attnserve.Client(server.target, timeout=30) as client:
        with torch.no_grad():
            flash_attn_varlen_func(q.requires_grad_(), k, v, cu, cu, max_len, max_len,
                                   client=client)
        flash_attn_varlen_func(q.detach(), k, v, cu, cu, max_len, max_len, client=client)
        assert not server.contexts


def test_a_dropped_graph_releases_its_context():
    q, k, v, _, cu, max_len = _problem(torch.float32)
    with FakeDataServer() as server, attnserve.Client(server.target, timeout=30) as client:
        out = flash_attn_varlen_func(q.requires_grad_(), k, v, cu, cu, max_len, max_len,
                                     client=client)
        assert len(server.contexts) == 1
        del out
        gc.collect()
        deadline = time.monotonic() + 10
        while server.contexts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not server.contexts and "ReleaseContext" in server.grpc_calls


def test_inputs_must_be_three_dimensional():
    q = torch.zeros(4, 16)
    with pytest.raises(ValueError, match=r"q: expected 3 dimensions"):
        flash_attn_varlen_func(q, q, q, [0, 4], [0, 4], 4, 4, client="127.0.0.1:1")
