"""A running request stops when its deadline passes or its caller leaves (issue 19 item 6): a
request with a 1 s deadline used to hold the CPU device for ~19 s, and the calls behind it
missed their deadlines."""
import time

import grpc
import numpy as np
import pytest

from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from attnserve._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc
from server_process import run_server

CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 << 20),
                   ("grpc.max_receive_message_length", 64 << 20)]
# One CPU thread: 8192 tokens x 8 heads x head_dim 64 is 137 GFLOP, many seconds of work on
# any machine; the short request takes milliseconds.
SLOW_TOKENS, SHORT_TOKENS, HEADS = 8192, 16, 8


def request(tokens):
    data = np.random.default_rng(0).standard_normal((tokens, HEADS, 64)).astype(np.float32)
    tensor = pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=data.shape, data=data.tobytes())
    return pb2.ForwardRequest(q=tensor, k=tensor, v=tensor, cu_seqlens_q=[0, tokens],
                              cu_seqlens_k=[0, tokens])


@pytest.fixture
def serial_server():
    yield from run_server({"cpu_threads": 1, "batching": "false", "max_total_tokens": 8192,
                           "max_message_bytes": 64 << 20})


@pytest.mark.parametrize("leave", ["deadline", "cancel"])
def test_a_running_request_stops_when_its_caller_is_gone(serial_server, leave):
    with grpc.insecure_channel(serial_server.target, options=CHANNEL_OPTIONS) as channel:
        attention = pb2_grpc.AttentionServiceStub(channel)
        if leave == "deadline":
            with pytest.raises(grpc.RpcError) as expired:
                attention.Forward(request(SLOW_TOKENS), timeout=1)
            assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            slow = attention.Forward.future(request(SLOW_TOKENS), timeout=60)
            serial_server.wait_for_metric("attnserve_inflight_requests", 1, timeout=10)
            time.sleep(0.5)  # running on the device, not just queued
            slow.cancel()
        start = time.monotonic()
        short = attention.Forward(request(SHORT_TOKENS), timeout=60)
        assert short.out.shape[:] == [SHORT_TOKENS, HEADS, 64]
        # Behind a request that ran to its end this waited many seconds.
        assert time.monotonic() - start < 3.0
    serial_server.wait_for_metric(
        "attnserve_requests_total", 1,
        ['code="DEADLINE_EXCEEDED",rpc="Forward"', 'code="CANCELLED",rpc="Forward"'])
