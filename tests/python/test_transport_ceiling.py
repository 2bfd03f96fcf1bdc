"""--transport_ceiling (benchmarks only): every valid request is answered at once with zeros of
the right shapes over both transports, invalid ones are still refused by name, and nothing is
kept for a backward."""
import numpy as np
import pytest

import attnserve
from server_process import CALL_TIMEOUT_S, MAIN_LIMITS, run_server

TOKENS, HEADS, DIM = 96, 4, 32


@pytest.fixture(scope="module")
def ceiling_server():
    yield from run_server({**MAIN_LIMITS, "transport_ceiling": "true"})


def inputs(rng):
    q, k, v = (rng.standard_normal((TOKENS, HEADS, DIM)).astype(np.float16) for _ in range(3))
    return q, k, v, np.array([0, 40, TOKENS], np.int32)


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_answers_are_zeros_of_the_right_shapes(ceiling_server, transport):
    q, k, v, cu = inputs(np.random.default_rng(1))
    with attnserve.Client(ceiling_server.target, timeout=CALL_TIMEOUT_S,
                          transport=transport) as client:
        fwd = client.forward(q, k, v, cu, cu, causal=True, keep_context=True)
        assert fwd.execution.kernel == "transport_ceiling"
        assert fwd.execution.code_path == "transport_ceiling"
        assert fwd.context_id == ""
        assert fwd.out.shape == q.shape and fwd.out.dtype == q.dtype and not fwd.out.any()
        assert fwd.lse.shape == (HEADS, TOKENS) and not fwd.lse.any()
        bwd = client.backward(q, q, k, v, fwd.out, fwd.lse, cu, cu)
        assert [t.shape for t in (bwd.dq, bwd.dk, bwd.dv)] == [q.shape, k.shape, v.shape]
        assert not (bwd.dq.any() or bwd.dk.any() or bwd.dv.any())


def test_invalid_requests_are_still_refused(ceiling_server):
    q, k, v, cu = inputs(np.random.default_rng(2))
    with attnserve.Client(ceiling_server.target, timeout=CALL_TIMEOUT_S) as client:
        with pytest.raises(attnserve.AttentionError) as caught:
            client.forward(q, k, v, np.array([0, 50, 40, TOKENS], np.int32), cu)
        assert "cu_seqlens_q" in str(caught.value)
