"""GetServerInfo and the HTTP endpoints."""
import json

import numpy as np

from attnserve import attention_pb2 as pb2
from server_process import MAIN_LIMITS, SMALL_LIMITS


def _assert_limits(limits, expected):
    for name, value in expected.items():
        assert getattr(limits, name) == value, name


def test_server_info(client):
    info = client.server_info()
    assert info.version
    cpu = [device for device in info.devices if device.name == "cpu"]
    assert cpu, info
    assert cpu[0].uuid == ""  # GPUs carry nvidia-smi's "GPU-..." (checked by scripts/gpu_e2e.sh)
    assert "reference" in info.kernel_families and "reference" in cpu[0].kernel_families
    assert {pb2.DTYPE_FLOAT16, pb2.DTYPE_BFLOAT16, pb2.DTYPE_FLOAT32} <= set(info.dtypes)
    _assert_limits(info.limits, MAIN_LIMITS)


def test_server_info_reports_call_limits(client):
    # The server's defaults: --max_concurrent_requests=256, --max_deadline_seconds=600,
    # --max_request_compute_seconds=30.
    limits = client.server_info().limits
    assert limits.max_concurrent_requests == 256
    assert limits.max_deadline_seconds == 600
    assert limits.max_request_compute_seconds == 30


def test_server_info_reports_small_limits(small_client):
    _assert_limits(small_client.server_info().limits, SMALL_LIMITS)


def test_http_endpoints(server, client):
    # At least one attention request counted, so the labelled counters exist.
    x = np.ones((4, 1, 8), np.float32)
    client.forward(x, x, x, [0, 4], [0, 4])
    assert server.http_status("/healthz") == 200
    assert server.http_status("/readyz") == 200
    assert "attnserve_requests_total" in server.http_get("/metrics").decode()
    info = json.loads(server.http_get("/v1/info"))
    assert info["version"] == client.server_info().version
