"""Attacks on the gRPC port by clients without a token (issue 19): what each used to cost the
server, scaled down to what CI runs, must now be refused or bounded."""
import resource
import socket
import time

import grpc
import numpy as np
import pytest

from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from attnserve._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc
from raw_http2 import start_unread_call
from server_process import MAIN_LIMITS, run_server

CHANNEL_OPTIONS = [("grpc.max_send_message_length", 1 << 30)]


def rss_bytes(server):
    with open(f"/proc/{server.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_compressed_message_is_refused_without_inflating_it(server):
    # 32 MiB of zeros gzip to about 32 KiB. gRPC 1.51 inflated such a message before the size
    # limit and before the handler (so before authentication): 261 KB became 256 MiB.
    zeros = pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=[8 << 20], data=bytes(32 << 20))
    before = rss_bytes(server)
    with grpc.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
        attention = pb2_grpc.AttentionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            attention.Forward(pb2.ForwardRequest(q=zeros), timeout=30,
                              compression=grpc.Compression.Gzip)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, refused.value.details()
        assert "gzip" in refused.value.details()
        # Uncompressed calls on the same channel still work.
        assert attention.GetServerInfo(pb2.GetServerInfoRequest(), timeout=30).version
    assert rss_bytes(server) - before < 16 << 20


def descriptor_limit(soft, hard):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_and_close_connections(server, count):
    """What the attack did: more connections than the server has descriptors, then gone."""
    sockets = []
    for _ in range(count):
        sockets.append(socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5))
    time.sleep(0.5)  # let gRPC accept what it can
    for s in sockets:
        s.close()


def server_info(server):
    with grpc.insecure_channel(server.target) as channel:
        return pb2_grpc.AttentionServiceStub(channel).GetServerInfo(
            pb2.GetServerInfoRequest(), timeout=10)


@pytest.fixture
def server_started_at_256_descriptors(request):
    hard = request.param
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < hard:
        pytest.skip(f"this machine's hard descriptor limit is below {hard}")
    yield from run_server({**MAIN_LIMITS, "data_port": 0}, descriptor_limit(256, hard))


@pytest.mark.parametrize("server_started_at_256_descriptors", [4096], indirect=True)
def test_the_server_raises_its_descriptor_limit_and_keeps_accepting(
        server_started_at_256_descriptors):
    # Started with `ulimit -n 256` under a hard limit of 4096: 300 connections used to stop
    # the gRPC listener for good (gRPC 1.51 gives up after accept4 fails with EMFILE).
    server = server_started_at_256_descriptors
    assert "file descriptor limit 4096 (raised from 256)" in server.log()
    open_and_close_connections(server, 300)
    assert server_info(server).version
    assert server.http_status("/healthz") == 200


@pytest.mark.parametrize("server_started_at_256_descriptors", [256], indirect=True)
def test_a_listener_stopped_by_descriptor_exhaustion_fails_the_liveness_probe(
        server_started_at_256_descriptors):
    # No headroom to raise into: the listener still dies, but /healthz says so (503 and why),
    # so the orchestrator restarts the process instead of probing a port that accepts nothing.
    server = server_started_at_256_descriptors
    assert "WARNING" in server.log()
    open_and_close_connections(server, 300)
    deadline = time.monotonic() + 10
    while server.http_status("/healthz") != 503:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    assert server.http_status("/readyz") == 503


def test_a_dozen_silent_http_connections_leave_the_liveness_probe_answered(server):
    # With 4 HTTP threads each held 5 s by a connection that sends nothing, twelve such
    # connections kept /healthz (the liveness probe) waiting past its 2 s timeout.
    silent = [socket.create_connection(("127.0.0.1", server.http_port), timeout=5)
              for _ in range(12)]
    try:
        time.sleep(0.2)  # the server has handed them to its threads
        start = time.monotonic()
        assert server.http_status("/healthz") == 200
        assert time.monotonic() - start < 1.0
    finally:
        for s in silent:
            s.close()


def forward_request(tokens=16):
    data = np.random.default_rng(0).standard_normal((tokens, 2, 16)).astype(np.float32)
    tensor = pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=data.shape, data=data.tobytes())
    return pb2.ForwardRequest(q=tensor, k=tensor, v=tensor, cu_seqlens_q=[0, tokens],
                              cu_seqlens_k=[0, tokens])


@pytest.fixture
def one_slot_server():
    yield from run_server({**MAIN_LIMITS, "max_concurrent_requests": 1,
                           "grpc_answer_timeout_seconds": 2})


def test_an_answer_the_client_never_reads_holds_its_slot_until_the_timeout(one_slot_server):
    # Answers not yet written used to count as finished: 32 calls whose clients never read
    # held 2.6 GB, unbounded by --max_concurrent_requests.
    server = one_slot_server
    unread = start_unread_call(server.grpc_port, "/attnserve.v1.AttentionService/Forward",
                               forward_request().SerializeToString())
    try:
        server.wait_for_metric("attnserve_requests_total", 1, 'code="OK",rpc="Forward"')
        with grpc.insecure_channel(server.target) as channel:
            attention = pb2_grpc.AttentionServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                attention.Forward(forward_request(), timeout=30)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_concurrent_requests" in refused.value.details()
            # Past --grpc_answer_timeout_seconds the unread call is cancelled, its slot free.
            deadline = time.monotonic() + 20
            while True:
                try:
                    attention.Forward(forward_request(), timeout=30)
                    break
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert time.monotonic() < deadline, "the unread call never let go"
                    time.sleep(0.2)
    finally:
        unread.close()
