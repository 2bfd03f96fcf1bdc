"""Builds Open Inference Protocol requests with tritonclient (its gRPC and HTTP clients share
one API) for the attention models, and checks answers against the float64 reference."""
import numpy as np
import pytest
from ml_dtypes import bfloat16

from cases import TOLERANCE, rel_error

DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16",
             np.dtype(bfloat16): "BF16", np.dtype(np.int32): "INT32"}


def make_problem(rng, dtype, causal=True):
    """q, k, v, dout (rounded to dtype) and offsets of two sequences, 2 heads, head_dim 16."""
    seqlens_q, seqlens_k = [7, 9], [11, 9]
    cu_q = np.concatenate([[0], np.cumsum(seqlens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(seqlens_k)]).astype(np.int32)

    def randn(tokens):
        return rng.standard_normal((tokens, 2, 16)).astype(dtype)

    return {"q": randn(cu_q[-1]), "k": randn(cu_k[-1]), "v": randn(cu_k[-1]),
            "dout": randn(cu_q[-1]), "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}


def infer_input(module, name, array, binary=True):
    datatype = DATATYPES.get(array.dtype, "FP64")
    tensor = module.InferInput(name, list(array.shape), datatype)
    if binary is None:  # gRPC: no binary_data argument
        tensor.set_data_from_numpy(array)
    else:
        tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def inputs_for(module, arrays, names, binary=True):
    return [infer_input(module, name, arrays[name], binary) for name in names]


def as_dtype(array, dtype):
    """A returned array in the request's dtype (older tritonclients give BF16 as float32)."""
    return array.astype(dtype) if np.dtype(dtype) == np.dtype(bfloat16) else array


def check_close(actual, expected, dtype, name):
    error = rel_error(actual, expected)
    assert error <= TOLERANCE[np.dtype(dtype)], f"{name}: relative error {error}"


# Fixtures the inference-protocol test modules import: a server with shared memory allowed,
# and tritonclient's gRPC client of it.
@pytest.fixture(scope="module")
def oip_server():
    from server_process import MAIN_LIMITS, run_server

    yield from run_server(dict(MAIN_LIMITS, allow_shared_memory="true"))


@pytest.fixture(scope="module")
def triton(oip_server):
    import tritonclient.grpc

    with tritonclient.grpc.InferenceServerClient(oip_server.target) as client:
        yield client
