"""The data channel and saved contexts against the real server: answers identical to gRPC's,
a backward that sends only dout, transparent resends, release, the async API, and the torch
drop-in on the fast path. Skipped while the server advertises no data channel (ServerInfo's
data_channel) or keeps no contexts; the gRPC path is covered by the other end-to-end tests."""
import numpy as np
import pytest

import attnserve
from cases import CASES, DTYPES, TOLERANCE, backward_errors, make_inputs
from server_process import CALL_TIMEOUT_S

# Of the shared cases: GQA, empty sequences and a large head dim (several chunks at 64 KiB).
FAST_CASES = [c for c in CASES if c.name in ("gqa", "empty_seqs", "head_dim_128", "window")]
SMALL_CHUNK = 64 << 10


@pytest.fixture(scope="module")
def clients(server):
    fast = attnserve.Client(server.target, timeout=CALL_TIMEOUT_S, chunk_bytes=SMALL_CHUNK)
    slow = attnserve.Client(server.target, timeout=CALL_TIMEOUT_S, transport="grpc")
    with fast, slow:
        if not fast.server_info().HasField("data_channel"):
            pytest.skip("the server advertises no data channel")
        assert fast.active_transport() == "data_channel"
        yield fast, slow


def _contexts_or_skip(result):
    if not result.context_id:
        pytest.skip("the server keeps no contexts")
    return result


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", FAST_CASES, ids=lambda c: c.name)
def test_answers_equal_grpc_s(clients, case, dtype, rng):
    fast, slow = clients
    inputs = make_inputs(case, dtype, rng)
    args = (inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens_q"], inputs["cu_seqlens_k"])
    forward, expected = (c.forward(*args, **case.options) for c in (fast, slow))
    _same(forward.out, expected.out)
    _same(forward.lse, expected.lse)
    backward_args = (inputs["dout"], *args[:3], forward.out, forward.lse, *args[3:])
    backward, expected = (c.backward(*backward_args, deterministic=True, **case.options)
                          for c in (fast, slow))
    for name in ("dq", "dk", "dv"):
        _same(getattr(backward, name), getattr(expected, name))


@pytest.mark.parametrize("transport", ["data_channel", "grpc"])
def test_context_backward_sends_only_dout(clients, transport, rng):
    client = clients[0] if transport == "data_channel" else clients[1]
    case = next(c for c in CASES if c.name == "gqa")
    inputs = make_inputs(case, DTYPES["bf16"], rng)
    q, k, v, dout = inputs["q"], inputs["k"], inputs["v"], inputs["dout"]
    cu = (inputs["cu_seqlens_q"], inputs["cu_seqlens_k"])
    forward = _contexts_or_skip(client.forward(q, k, v, *cu, keep_context=True, **case.options))
    full = client.backward(dout, q, k, v, forward.out, forward.lse, *cu, deterministic=True,
                           **case.options)
    # out and lse are not sent with a context: None proves they are not even read.
    backward = client.backward(dout, q, k, v, None, None, *cu, deterministic=True,
                               context_id=forward.context_id,
                               context_address=forward.context_address, **case.options)
    for name in ("dq", "dk", "dv"):
        _same(getattr(backward, name), getattr(full, name))
    # The backward released it.
    assert not client.release_context(forward.context_id,
                                      context_address=forward.context_address)


def test_unknown_context_is_resent_in_full(clients, rng):
    fast, _ = clients
    case = CASES[0]
    inputs = make_inputs(case, DTYPES["fp32"], rng)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    cu = (inputs["cu_seqlens_q"], inputs["cu_seqlens_k"])
    _contexts_or_skip(fast.forward(q, k, v, *cu, keep_context=True))
    forward = fast.forward(q, k, v, *cu)
    backward = fast.backward(inputs["dout"], q, k, v, forward.out, forward.lse, *cu,
                             context_id="no-such-context")
    errors = backward_errors(backward, inputs, forward.out, forward.lse, {})
    assert max(errors.values()) <= TOLERANCE[q.dtype], errors


def test_release_context(clients, rng):
    fast, _ = clients
    inputs = make_inputs(CASES[0], DTYPES["fp16"], rng)
    forward = _contexts_or_skip(fast.forward(inputs["q"], inputs["k"], inputs["v"],
                                             inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
                                             keep_context=True))
    address = forward.context_address
    assert fast.release_context(forward.context_id, context_address=address)
    assert not fast.release_context(forward.context_id, context_address=address)


def test_async_calls(clients, rng):
    fast, slow = clients
    problems = [make_inputs(case, DTYPES["fp32"], rng) for case in FAST_CASES]
    futures = [fast.forward_async(p["q"], p["k"], p["v"], p["cu_seqlens_q"], p["cu_seqlens_k"],
                                  **case.options) for p, case in zip(problems, FAST_CASES)]
    for future, p, case in zip(futures, problems, FAST_CASES):
        expected = slow.forward(p["q"], p["k"], p["v"], p["cu_seqlens_q"], p["cu_seqlens_k"],
                                **case.options)
        _same(future.result(CALL_TIMEOUT_S).out, expected.out)


def test_torch_drop_in_on_the_fast_path(clients):
    torch = pytest.importorskip("torch")
    from torch_reference import attention_varlen

    fast, _ = clients
    gen = torch.Generator().manual_seed(torch.seed())
    cu = torch.tensor([0, 9, 23], dtype=torch.int32)
    q, k, v, dout = (torch.randn(23, h, 32, generator=gen) for h in (4, 2, 2, 4))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in test_torch_dropin: spare the local server's cores
    try:
        grads = []
        for attention, dtype in (
                (lambda *x: attnserve.flash_attn_varlen_func(*x, cu, cu, 14, 14, causal=True,
                                                             client=fast), torch.float32),
                (lambda *x: attention_varlen(*x, cu, cu, causal=True), torch.float64)):
            leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
            attention(*leaves).backward(dout.to(dtype))
            grads.append([t.grad for t in leaves])
    finally:
        torch.set_num_threads(threads)
    for actual, expected in zip(*grads):
        assert actual.dtype == torch.float32
        error = float((actual.double() - expected).norm() / expected.norm())
        assert error <= 1e-5


def test_grouped_forward_equals_grpc_bitwise(clients, rng):
    # Over 16 MiB of payload in several sequences of uneven lengths: the server runs it by
    # groups of sequences as their chunks arrive, with group boundaries mid-chunk.
    fast, slow = clients
    seqlens = [700, 3, 900, 0, 500, 1001]
    cu = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int32)
    q, k, v = (rng.standard_normal((int(cu[-1]), 8, 128)).astype(np.float32) for _ in range(3))
    assert 3 * q.nbytes > 16 << 20
    forward, expected = (c.forward(q, k, v, cu, cu, causal=True) for c in (fast, slow))
    _same(forward.out, expected.out)
    _same(forward.lse, expected.lse)
