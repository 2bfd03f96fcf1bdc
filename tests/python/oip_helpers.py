"""Builds Open Inference Protocol requests with tritonclient (its gRPC and HTTP clients share
one API) for the attention models, checks answers against the float64 reference, and posts
raw REST bodies."""
import http.client
import uuid

import numpy as np
import pytest
from ml_dtypes import bfloat16

from attnserve import reference
from cases import TOLERANCE, rel_error

FORWARD_INPUTS = ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"]
BACKWARD_INPUTS = ["dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k"]

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


def check_forward(result, arrays, dtype, options):
    """Checks a forward answer's out and lse against the reference; returns them."""
    out, lse = as_dtype(result.as_numpy("out"), dtype), result.as_numpy("lse")
    check_forward_outputs(out, lse, arrays, dtype, options)
    return out, lse


def check_forward_outputs(out, lse, arrays, dtype, options):
    ref_out, ref_lse = reference.attention_forward(
        arrays["q"], arrays["k"], arrays["v"], arrays["cu_seqlens_q"], arrays["cu_seqlens_k"],
        **options)
    check_close(out, ref_out, dtype, "out")
    check_close(lse, ref_lse, np.float32, "lse")


def check_backward(result, arrays, dtype, options):
    """Checks a backward answer's dq, dk and dv against the reference (arrays has out, lse)."""
    refs = reference.attention_backward(
        arrays["dout"], arrays["q"], arrays["k"], arrays["v"], arrays["out"], arrays["lse"],
        arrays["cu_seqlens_q"], arrays["cu_seqlens_k"], **options)
    for name, ref in zip(("dq", "dk", "dv"), refs):
        check_close(as_dtype(result.as_numpy(name), dtype), ref, dtype, name)


def forward_through_region(module, client, region_name, handle, arrays):
    """Runs a causal attention_forward through tritonclient `module` (gRPC or HTTP) with every
    input read from, and out and lse written to, the registered region `region_name` of
    `handle` (inputs back to back from offset 0, the outputs after them); checks out and lse
    against the reference and returns the result."""
    from tritonclient.utils import shared_memory as shm

    offsets, offset = {}, 0
    for name in FORWARD_INPUTS:
        offsets[name] = offset
        offset += arrays[name].nbytes
    shm.set_shared_memory_region(handle, [arrays[n] for n in FORWARD_INPUTS])
    q = arrays["q"]
    out_offset, lse_offset = offset, offset + q.nbytes
    lse_shape = (q.shape[1], q.shape[0])
    inputs = []
    for name in FORWARD_INPUTS:
        array = arrays[name]
        tensor = module.InferInput(name, list(array.shape), DATATYPES[array.dtype])
        tensor.set_shared_memory(region_name, array.nbytes, offsets[name])
        inputs.append(tensor)
    outputs = [module.InferRequestedOutput("out"), module.InferRequestedOutput("lse")]
    outputs[0].set_shared_memory(region_name, q.nbytes, out_offset)
    outputs[1].set_shared_memory(region_name, 4 * q.shape[0] * q.shape[1], lse_offset)
    result = client.infer("attention_forward", inputs, outputs=outputs,
                          parameters={"causal": True})
    out = shm.get_contents_as_numpy(handle, q.dtype, q.shape, out_offset)
    lse = shm.get_contents_as_numpy(handle, np.float32, lse_shape, lse_offset)
    check_forward_outputs(out, lse, arrays, q.dtype, {"causal": True})
    return result


def error_of(client, model, inputs, **kwargs):
    """The InferenceServerException a tritonclient (gRPC or HTTP) inference raises."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as raised:
        client.infer(model, inputs, **kwargs)
    return raised.value


def post(server, path, body, headers=None):
    """(status, headers, body) of a POST to the server's HTTP port, without tritonclient; an
    iterable body with a Transfer-Encoding header is sent chunked."""
    headers = headers or {}
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers,
                           encode_chunked="Transfer-Encoding" in headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


# Fixtures the inference-protocol test modules import: a server with shared memory allowed,
# and tritonclient's gRPC and HTTP clients of it.
@pytest.fixture(scope="module")
def oip_server():
    from server_process import MAIN_LIMITS, run_server

    yield from run_server(dict(MAIN_LIMITS, allow_shared_memory="true"))


@pytest.fixture(scope="module")
def triton(oip_server):
    import tritonclient.grpc

    with tritonclient.grpc.InferenceServerClient(oip_server.target) as client:
        yield client


@pytest.fixture(scope="module")
def triton_http(oip_server):
    import tritonclient.http

    with tritonclient.http.InferenceServerClient(f"127.0.0.1:{oip_server.http_port}") as client:
        yield client


@pytest.fixture
def region():
    """A fresh POSIX shared-memory object of 64 KiB (key, tritonclient handle); removed
    afterwards."""
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    key = f"/attnserve_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key[1:], key, 1 << 16)
    yield key, handle
    shm.destroy_shared_memory_region(handle)
