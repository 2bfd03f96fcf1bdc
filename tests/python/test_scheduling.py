"""Scheduling seen from a client: concurrent compatible requests share launches and each gets
its own answer; a request whose deadline passes in the queue is dropped without running; a full
queue refuses work with RESOURCE_EXHAUSTED."""
import re
import threading
import time

import grpc
import numpy as np
import pytest

import attnserve
from attnserve import reference
from cases import rel_error
from server_process import MAIN_LIMITS, ServerProcess, require_binary


@pytest.fixture
def start_server():
    servers = []

    def start(**flags):
        server = ServerProcess(require_binary(), {**MAIN_LIMITS, **flags}).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.stop() == 0, server.log()


def slow_request(server, rng):
    """Occupies the single CPU thread for a while (seconds on the CI machine)."""
    q = rng.standard_normal((2500, 8, 64)).astype(np.float32)
    cu = np.array([0, 2500], np.int32)
    thread = threading.Thread(
        target=lambda: attnserve.Client(server.target, timeout=120).forward(q, q, q, cu, cu))
    thread.start()
    server.wait_for_metric("attnserve_inflight_requests", 1)  # running on the worker
    return thread


def test_concurrent_compatible_requests_share_launches(start_server, rng):
    server = start_server(cpu_threads=1, batching="true", max_queue_delay_us=200_000)
    requests = []
    for i in range(8):
        n, m = 5 + 3 * i, 9 + 2 * i
        q = rng.standard_normal((n, 4, 32)).astype(np.float32)
        k = rng.standard_normal((m, 2, 32)).astype(np.float32)
        v = rng.standard_normal((m, 2, 32)).astype(np.float32)
        requests.append((q, k, v, np.array([0, n], np.int32), np.array([0, m], np.int32)))
    results = [None] * len(requests)

    def send(i):
        with attnserve.Client(server.target, timeout=60) as client:
            results[i] = client.forward(*requests[i], causal=True)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (q, k, v, cu_q, cu_k), result in zip(requests, results):
        want, want_lse = reference.attention_forward(q, k, v, cu_q, cu_k, causal=True)
        assert rel_error(result.out, want) <= 1e-5
        # Rows that see no key (more queries than keys, causal) have lse = +inf.
        assert np.array_equal(np.isinf(result.lse), np.isinf(want_lse))
        finite = np.isfinite(want_lse)
        assert rel_error(result.lse[finite], want_lse[finite]) <= 1e-5
    assert max(r.execution.batched_requests for r in results) > 1
    launches = re.search(r"^attnserve_batch_requests_count (\S+)$",
                         server.http_get("/metrics").decode(), re.M)
    assert float(launches.group(1)) < len(requests)


def test_expired_request_is_dropped_before_running(start_server, rng):
    server = start_server(cpu_threads=1)
    blocker = slow_request(server, rng)
    x = rng.standard_normal((16, 2, 16)).astype(np.float32)
    cu = np.array([0, 16], np.int32)
    with attnserve.Client(server.target) as client:
        with pytest.raises(attnserve.AttentionError) as error:
            client.forward(x, x, x, cu, cu, timeout=0.05)
    assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    blocker.join()
    assert server.metric("attnserve_rejections_total", 'reason="deadline"') == 1


def test_full_queue_refuses_with_resource_exhausted(start_server, rng):
    server = start_server(cpu_threads=1, max_queue_size=1, batching="false")
    blocker = slow_request(server, rng)
    x = rng.standard_normal((16, 2, 16)).astype(np.float32)
    cu = np.array([0, 16], np.int32)
    queued_answer = []
    with attnserve.Client(server.target, timeout=60) as client:
        queued = threading.Thread(target=lambda: queued_answer.append(client.forward(x, x, x, cu, cu)))
        queued.start()
        server.wait_for_metric("attnserve_queue_depth", 1, 'device="cpu"')  # the queue is full
        with pytest.raises(attnserve.AttentionError) as error:
            client.forward(x, x, x, cu, cu)
        queued.join()
    blocker.join()
    assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue" in error.value.details
    assert queued_answer and queued_answer[0].execution.kernel == "reference"
    assert server.metric("attnserve_rejections_total", 'reason="queue_full"') == 1
