"""Scheduling seen from a client: concurrent compatible requests share launches and each gets
its own answer; a request whose deadline passes in the queue is dropped without running; a full
queue refuses work with RESOURCE_EXHAUSTED; a request that fits the device's memory budget but
not beside the running ones waits for them (bounded by its deadline and the queue size); higher
priority (x-attnserve-priority) launches first and waiting ages low priority up."""
import re
import threading
import time

import grpc
import numpy as np
import pytest

import attnserve
from attnserve import reference
from attnserve.client import forward_request
from cases import rel_error
from server_process import MAIN_LIMITS, ServerProcess, require_binary

# Blockers, deadlines and drains here are sized for an uninstrumented server's CPU kernels; the
# TSan stage (scripts/test_hardening.sh) leaves the module out. The scheduler's threads are
# covered under TSan by its unit tests (queue workers, placement, priorities), 20 times over.
pytestmark = pytest.mark.compute_timed


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


SLOW_TOKENS = 2500
# What the engine reserves for one slow request (request_cost.h: q, k, v and out, plus lse).
SLOW_REQUEST_BYTES = 4 * SLOW_TOKENS * 8 * 64 * 4 + SLOW_TOKENS * 8 * 4


def request_bytes(tokens, heads, head_dim=64):
    """What the engine reserves for a float32 self-attention forward (request_cost.h)."""
    return 4 * tokens * heads * head_dim * 4 + tokens * heads * 4


def slow_request(server, rng, results=None, inflight=1, tokens=SLOW_TOKENS, heads=8):
    """Occupies a CPU thread for a while (about a second per 2500 tokens x 8 heads on the CI
    machine; time grows with tokens squared, memory with tokens)."""
    q = rng.standard_normal((tokens, heads, 64)).astype(np.float32)
    cu = np.array([0, tokens], np.int32)

    def send():
        result = attnserve.Client(server.target, timeout=120).forward(q, q, q, cu, cu)
        if results is not None:
            results.append(result)

    thread = threading.Thread(target=send)
    thread.start()
    server.wait_for_metric("attnserve_inflight_requests", inflight)  # accepted by the engine
    return thread


def small_request(rng, tokens=16):
    x = rng.standard_normal((tokens, 2, 16)).astype(np.float32)
    cu = np.array([0, tokens], np.int32)
    return x, x, x, cu, cu


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
    # The blocker (~2 s on the CI machine) outlasts the deadline by far, and the deadline
    # leaves a slow (sanitizer) build time to receive and queue the call before it expires.
    blocker = slow_request(server, rng, tokens=int(SLOW_TOKENS * 1.4))
    x = rng.standard_normal((16, 2, 16)).astype(np.float32)
    cu = np.array([0, 16], np.int32)
    with attnserve.Client(server.target) as client:
        with pytest.raises(attnserve.AttentionError) as error:
            client.forward(x, x, x, cu, cu, timeout=0.4)
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


