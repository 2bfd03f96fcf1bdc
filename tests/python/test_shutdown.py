"""SIGTERM while requests are in flight: each one completes correctly or is refused with
UNAVAILABLE, and the server exits 0."""
import threading

import grpc
import numpy as np

import attnserve
from attnserve import reference
from cases import TOLERANCE, Case, make_inputs, rel_error
from server_process import MAIN_LIMITS, ServerProcess, require_binary

THREADS = 6
FP32_TOLERANCE = TOLERANCE[np.dtype(np.float32)]
WARMUP_REQUESTS = 12  # answered before the signal, so the load is really running
# Large enough that the CPU backend is busy for milliseconds per request, so some are in flight.
SHAPES = [Case("a", [200, 56], [200, 56], heads=4, heads_k=2, dim=64, options={"causal": True}),
          Case("b", [128], [160], heads=2, heads_k=2, dim=32)]


def _prepare(rng):
    prepared = []
    for case in SHAPES:
        inputs = make_inputs(case, np.float32, rng)
        out, _ = reference.attention_forward(inputs["q"], inputs["k"], inputs["v"],
                                             inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
                                             **case.options)
        prepared.append((case, inputs, out))
    return prepared


def test_sigterm_under_load(rng):
    server = ServerProcess(require_binary(), MAIN_LIMITS).start()
    prepared = _prepare(rng)
    answered = threading.Semaphore(0)
    outcomes = [[] for _ in range(THREADS)]

    def load(index):
        with attnserve.Client(server.target, timeout=30) as client:
            for n in range(10_000):
                case, inputs, expected = prepared[(index + n) % len(prepared)]
                try:
                    result = client.forward(inputs["q"], inputs["k"], inputs["v"],
                                            inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
                                            **case.options)
                except attnserve.AttentionError as error:
                    outcomes[index].append((error.code, error.details))
                    return
                outcomes[index].append(rel_error(result.out, expected) <= FP32_TOLERANCE)
                answered.release()

    threads = [threading.Thread(target=load, args=(i,)) for i in range(THREADS)]
    try:
        for thread in threads:
            thread.start()
        for _ in range(WARMUP_REQUESTS):
            assert answered.acquire(timeout=30), f"no answers before SIGTERM:\n{server.log()}"
        server.terminate()
        code = server.wait()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        server.kill()
    assert code == 0, f"exit code {code} after SIGTERM:\n{server.log()}"
    assert not any(thread.is_alive() for thread in threads), "a client hung after shutdown"
    for results in outcomes:
        # Every answer before the refusal was right; the last call was refused as UNAVAILABLE
        # (the engine refuses new work before gRPC shuts down, because gRPC resets calls that
        # reach it after its shutdown began with CANCELLED, which reads as an error).
        assert all(ok is True for ok in results[:-1]), results
        assert results[-1][0] == grpc.StatusCode.UNAVAILABLE, results
