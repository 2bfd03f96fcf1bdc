"""Writes the fuzzers' seed corpus (corpus/<target>/) from valid and near-valid requests.

Run from the repository root with the project's virtualenv (it imports the attnserve client's
generated protobuf classes): .venv/bin/python tests/fuzz/make_corpus.py
request_fuzzer seeds are one selector byte (0 forward, 1 backward) then the serialized request;
rest_body_fuzzer seeds are a flag byte (odd: Inference-Header-Content-Length sent), its value in
two little-endian bytes, then the body.
"""
import json
import pathlib
import struct

import numpy as np

from attnserve._proto.attnserve.v1 import attention_pb2 as pb2

HERE = pathlib.Path(__file__).resolve().parent
DTYPES = {pb2.DTYPE_FLOAT32: np.float32, pb2.DTYPE_FLOAT16: np.float16}


def tensor(rng, dtype, shape, scale=1.0):
    if dtype == pb2.DTYPE_BFLOAT16:
        # bf16 is the high half of a float32.
        bits = (rng.standard_normal(shape).astype(np.float32) * scale).view(np.uint32) >> 16
        data = bits.astype(np.uint16).tobytes()
    else:
        data = (rng.standard_normal(shape) * scale).astype(DTYPES[dtype]).tobytes()
    return pb2.Tensor(dtype=dtype, shape=list(shape), data=data)


def forward(rng, dtype, seqlens_q, seqlens_k, heads, heads_k, head_dim, **options):
    cu_q, cu_k = np.cumsum([0] + seqlens_q), np.cumsum([0] + seqlens_k)
    return pb2.ForwardRequest(
        q=tensor(rng, dtype, (cu_q[-1], heads, head_dim)),
        k=tensor(rng, dtype, (cu_k[-1], heads_k, head_dim)),
        v=tensor(rng, dtype, (cu_k[-1], heads_k, head_dim)),
        cu_seqlens_q=cu_q.tolist(), cu_seqlens_k=cu_k.tolist(),
        options=pb2.AttentionOptions(**options))


def backward(rng, f, deterministic=False):
    total_q, heads = f.q.shape[0], f.q.shape[1]
    lse = pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=[heads, total_q],
                     data=(rng.random((heads, total_q)) + 1).astype(np.float32).tobytes())
    return pb2.BackwardRequest(
        dout=tensor(rng, f.q.dtype, f.q.shape), q=f.q, k=f.k, v=f.v,
        out=tensor(rng, f.q.dtype, f.q.shape), lse=lse, cu_seqlens_q=f.cu_seqlens_q,
        cu_seqlens_k=f.cu_seqlens_k, options=f.options, deterministic=deterministic)


def request_seeds():
    rng = np.random.default_rng(0)
    forwards = [
        forward(rng, pb2.DTYPE_FLOAT32, [3], [3], 1, 1, 4),
        forward(rng, pb2.DTYPE_FLOAT16, [2, 5], [4, 3], 4, 2, 8, causal=True),
        forward(rng, pb2.DTYPE_BFLOAT16, [4, 1], [2, 6], 2, 1, 16, window_left=1, window_right=0),
        forward(rng, pb2.DTYPE_FLOAT32, [5, 0, 3], [1, 4, 3], 2, 2, 8, softcap=5.0,
                softmax_scale=0.3),
        forward(rng, pb2.DTYPE_FLOAT16, [6], [2], 8, 1, 32, causal=True, window_left=2),
        forward(rng, pb2.DTYPE_FLOAT32, [0], [0], 1, 1, 4),
    ]
    seeds = {f"forward_{i}": b"\x00" + f.SerializeToString() for i, f in enumerate(forwards)}
    for i, f in enumerate(forwards[:5]):
        seeds[f"backward_{i}"] = b"\x01" + backward(rng, f, i % 2 == 1).SerializeToString()
    # Near misses, so the fuzzer starts next to each validation branch.
    bad_offsets = forward(rng, pb2.DTYPE_FLOAT32, [2, 2], [2, 2], 1, 1, 4)
    bad_offsets.cu_seqlens_q[:] = [0, 3, 4]
    seeds["forward_bad_offsets"] = b"\x00" + bad_offsets.SerializeToString()
    bad_bytes = forward(rng, pb2.DTYPE_FLOAT16, [2], [2], 2, 1, 8)
    bad_bytes.k.data = bad_bytes.k.data[:-2]
    seeds["forward_bad_bytes"] = b"\x00" + bad_bytes.SerializeToString()
    return seeds


def http_seeds():
    seeds = {}
    paths = {"healthz": "/healthz", "readyz": "/readyz", "metrics": "/metrics",
             "info": "/v1/info", "unknown": "/nope", "query": "/v1/info?x=%00"}
    for name, path in paths.items():
        seeds[f"get_{name}"] = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
    seeds["post_body"] = (b"POST /v1/info HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    seeds["chunked"] = (b"POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"5\r\nhello\r\n0\r\n\r\n")
    seeds["http10_keepalive"] = b"HEAD /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    seeds["pipelined"] = b"GET /healthz HTTP/1.1\r\n\r\nGET /readyz HTTP/1.1\r\n\r\n"
    seeds["partial"] = b"GET /metr"
    return seeds


def rest_body_seeds():
    def seed(body, json_length=None):
        if json_length is None:
            return b"\0\0\0" + body
        return bytes([1]) + struct.pack("<H", json_length) + body

    forward = {
        "id": "r", "parameters": {"causal": True, "softmax_scale": 0.5, "window_left": 3},
        "inputs": [
            {"name": "q", "datatype": "FP32", "shape": [2, 1, 2], "data": [[[1, 2]], [[3, 4]]]},
            {"name": "k", "datatype": "FP16", "shape": [2], "data": [1.5, -2]},
            {"name": "v", "datatype": "BF16", "shape": [1], "data": [1]},
            {"name": "cu_seqlens_q", "datatype": "INT32", "shape": [2], "data": [0, 2]}],
        "outputs": [{"name": "out", "parameters": {"binary_data": True}}, {"name": "lse"}]}
    binary = json.dumps({
        "inputs": [
            {"name": "q", "datatype": "FP32", "shape": [2],
             "parameters": {"binary_data_size": 8}},
            {"name": "k", "datatype": "FP16", "shape": [1],
             "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 2}}],
        "parameters": {"binary_data_output": True}}).encode()
    return {
        "json": seed(json.dumps(forward).encode()),
        "binary": seed(binary + struct.pack("<2f", 1, 2), len(binary)),
        "register": seed(json.dumps({"key": "/k", "offset": 0, "byte_size": 64}).encode()),
    }


def write(target, seeds):
    directory = HERE / "corpus" / target
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    for name, data in seeds.items():
        (directory / name).write_bytes(data)


if __name__ == "__main__":
    write("request_fuzzer", request_seeds())
    write("http_fuzzer", http_seeds())
    write("rest_body_fuzzer", rest_body_seeds())
