"""Device faults (issue 19 item 3), with a fault injected on the CPU device: the launch that
faults is answered UNAVAILABLE (retryable), the device is reported out of service (metric,
GetServerInfo, /readyz while no device can serve), later calls are refused UNAVAILABLE, and the
device serves again only after a reset of it succeeds. tests/gpu/test_device_faults_gpu.py does
the same with a real trapped kernel."""
import urllib.error

import grpc
import numpy as np
import pytest

from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from attnserve._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc
from grpc_health import NOT_SERVING, SERVING, health_status, watch_statuses
from server_process import CALL_TIMEOUT_S, run_server

HEADS, DIM = 2, 8
HEALTHY = 'device="cpu"'


def request(rng, sequences=3):
    """One query and one key per sequence: out must equal v exactly."""
    def tensor(data):
        return pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=data.shape, data=data.tobytes())
    q, k, v = (rng.standard_normal((sequences, HEADS, DIM)).astype(np.float32) for _ in range(3))
    cu = list(range(sequences + 1))
    return pb2.ForwardRequest(q=tensor(q), k=tensor(k), v=tensor(v), cu_seqlens_q=cu,
                              cu_seqlens_k=cu), v


def forward(server, req):
    with grpc.insecure_channel(server.target) as channel:
        return pb2_grpc.AttentionServiceStub(channel).Forward(req, timeout=CALL_TIMEOUT_S)


def expect_correct(server, rng):
    req, v = request(rng)
    out = np.frombuffer(forward(server, req).out.data, np.float32).reshape(v.shape)
    np.testing.assert_array_equal(out, v)


def expect_unavailable(server, rng, *words):
    with pytest.raises(grpc.RpcError) as refused:
        forward(server, request(rng)[0])
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
    for word in words:
        assert word in refused.value.details()


def device_info(server):
    with grpc.insecure_channel(server.target) as channel:
        info = pb2_grpc.AttentionServiceStub(channel).GetServerInfo(
            pb2.GetServerInfoRequest(), timeout=CALL_TIMEOUT_S)
    return info.devices[0]


@pytest.fixture
def broken_server():
    """The second launch faults and every reset fails: the device never comes back."""
    yield from run_server({"devices": "cpu", "inject_device_fault": "cpu@2/1000000",
                           "device_reset_interval_seconds": 3600})


@pytest.fixture
def recovering_server():
    """The first launch faults, the first reset fails, the second succeeds."""
    yield from run_server({"devices": "cpu", "inject_device_fault": "cpu@1/1",
                           "device_reset_interval_seconds": 0.05})


def test_a_faulted_device_is_out_of_service_and_readiness_fails(broken_server, rng):
    assert device_info(broken_server).out_of_service is False
    assert broken_server.metric("attnserve_device_healthy", HEALTHY) == 1
    expect_correct(broken_server, rng)
    expect_unavailable(broken_server, rng, "injected device fault")

    info = device_info(broken_server)
    assert info.out_of_service is True
    assert "injected device fault" in info.fault
    assert broken_server.metric("attnserve_device_healthy", HEALTHY) == 0
    assert broken_server.metric("attnserve_device_faults_total", HEALTHY) == 1
    # The only device cannot serve: not ready (traffic goes to other replicas), but alive.
    assert broken_server.http_status("/readyz") == 503
    assert broken_server.http_status("/healthz") == 200
    # Refused before queueing, retryably, saying why.
    expect_unavailable(broken_server, rng, "no device", "in service", "retry")
    assert broken_server.metric("attnserve_rejections_total", 'reason="device_fault"') >= 1


def test_grpc_health_follows_the_devices(broken_server, rng):
    """grpc.health.v1 says what /readyz says: load balancers that probe gRPC (Envoy, Kubernetes'
    gRPC probes) move traffic away too."""
    with grpc.insecure_channel(broken_server.target) as channel:
        watched = watch_statuses(channel, "attnserve.v1.AttentionService")
        assert next(watched) == SERVING
        assert health_status(broken_server.target) == SERVING
        expect_correct(broken_server, rng)
        expect_unavailable(broken_server, rng, "injected device fault")
        assert health_status(broken_server.target) == NOT_SERVING
        assert health_status(broken_server.target, "attnserve.v1.AttentionService") == NOT_SERVING
        assert next(watched) == NOT_SERVING  # told, not only asked


def test_a_device_comes_back_only_after_a_reset_succeeds(recovering_server, rng):
    expect_unavailable(recovering_server, rng, "injected device fault")
    recovering_server.wait_for_metric("attnserve_device_resets_total", 1,
                                      'device="cpu",result="ok"')
    assert recovering_server.metric("attnserve_device_resets_total",
                                    'device="cpu",result="failed"') == 1
    assert recovering_server.metric("attnserve_device_healthy", HEALTHY) == 1
    assert recovering_server.http_status("/readyz") == 200
    assert health_status(recovering_server.target) == SERVING
    info = device_info(recovering_server)
    assert info.out_of_service is False and info.fault == ""
    for _ in range(3):
        expect_correct(recovering_server, rng)


def test_a_device_that_cannot_be_reset_fails_liveness(rng):
    """Resets that keep failing (as a trapped kernel's sticky error does on a real GPU) leave
    no device that can serve: liveness fails too, naming why, so the orchestrator restarts."""
    for server in run_server({"devices": "cpu", "inject_device_fault": "cpu@1/1000000",
                              "device_reset_interval_seconds": 0.01}):
        expect_unavailable(server, rng, "injected device fault")
        server.wait_for_metric("attnserve_device_resets_total", 3, 'device="cpu",result="failed"')
        assert server.http_status("/healthz") == 503
        with pytest.raises(urllib.error.HTTPError) as failed:
            server.http_get("/healthz")
        body = failed.value.read().decode()
        assert "restart the process" in body and "injected reset failure" in body
