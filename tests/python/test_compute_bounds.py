"""A request's compute is bounded and cancellable (issue 19 item 6): a request with a 1 s
deadline used to hold the CPU device for ~19 s and the calls behind it missed their
deadlines, and at the default token limit a 12 MB request would have run for hours. Requests
estimated to run longer than --max_request_compute_seconds on the device they would run on are
refused at admission; a running request stops when its deadline passes or its caller leaves.
A backward too long for one launch (--max_launch_seconds) runs on the CPU device as several,
down to blocks of one long sequence's query rows, and stops between them."""
import time

import grpc
import numpy as np
import pytest

from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from attnserve._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc
from server_process import run_server

CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", 64 << 20)]
# One CPU thread: 4096 tokens x 8 heads x head_dim 64 is 34 GFLOP and 1.3e8 scores, several
# seconds of work on any machine but well under the default compute limit (about 9 s
# estimated); the short request takes milliseconds.
SLOW_TOKENS, SHORT_TOKENS, HEADS = 4096, 16, 8


def request(tokens, heads=HEADS, head_dim=64):
    data = np.random.default_rng(0).standard_normal((tokens, heads, head_dim)).astype(np.float32)
    tensor = pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=data.shape, data=data.tobytes())
    return pb2.ForwardRequest(q=tensor, k=tensor, v=tensor, cu_seqlens_q=[0, tokens],
                              cu_seqlens_k=[0, tokens])


@pytest.fixture
def serial_server():
    yield from run_server({"cpu_threads": 1, "batching": "false", "max_total_tokens": 8192,
                           "max_message_bytes": 64 << 20})


@pytest.fixture
def sliced_server():
    yield from run_server({"cpu_threads": 1, "batching": "false", "max_total_tokens": 8192,
                           "max_message_bytes": 64 << 20, "max_launch_seconds": 0.05})


@pytest.fixture
def default_server():
    yield from run_server({})


@pytest.fixture
def one_thread_server():
    yield from run_server({"cpu_threads": 1})


def expect_refused_for_compute(server, req, limit="30"):
    with grpc.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
        attention = pb2_grpc.AttentionServiceStub(channel)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            attention.Forward(req, timeout=20)
        seconds = time.monotonic() - start
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
    details = refused.value.details()
    assert details.startswith("the request's estimated compute time, "), details
    assert f"exceeds the server's limit max_request_compute_seconds = {limit}" in details
    assert seconds < 5.0  # refused before any work, not after hours of it
    server.wait_for_metric("attnserve_requests_total", 1,
                           'code="RESOURCE_EXHAUSTED",rpc="Forward"')
    assert server.metric("attnserve_rejections_total", 'reason="compute"') == 1
    return details


def test_a_request_that_would_run_for_hours_is_refused_at_default_settings(default_server):
    # The default token limit's worst case: 2^20 tokens in one sequence at head_dim 1 (12 MB).
    details = expect_refused_for_compute(default_server, request(1 << 20, heads=1, head_dim=1))
    assert "(1.1e+12 attention scores, 4.4e+12 FLOPs)" in details


def test_the_reported_request_is_refused_on_one_cpu_thread(one_thread_server):
    # The 393 KB request, one 32,768-token sequence at head_dim 1: ~36 s on one thread.
    details = expect_refused_for_compute(one_thread_server, request(32768, heads=1, head_dim=1))
    assert " on cpu (1.07e+09 attention scores, 4.29e+09 FLOPs)" in details


@pytest.mark.parametrize("leave", ["deadline", "cancel"])
def test_a_running_request_stops_when_its_caller_is_gone(serial_server, leave):
    with grpc.insecure_channel(serial_server.target, options=CHANNEL_OPTIONS) as channel:
        attention = pb2_grpc.AttentionServiceStub(channel)
        attention.Forward(request(SHORT_TOKENS), timeout=10)  # connected, and warm
        if leave == "deadline":
            with pytest.raises(grpc.RpcError) as expired:
                attention.Forward(request(SLOW_TOKENS), timeout=1)
            assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            slow = attention.Forward.future(request(SLOW_TOKENS), timeout=60)
            serial_server.wait_for_metric("attnserve_inflight_requests", 1, timeout=10)
            time.sleep(0.5)  # running on the device, not just queued
            slow.cancel()
        # The next requests meet short deadlines: the slow one stopped within about a second
        # of its deadline or cancellation (behind one that ran to its end they waited seconds).
        start = time.monotonic()
        for _ in range(3):
            short = attention.Forward(request(SHORT_TOKENS), timeout=2)
            assert short.out.shape[:] == [SHORT_TOKENS, HEADS, 64]
        assert time.monotonic() - start < 1.0
    serial_server.wait_for_metric(
        "attnserve_requests_total", 1,
        ['code="DEADLINE_EXCEEDED",rpc="Forward"', 'code="CANCELLED",rpc="Forward"'])


def long_backward(tokens, heads=HEADS, head_dim=64):
    """One sequence's backward; its out and lse need not come from a forward to cost the same
    (an lse of 50 keeps every probability finite)."""
    rng = np.random.default_rng(1)
    data = lambda: pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=(tokens, heads, head_dim),
                              data=rng.standard_normal((tokens, heads, head_dim))
                              .astype(np.float32).tobytes())
    lse = np.full((heads, tokens), 50.0, np.float32)
    return pb2.BackwardRequest(dout=data(), q=data(), k=data(), v=data(), out=data(),
                               lse=pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=lse.shape,
                                              data=lse.tobytes()),
                               cu_seqlens_q=[0, tokens], cu_seqlens_k=[0, tokens])


# Sized by the CPU kernels' speed: a row block takes ~0.25 s uninstrumented, and under TSan
# (~10x slower) the short calls behind it missed their 2 s deadlines in CI.
@pytest.mark.compute_timed
def test_a_long_single_sequence_backward_stops_between_row_blocks(sliced_server):
    # 3072 tokens x 8 heads x head_dim 64 backward on one thread: seconds of work, cut into
    # blocks of 768 query rows (each over the 0.05 s slice, so one launch each).
    with grpc.insecure_channel(sliced_server.target, options=CHANNEL_OPTIONS) as channel:
        attention = pb2_grpc.AttentionServiceStub(channel)
        attention.Forward(request(SHORT_TOKENS), timeout=10)  # connected, and warm
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as expired:
            attention.Backward(long_backward(3072), timeout=1)
        assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # It ran as row blocks on the CPU device: 3072 rows are 4 blocks of 768.
        sliced_server.wait_for_metric("attnserve_split_requests_total", 1, 'device="cpu"')
        assert sliced_server.metric("attnserve_split_launches_total", 'device="cpu"') == 4
        # The device is free again within about a slice (a block) of the deadline.
        for _ in range(3):
            short = attention.Forward(request(SHORT_TOKENS), timeout=2)
            assert short.out.shape[:] == [SHORT_TOKENS, HEADS, 64]
        assert time.monotonic() - start < 3.0
    sliced_server.wait_for_metric("attnserve_requests_total", 1,
                                  'code="DEADLINE_EXCEEDED",rpc="Backward"')
