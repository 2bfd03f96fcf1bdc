"""Many clients at once, mixed shapes, dtypes and RPCs: every answer is still right."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import attnserve
from cases import CASES, DTYPES, TOLERANCE, backward_errors, forward_errors, make_inputs

THREADS = 8
REQUESTS_PER_THREAD = 4


def _client_session(target, index, seed):
    rng = np.random.default_rng(seed)
    dtypes = list(DTYPES.values())
    with attnserve.Client(target, timeout=60) as client:
        for i in range(REQUESTS_PER_THREAD):
            case = CASES[(index * REQUESTS_PER_THREAD + i) % len(CASES)]
            dtype = dtypes[(index + i) % len(dtypes)]
            inputs = make_inputs(case, dtype, rng)
            args = (inputs["q"], inputs["k"], inputs["v"])
            cu = (inputs["cu_seqlens_q"], inputs["cu_seqlens_k"])
            forward = client.forward(*args, *cu, **case.options)
            errors = forward_errors(forward, inputs, case.options)
            assert errors["out"] <= TOLERANCE[dtype], (case.name, dtype, errors)
            if i % 2:
                backward = client.backward(inputs["dout"], *args, forward.out, forward.lse, *cu,
                                           **case.options)
                errors = backward_errors(backward, inputs, forward.out, forward.lse,
                                         case.options)
                assert max(errors.values()) <= TOLERANCE[dtype], (case.name, dtype, errors)


def test_concurrent_clients(server):
    seeds = np.random.SeedSequence().spawn(THREADS)
    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(_client_session, server.target, i, seeds[i])
                   for i in range(THREADS)]
        for future in futures:
            future.result()  # re-raises a thread's assertion