def test_many_concurrent_clients_each_get_their_own_answer(start_server, rng):
    server = start_server(cpu_threads=1, cpu_lanes=2, batching="true", max_queue_delay_us=20_000)
    requests = []
    for i in range(48):
        heads_k = 2 if i % 3 else 1  # two compatibility groups, so batches form per group
        n, m = 3 + i % 11, 4 + (7 * i) % 13
        q = rng.standard_normal((n, 4, 16)).astype(np.float32)
        k = rng.standard_normal((m, heads_k, 16)).astype(np.float32)
        v = rng.standard_normal((m, heads_k, 16)).astype(np.float32)
        requests.append((q, k, v, np.array([0, n], np.int32), np.array([0, m], np.int32)))
    results = [None] * len(requests)
    barrier = threading.Barrier(len(requests))

    def send(i):
        with attnserve.Client(server.target, timeout=60) as client:
            barrier.wait()
            results[i] = client.forward(*requests[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (q, k, v, cu_q, cu_k), result in zip(requests, results):
        want, want_lse = reference.attention_forward(q, k, v, cu_q, cu_k)
        assert rel_error(result.out, want) <= 1e-5
        assert rel_error(result.lse, want_lse) <= 1e-5
    assert max(r.execution.batched_requests for r in results) > 1


def test_request_waits_for_memory_held_by_a_running_one(start_server, rng):
    # Room for one slow request at a time, and a free second lane: the second waits anyway.
    server = start_server(cpu_threads=1, cpu_lanes=2,
                          device_memory_bytes=SLOW_REQUEST_BYTES * 3 // 2)
    results = []
    first = slow_request(server, rng, results)
    second = slow_request(server, rng, results, inflight=2)
    server.wait_for_metric("attnserve_memory_waits_total", 1, 'device="cpu"')
    assert server.metric("attnserve_queue_depth", 'device="cpu"') == 1
    assert server.metric("attnserve_device_memory_reserved_bytes", 'device="cpu"') == \
        SLOW_REQUEST_BYTES
    first.join()
    second.join()
    assert len(results) == 2
    waited = max(results, key=lambda r: r.execution.queue_us)
    ran_first = min(results, key=lambda r: r.execution.queue_us)
    # The second waited for most of the first's compute (it was sent a little later).
    assert waited.execution.queue_us >= ran_first.execution.compute_us / 2
    assert server.metric("attnserve_device_memory_reserved_bytes", 'device="cpu"') == 0


def test_waiting_for_memory_is_bounded_by_deadline_and_queue_size(start_server, rng):
    # The blocker: 12000 tokens x 1 head runs several seconds (23x the work of the slow request)
    # on half its memory, so the waiter's deadline passes long before it ends. The budget holds
    # either request alone but not both.
    blocker_tokens = 12000
    blocker_bytes = request_bytes(blocker_tokens, 1)
    server = start_server(cpu_threads=1, cpu_lanes=2, max_queue_size=1,
                          max_total_tokens=blocker_tokens,
                          device_memory_bytes=SLOW_REQUEST_BYTES + blocker_bytes // 2)
    blocker = slow_request(server, rng, tokens=blocker_tokens, heads=1)
    q = rng.standard_normal((SLOW_TOKENS, 8, 64)).astype(np.float32)
    cu = np.array([0, SLOW_TOKENS], np.int32)
    waiting_codes = []

    def wait_for_memory(client):
        try:
            client.forward(q, q, q, cu, cu, timeout=0.5)
        except attnserve.AttentionError as error:
            waiting_codes.append(error.code)

    with attnserve.Client(server.target) as client:
        waiting = threading.Thread(target=wait_for_memory, args=(client,))
        waiting.start()
        server.wait_for_metric("attnserve_memory_waits_total", 1, 'device="cpu"')
        # The queue (size 1) is full of a request waiting for memory: the next is refused.
        with pytest.raises(attnserve.AttentionError) as full:
            client.forward(*small_request(rng))
        waiting.join()
    assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue" in full.value.details
    assert waiting_codes == [grpc.StatusCode.DEADLINE_EXCEEDED]
    # The server dropped the waiting request, while the blocker still ran: at its own deadline
    # ("deadline"), or when the client's cancel arrives first ("cancelled"). The client's
    # deadline runs ahead of the server's by the call's transit time, and on a loaded machine its
    # cancel can reach the waiting request before the server's deadline passes.
    dropped = server.wait_for_metric("attnserve_rejections_total", 1,
                                     ['reason="deadline"', 'reason="cancelled"'])
    assert dropped == 1
    # The dropped call leaves the in-flight count once its answer is sent, just after.
    deadline = time.monotonic() + 10
    while server.metric("attnserve_inflight_requests") > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.metric("attnserve_inflight_requests") == 1
    assert server.metric("attnserve_queue_depth", 'device="cpu"') == 0
    blocker.join()


def test_request_larger_than_the_memory_budget_is_refused_with_numbers(start_server, rng):
    server = start_server(device_memory_bytes=1 << 20)
    q = rng.standard_normal((SLOW_TOKENS, 8, 64)).astype(np.float32)
    cu = np.array([0, SLOW_TOKENS], np.int32)
    with attnserve.Client(server.target) as client:
        with pytest.raises(attnserve.AttentionError) as error:
            client.forward(q, q, q, cu, cu)
    assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{SLOW_REQUEST_BYTES} bytes of device memory" in error.value.details
    assert f"{1 << 20} in all" in error.value.details
    assert server.metric("attnserve_rejections_total", 'reason="memory"') == 1


def send_with_priority(client, request, priority, finished):
    response = client.stub.Forward(forward_request(*request), timeout=120,
                                   metadata=[("x-attnserve-priority", priority)])
    finished.append(priority)
    return response


def queue_in_order(server, rng, client, priorities, finished):
    """Queues one request per priority, in that order, behind a running blocker. Each computes
    for a while (~0.1 s), so the order they finish in is the order they ran in."""
    threads = []
    for i, priority in enumerate(priorities):
        request = (rng.standard_normal((600, 8, 64)).astype(np.float32),) * 3 + \
            (np.array([0, 600], np.int32),) * 2
        thread = threading.Thread(target=send_with_priority,
                                  args=(client, request, priority, finished))
        thread.start()
        threads.append(thread)
        server.wait_for_metric("attnserve_queue_depth", i + 1, 'device="cpu"')
    return threads


def test_higher_priority_launches_first(start_server, rng):
    server = start_server(cpu_threads=1, priority_aging_ms=600_000)
    blocker = slow_request(server, rng)
    finished = []
    with attnserve.Client(server.target) as client:
        threads = queue_in_order(server, rng, client, ["low", "normal", "high"], finished)
        blocker.join()
        for thread in threads:
            thread.join()
    assert finished == ["high", "normal", "low"]
    for priority, count in (("high", 1), ("normal", 2), ("low", 1)):  # the blocker is normal
        assert server.metric("attnserve_priority_queue_duration_seconds_count",
                             f'priority="{priority}"') == count


def test_waiting_ages_low_priority_so_it_never_starves(start_server, rng):
    # Every millisecond waited lifts a level: the low request, queued first, is already as
    # urgent as the high ones behind it when the blocker finishes, and goes first.
    server = start_server(cpu_threads=1, priority_aging_ms=1)
    blocker = slow_request(server, rng)
    finished = []
    with attnserve.Client(server.target) as client:
        threads = queue_in_order(server, rng, client, ["low", "high", "high"], finished)
        blocker.join()
        for thread in threads:
            thread.join()
    assert finished[0] == "low"


def test_unknown_priority_is_invalid(start_server, rng):
    server = start_server()
    with attnserve.Client(server.target) as client:
        with pytest.raises(grpc.RpcError) as error:
            send_with_priority(client, small_request(rng), "urgent", [])
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-attnserve-priority" in error.value.details()
