"""grpc.health.v1, server reflection, and readiness while draining after SIGTERM.

The reflection messages are tiny, so they are written and read as raw protobuf bytes here
rather than pulling in more generated code."""
import threading
import time

import grpc
import numpy as np

import attnserve
from attnserve import reference
from grpc_health import NOT_SERVING, SERVING, health_status
from server_process import MAIN_LIMITS, ServerProcess, require_binary


def test_health_check_serving(server):
    assert health_status(server.target) == SERVING


def test_reflection_lists_the_attention_service(server):
    list_services = b"\x3a\x00"  # ServerReflectionRequest.list_services = ""
    with grpc.insecure_channel(server.target) as channel:
        stream = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/"
                                       "ServerReflectionInfo")
        responses = list(stream(iter([list_services]), timeout=5))
    assert b"attnserve.v1.AttentionService" in responses[0]
    assert b"grpc.health.v1.Health" in responses[0]


def test_readiness_turns_off_while_accepted_work_drains(rng):
    # One thread makes a large request slow enough to still be running after SIGTERM.
    server = ServerProcess(require_binary(), {**MAIN_LIMITS, "cpu_threads": 1}).start()
    q = rng.standard_normal((2500, 8, 64)).astype(np.float32)
    cu = np.array([0, 2500], np.int32)
    result = {}

    def slow_request():
        with attnserve.Client(server.target, timeout=120) as client:
            result["forward"] = client.forward(q, q, q, cu, cu)

    try:
        assert server.http_status("/readyz") == 200
        worker = threading.Thread(target=slow_request)
        worker.start()
        server.wait_for_metric("attnserve_inflight_requests", 1)  # the slow request runs
        server.terminate()
        deadline = time.monotonic() + 5
        while server.http_status("/readyz") == 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.http_status("/readyz") == 503
        assert worker.is_alive(), "the request finished too fast to observe the drain"
        assert health_status(server.target) == NOT_SERVING
        worker.join(timeout=120)
        code = server.wait()
    finally:
        server.kill()
    assert code == 0, server.log()
    want, _ = reference.attention_forward(q, q, q, cu, cu)
    got = result["forward"].out
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-5
