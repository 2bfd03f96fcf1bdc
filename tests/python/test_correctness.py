"""Forward and backward through the real server against the float64 reference."""
import numpy as np
import pytest

from cases import CASES, DTYPES, LSE_TOLERANCE, TOLERANCE, backward_errors, forward_errors, \
    make_inputs


def _forward(client, inputs, options):
    return client.forward(inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens_q"],
                          inputs["cu_seqlens_k"], **options)


def _backward(client, inputs, forward, options, deterministic=False):
    return client.backward(inputs["dout"], inputs["q"], inputs["k"], inputs["v"], forward.out,
                           forward.lse, inputs["cu_seqlens_q"], inputs["cu_seqlens_k"],
                           deterministic=deterministic, **options)


def _check_execution(execution):
    assert execution.device == "cpu" and execution.kernel == "reference"
    assert execution.batched_requests >= 1
    assert execution.queue_us >= 0 and execution.compute_us >= 0


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward(client, case, dtype_name, rng):
    dtype = DTYPES[dtype_name]
    inputs = make_inputs(case, dtype, rng)
    result = _forward(client, inputs, case.options)
    errors = forward_errors(result, inputs, case.options)
    assert errors["out"] <= TOLERANCE[dtype], errors
    assert errors["lse"] <= LSE_TOLERANCE, errors
    _check_execution(result.execution)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_backward(client, case, dtype_name, rng):
    dtype = DTYPES[dtype_name]
    inputs = make_inputs(case, dtype, rng)
    forward = _forward(client, inputs, case.options)
    # The server's own out and lse are the inputs, so the reference sees exactly what it saw.
    result = _backward(client, inputs, forward, case.options)
    errors = backward_errors(result, inputs, forward.out, forward.lse, case.options)
    assert max(errors.values()) <= TOLERANCE[dtype], errors
    _check_execution(result.execution)


def test_deterministic_backward_is_bitwise_reproducible(client, rng):
    case = next(c for c in CASES if c.name == "gqa")
    inputs = make_inputs(case, np.float32, rng)
    forward = _forward(client, inputs, case.options)
    first = _backward(client, inputs, forward, case.options, deterministic=True)
    second = _backward(client, inputs, forward, case.options, deterministic=True)
    for name in ("dq", "dk", "dv"):
        assert getattr(first, name).tobytes() == getattr(second, name).tobytes(), name
