"""A real device fault on the GPU machine: scripts/gpu_e2e.sh starts a server with
--inject_device_fault=cuda:0@3/1, so its third launch is a kernel that traps (a sticky CUDA
error, as an illegal address or an ECC error would leave) and the first reset after it fails.
The faulting call is answered UNAVAILABLE and the server tries to reset the GPU. Where a reset
succeeds, the GPU answers correctly again, over gRPC and over the data channel (whose
page-locked receive buffers must survive the reset). On the H200 machine (CUDA 13) the trap's
sticky error survives cudaDeviceReset every time: then the GPU stays out of service, the server
is neither ready nor alive (/healthz names the reset error and asks for a restart), and calls
are refused UNAVAILABLE. Skipped elsewhere; tests/python/test_device_faults.py covers the logic
in CI."""
import os
import re
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

import attnserve
from attnserve import reference
from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from attnserve._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc

TARGET = os.environ.get("ATTNSERVE_GPU_FAULT_TARGET")
HTTP = os.environ.get("ATTNSERVE_GPU_FAULT_HTTP")
pytestmark = pytest.mark.skipif(not TARGET or not HTTP,
                                reason="needs gpu_e2e.sh's fault-injected GPU server")
FAULTING_LAUNCH = 3  # gpu_e2e.sh: --inject_device_fault=cuda:0@3/1
DEVICE = 'device="cuda:0"'


def metric(name, labels):
    text = urllib.request.urlopen(HTTP + "/metrics", timeout=10).read().decode()
    match = re.search(r"^" + re.escape(name) + r"\{" + re.escape(labels) + r"\} (\S+)$", text,
                      re.M)
    return float(match.group(1)) if match else 0.0


def http_status(path):
    try:
        return urllib.request.urlopen(HTTP + path, timeout=10).status
    except urllib.error.HTTPError as error:
        return error.code


def inputs(rng, tokens=(200, 57), heads=4, dim=64):
    make = lambda n: rng.standard_normal((n, heads, dim)).astype(np.float16)
    total = sum(tokens)
    cu = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int32)
    return make(total), make(total), make(total), cu


def grpc_forward(stub, q, k, v, cu):
    tensor = lambda a: pb2.Tensor(dtype=pb2.DTYPE_FLOAT16, shape=a.shape, data=a.tobytes())
    return stub.Forward(pb2.ForwardRequest(q=tensor(q), k=tensor(k), v=tensor(v),
                                           cu_seqlens_q=cu, cu_seqlens_k=cu,
                                           options=pb2.AttentionOptions(causal=True)),
                        timeout=120)


def check(out, q, k, v, cu):
    want, _ = reference.attention_forward(q, k, v, cu, cu, causal=True)
    got = np.asarray(out, dtype=np.float64).reshape(want.shape)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 2e-3


def test_a_trapped_kernel_takes_the_gpu_out_until_a_reset_succeeds():
    rng = np.random.default_rng()
    assert metric("attnserve_device_faults_total", DEVICE) == 0, "run this test once per server"
    with grpc.insecure_channel(TARGET, options=[("grpc.enable_retries", 0)]) as channel:
        stub = pb2_grpc.AttentionServiceStub(channel)
        for _ in range(FAULTING_LAUNCH - 1):
            q, k, v, cu = inputs(rng)
            answer = grpc_forward(stub, q, k, v, cu)
            check(np.frombuffer(answer.out.data, np.float16), q, k, v, cu)
        with pytest.raises(grpc.RpcError) as faulted:
            grpc_forward(stub, *inputs(rng))
        assert faulted.value.code() == grpc.StatusCode.UNAVAILABLE, faulted.value.details()
        assert "sticky" in faulted.value.details()
        assert metric("attnserve_device_faults_total", DEVICE) == 1

        # The first reset fails by injection; then real ones until one works or the server
        # gives the GPU up (kFailedResetsBeforeRestart more).
        deadline = time.monotonic() + 60
        while (metric("attnserve_device_resets_total", DEVICE + ',result="ok"') < 1 and
               metric("attnserve_device_resets_total", DEVICE + ',result="failed"') < 4):
            assert time.monotonic() < deadline, "no reset was tried"
            time.sleep(0.05)
        if metric("attnserve_device_resets_total", DEVICE + ',result="ok"') < 1:
            assert metric("attnserve_device_healthy", DEVICE) == 0
            assert http_status("/readyz") == 503
            with pytest.raises(urllib.error.HTTPError) as dead:
                urllib.request.urlopen(HTTP + "/healthz", timeout=10)
            assert dead.value.code == 503
            assert "restart the process" in dead.value.read().decode()
            info = stub.GetServerInfo(pb2.GetServerInfoRequest(), timeout=30)
            assert info.devices[0].out_of_service and "sticky" in info.devices[0].fault
            with pytest.raises(grpc.RpcError) as refused:
                grpc_forward(stub, *inputs(rng))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            return
        assert metric("attnserve_device_resets_total", DEVICE + ',result="failed"') == 1
        assert metric("attnserve_device_healthy", DEVICE) == 1
        assert http_status("/readyz") == 200
        info = stub.GetServerInfo(pb2.GetServerInfoRequest(), timeout=30)
        assert not info.devices[0].out_of_service and info.devices[0].fault == ""

        # The reset context runs kernels again, small and large, over gRPC ...
        for tokens in [(200, 57), (4096, 1000)]:
            q, k, v, cu = inputs(rng, tokens)
            answer = grpc_forward(stub, q, k, v, cu)
            assert answer.execution.device == "cuda:0"
            check(np.frombuffer(answer.out.data, np.float16), q, k, v, cu)
    # ... and over the data channel, into page-locked buffers kept from before the reset.
    with attnserve.Client(TARGET, timeout=120) as client:
        for tokens in [(4096, 1000), (2048,), (4096, 1000)]:
            q, k, v, cu = inputs(rng, tokens)
            result = client.forward(q, k, v, cu, cu, causal=True)
            assert result.execution.device == "cuda:0"
            check(result.out, q, k, v, cu)
    assert metric("attnserve_device_faults_total", DEVICE) == 1
