"""Overlap on the data channel against the real server (CPU reference): a large multi-sequence
forward runs by groups of sequences as they arrive, and each group's out rows come back before
the rest of the request has been sent. A raw protocol client sends only group 0's chunks and
waits for group 0's out rows, which arrive only if the server streams them (no timing involved);
results equal gRPC's bitwise; a client that leaves mid-way leaves nothing behind."""
import os
import time

import numpy as np
import pytest

import attnserve
from attnserve import frames, groups
from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from attnserve._proto.attnserve.v1 import data_channel_pb2 as dc_pb2
from attnserve.data_channel import _connect
from server_process import CALL_TIMEOUT_S

CHUNK = 1 << 20
SEQLENS = (352, 352, 352, 352)  # q, k, v of 8 heads x 128 fp32: 17 MiB, 4 groups of one sequence
HEADS, DIM = 8, 128


@pytest.fixture(scope="module")
def grpc_client(server):
    with attnserve.Client(server.target, timeout=CALL_TIMEOUT_S, transport="grpc") as client:
        if not client.server_info().HasField("data_channel"):
            pytest.skip("the server advertises no data channel")
        yield client


def _problem(rng):
    cu = np.array([0, *np.cumsum(SEQLENS)], np.int32)
    q, k, v = (rng.standard_normal((int(cu[-1]), HEADS, DIM)).astype(np.float32)
               for _ in range(3))
    return q, k, v, cu


class _RawCall:
    """One grouped forward over one raw connection, sent chunk by chunk as the test says."""

    def __init__(self, server, grpc_client, q, k, v, cu):
        port = grpc_client.server_info().data_channel.port
        self.sock, _ = _connect("127.0.0.1", port, os.urandom(16), None, 10, None)
        self.sock.settimeout(CALL_TIMEOUT_S)
        self.payload = b"".join(bytes(memoryview(a).cast("B")) for a in (q, k, v))
        shape = lambda a: pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=a.shape)  # noqa: E731
        forward = pb2.ForwardRequest(q=shape(q), k=shape(k), v=shape(v), cu_seqlens_q=cu,
                                     cu_seqlens_k=cu)
        request = dc_pb2.DataRequest(forward=forward, payload_bytes=len(self.payload),
                                     chunk_bytes=CHUNK)
        frames.send_views(self.sock, [frames.message_frame(frames.REQUEST, request, 1)])
        header = frames.recv_header(self.sock)
        assert header.type == frames.ACCEPTED, header.name()
        frames.recv_message(self.sock, header, dc_pb2.DataAccepted)
        self.ends = groups.group_ends(cu, cu, len(self.payload))
        assert len(self.ends) == 4
        self.out = np.zeros_like(q)
        self.lse = np.zeros((HEADS, int(cu[-1])), np.float32)
        self.received = bytearray(self.out.nbytes + self.lse.nbytes)
        self.got = 0
        self.response = None
        row = q.nbytes // q.shape[0]
        # Group 0's chunks: those overlapping its rows of q, k and v.
        self.group0 = sorted({c for t in range(3) for c in range(
            t * q.nbytes // CHUNK, (t * q.nbytes + int(cu[self.ends[0]]) * row - 1) // CHUNK + 1)})
        self.group0_out_bytes = int(cu[self.ends[0]]) * row

    def send(self, chunks):
        for c in chunks:
            data = self.payload[c * CHUNK:(c + 1) * CHUNK]
            frames.send_views(self.sock, [frames.pack_header(frames.CHUNK, 1, c * CHUNK,
                                                             len(data)), data])

    def receive_until(self, done):
        while not done():
            header = frames.recv_header(self.sock)
            if header.type == frames.RESPONSE:
                self.response = frames.recv_message(self.sock, header, dc_pb2.DataResponse)
                assert self.response.code == 0, self.response.message
                continue
            assert header.type == frames.CHUNK, header.name()
            view = memoryview(self.received)[header.offset:header.offset + header.length]
            frames.recv_into_exactly(self.sock, view)
            self.got += header.length

    def group0_in(self):
        return self.got >= self.group0_out_bytes


def test_group_0_comes_back_before_the_rest_is_sent(server, grpc_client, rng):
    overlap_before = server.metric("attnserve_data_overlap_seconds_sum")
    q, k, v, cu = _problem(rng)
    call = _RawCall(server, grpc_client, q, k, v, cu)
    try:
        call.send(call.group0)
        call.receive_until(call.group0_in)
        assert call.response is None  # the RESPONSE waits for every group
        call.send(c for c in range(-(-len(call.payload) // CHUNK)) if c not in call.group0)
        call.receive_until(lambda: call.response is not None and call.got == len(call.received))
    finally:
        call.sock.close()
    expected = grpc_client.forward(q, k, v, cu, cu)
    out = np.frombuffer(call.received, np.float32, q.size).reshape(q.shape)
    lse = np.frombuffer(call.received, np.float32, offset=q.nbytes).reshape(expected.lse.shape)
    np.testing.assert_array_equal(out.view(np.uint32), expected.out.view(np.uint32))
    np.testing.assert_array_equal(lse.view(np.uint32), expected.lse.view(np.uint32))
    # The engine had the call while groups 1..3 were still to be sent.
    assert server.metric("attnserve_data_overlap_seconds_sum") > overlap_before


def _wait_for(server, name, value, timeout=30.0):
    deadline = time.monotonic() + timeout
    while server.metric(name) != value:
        if time.monotonic() > deadline:
            pytest.fail(f"{name} stayed at {server.metric(name)}, expected {value}")
        time.sleep(0.05)


def test_a_client_leaving_mid_call_leaves_nothing_behind(server, grpc_client, rng):
    # The server is shared with other modules, whose cached clients may keep sessions open.
    sessions_before = server.metric("attnserve_data_sessions")
    q, k, v, cu = _problem(rng)
    call = _RawCall(server, grpc_client, q, k, v, cu)
    call.send(call.group0)
    call.receive_until(call.group0_in)
    call.sock.close()  # groups 1..3 never arrive
    _wait_for(server, "attnserve_data_sessions", sessions_before)
    _wait_for(server, "attnserve_data_buffered_bytes", 0)


@pytest.mark.parametrize("group_chunks", [True, False])
def test_grouped_forward_and_context_backward_equal_grpc(server, grpc_client, rng, group_chunks):
    q, k, v, cu = _problem(rng)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    with attnserve.Client(server.target, timeout=CALL_TIMEOUT_S, chunk_bytes=CHUNK,
                          group_chunks=group_chunks) as fast:
        forward = fast.forward(q, k, v, cu, cu, causal=True, keep_context=True)
        expected = grpc_client.forward(q, k, v, cu, cu, causal=True)
        np.testing.assert_array_equal(forward.out.view(np.uint32), expected.out.view(np.uint32))
        np.testing.assert_array_equal(forward.lse.view(np.uint32), expected.lse.view(np.uint32))
        args = (dout, q, k, v, expected.out, expected.lse, cu, cu)
        want = grpc_client.backward(*args, causal=True, deterministic=True)
        results = [fast.backward(*args, causal=True, deterministic=True)]
        if forward.context_id:
            results.append(fast.backward(*args, causal=True, deterministic=True,
                                         context_id=forward.context_id))
        for got in results:
            for name in ("dq", "dk", "dv"):
                np.testing.assert_array_equal(getattr(got, name).view(np.uint32),
                                              getattr(want, name).view(np.uint32))
