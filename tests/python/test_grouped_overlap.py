"""Overlap on the data channel against the real server (CPU reference): a large multi-sequence
forward or backward runs by groups of sequences as they arrive, and each group's output rows
come back before the rest of the request has been sent. A raw protocol client sends only group
0's chunks and waits for group 0's out (dq, dk, dv) rows, which arrive only if the server streams
them (no timing involved); results equal gRPC's bitwise; a client that leaves mid-way leaves
nothing behind."""
import os
import time

import numpy as np
import pytest

import attnserve
from attnserve import frames, groups, reference
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


def _shape(a):
    return pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=a.shape)


def _chunks(begin, end):
    return set(range(begin // CHUNK, (end - 1) // CHUNK + 1)) if end > begin else set()


class _RawCall:
    """One grouped call over one raw connection, sent chunk by chunk as the test says.
    `tensors`: the payload's arrays in field order; `group0_rows`: for each, the bytes of group
    0's rows from its start (None: all of it goes with group 0, as a backward's lse)."""

    def __init__(self, grpc_client, kind, message, tensors, group0_rows, group0_out_bytes):
        port = grpc_client.server_info().data_channel.port
        self.sock, _ = _connect("127.0.0.1", port, os.urandom(16), None, 10, None)
        self.sock.settimeout(CALL_TIMEOUT_S)
        self.payload = b"".join(bytes(memoryview(a).cast("B")) for a in tensors)
        request = dc_pb2.DataRequest(payload_bytes=len(self.payload), chunk_bytes=CHUNK)
        getattr(request, kind).CopyFrom(message)
        frames.send_views(self.sock, [frames.message_frame(frames.REQUEST, request, 1)])
        header = frames.recv_header(self.sock)
        assert header.type == frames.ACCEPTED, header.name()
        frames.recv_message(self.sock, header, dc_pb2.DataAccepted)
        self.received = None
        self.got = 0
        self.response = None
        # Group 0's chunks: those overlapping its rows of each tensor (all of lse).
        self.group0, start = set(), 0
        for array, rows in zip(tensors, group0_rows):
            self.group0 |= _chunks(start, start + (array.nbytes if rows is None else rows))
            start += array.nbytes
        self.group0 = sorted(self.group0)
        self.group0_out_bytes = group0_out_bytes

    def send(self, chunks):
        for c in chunks:
            data = self.payload[c * CHUNK:(c + 1) * CHUNK]
            frames.send_views(self.sock, [frames.pack_header(frames.CHUNK, 1, c * CHUNK,
                                                             len(data)), data])

    def send_the_rest(self):
        self.send(c for c in range(-(-len(self.payload) // CHUNK)) if c not in self.group0)

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

    def all_in(self):
        return self.response is not None and self.got == len(self.received)

    def run_group0_first(self, output_bytes):
        """Sends group 0, receives its output rows (only if the server streams them before
        it has the rest: no timing involved), then the rest; returns the response's bytes."""
        self.received = bytearray(output_bytes)
        try:
            self.send(self.group0)
            self.receive_until(self.group0_in)
            assert self.response is None  # the RESPONSE waits for every group
            self.send_the_rest()
            self.receive_until(self.all_in)
        finally:
            self.sock.close()
        return self.received


def _forward_call(grpc_client, q, k, v, cu):
    forward = pb2.ForwardRequest(q=_shape(q), k=_shape(k), v=_shape(v), cu_seqlens_q=cu,
                                 cu_seqlens_k=cu)
    ends = groups.group_ends(cu, cu, 3 * q.nbytes)
    assert len(ends) == 4
    row = q.nbytes // q.shape[0]
    rows0 = int(cu[ends[0]]) * row
    return _RawCall(grpc_client, "forward", forward, (q, k, v), (rows0,) * 3, rows0)


def _same_bits(got, want):
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_group_0_comes_back_before_the_rest_is_sent(server, grpc_client, rng):
    overlap_before = server.metric("attnserve_data_overlap_seconds_sum")
    q, k, v, cu = _problem(rng)
    call = _forward_call(grpc_client, q, k, v, cu)
    received = call.run_group0_first(q.nbytes + 4 * HEADS * q.shape[0])
    expected = grpc_client.forward(q, k, v, cu, cu)
    out = np.frombuffer(received, np.float32, q.size).reshape(q.shape)
    lse = np.frombuffer(received, np.float32, offset=q.nbytes).reshape(expected.lse.shape)
    _same_bits(out, expected.out)
    _same_bits(lse, expected.lse)
    # The engine had the call while groups 1..3 were still to be sent.
    assert server.metric("attnserve_data_overlap_seconds_sum") > overlap_before


def _gradients(received, q):
    return [np.frombuffer(received, np.float32, q.size, offset=i * q.nbytes).reshape(q.shape)
            for i in range(3)]


def test_a_backward_s_group_0_gradients_come_back_before_the_rest_is_sent(server, grpc_client,
                                                                          rng):
    q, k, v, cu = _problem(rng)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    forward = grpc_client.forward(q, k, v, cu, cu, causal=True)
    tensors = (dout, q, k, v, forward.out, forward.lse)
    backward = pb2.BackwardRequest(**{name: _shape(a) for name, a in zip(
        ("dout", "q", "k", "v", "out", "lse"), tensors)}, cu_seqlens_q=cu, cu_seqlens_k=cu,
        options=pb2.AttentionOptions(causal=True))
    ends = groups.group_ends(cu, cu, sum(a.nbytes for a in tensors))
    assert len(ends) == 4
    rows0 = int(cu[ends[0]]) * (q.nbytes // q.shape[0])
    call = _RawCall(grpc_client, "backward", backward, tensors, (rows0,) * 5 + (None,),
                    3 * rows0)  # group 0's rows of dq, dk and dv
    received = call.run_group0_first(3 * q.nbytes)
    want = grpc_client.backward(dout, q, k, v, forward.out, forward.lse, cu, cu, causal=True)
    for got, name in zip(_gradients(received, q), ("dq", "dk", "dv")):
        _same_bits(got, getattr(want, name))


# A context backward sends dout alone: 4096 tokens (the test server's limit) of 8 heads x 128
# fp32 make it just large enough to be grouped (16 MiB), in short sequences to keep it quick.
CONTEXT_SEQLENS = (128,) * 32
CONTEXT_HEADS = 8


def test_a_context_backward_s_group_0_gradients_come_back_before_the_rest_of_dout(
        server, grpc_client, rng):
    cu = np.array([0, *np.cumsum(CONTEXT_SEQLENS)], np.int32)
    q, k, v, dout = (rng.standard_normal((int(cu[-1]), CONTEXT_HEADS, DIM)).astype(np.float32)
                     for _ in range(4))
    assert groups.group_ends(cu, cu, dout.nbytes)
    with attnserve.Client(server.target, timeout=CALL_TIMEOUT_S, chunk_bytes=CHUNK) as fast:
        forward = fast.forward(q, k, v, cu, cu, keep_context=True)
    assert forward.context_id
    backward = pb2.BackwardRequest(dout=_shape(dout), cu_seqlens_q=cu, cu_seqlens_k=cu,
                                   context_id=forward.context_id)
    ends = groups.group_ends(cu, cu, dout.nbytes)
    rows0 = int(cu[ends[0]]) * (q.nbytes // q.shape[0])
    # Group 0's dq, dk and dv rows (dk and dv in buffers shaped by the context's k).
    call = _RawCall(grpc_client, "backward", backward, (dout,), (rows0,), 3 * rows0)
    received = call.run_group0_first(3 * q.nbytes)
    # Against the float64 reference: a full backward this large exceeds a gRPC message.
    want = reference.attention_backward(dout, q, k, v, forward.out, forward.lse, cu, cu)
    for got, expected in zip(_gradients(received, q), want):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


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
    call = _forward_call(grpc_client, q, k, v, cu)
    call.received = bytearray(q.nbytes + 4 * HEADS * q.shape[0])
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
