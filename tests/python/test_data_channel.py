"""The client's data channel against an in-process server speaking its spec over real sockets
(fake_data_server.py): framing, reassembly of chunks at odd offsets arriving out of order over
several connections, contexts, the async API, and what a broken or dying server does to calls."""
import struct
import threading

import grpc
import numpy as np
import pytest
from ml_dtypes import bfloat16

import attnserve
import fake_data_server as fake
from attnserve import frames, groups
from attnserve.client import target_host
from cases import assert_same_bits as _same
from cases import packed_problem as _inputs
from fake_data_server import FakeDataServer

SMALL_CHUNK = 64 << 10  # the spec's smallest chunk: a few KiB of tensors already take several


def _clients(server, **kwargs):
    fast = attnserve.Client(server.target, timeout=30, chunk_bytes=SMALL_CHUNK, **kwargs)
    slow = attnserve.Client(server.target, timeout=30, transport="grpc")
    return fast, slow


def test_header_layout_is_the_spec_s():
    header = frames.pack_header(frames.CHUNK, request_id=7, offset=1 << 33, length=5)
    assert len(header) == 32
    assert header[:4] == b"ADP1"
    assert struct.unpack("<HHQQQ", header[4:]) == (frames.CHUNK, 0, 7, 1 << 33, 5)
    parsed = frames.parse_header(header)
    assert (parsed.type, parsed.request_id, parsed.offset, parsed.length) == (
        frames.CHUNK, 7, 1 << 33, 5)


@pytest.mark.parametrize("header, problem", [
    (b"ADP2" + bytes(28), "magic"),
    (frames.pack_header(frames.CHUNK)[:6] + b"\x01\x00" + bytes(24), "flags"),
    (frames.pack_header(frames.RESPONSE, 3, 0, frames.MAX_MESSAGE_BYTES + 1), "message limit"),
])
def test_bad_headers_are_named(header, problem):
    with pytest.raises(frames.ProtocolError, match=problem):
        frames.parse_header(header)


@pytest.mark.parametrize("target, host", [
    ("localhost:8001", "localhost"), ("dns:///svc.ns:8001", "svc.ns"),
    ("ipv4:10.0.0.1:8001", "10.0.0.1"), ("[::1]:8001", "::1"), ("myhost", "myhost"),
    ("ipv4:10.0.0.1:8001,10.0.0.2:8001", None), ("unix:/tmp/sock", None)])
def test_target_host(target, host):
    assert target_host(target) == host


@pytest.mark.parametrize("response_first", [False, True], ids=["chunks_first", "response_first"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, bfloat16], ids=["fp32", "fp16", "bf16"])
def test_answers_equal_grpc_s_exactly(rng, dtype, response_first):
    # 4099-byte response chunks cross every tensor boundary at odd offsets, shuffled over four
    # connections; the request's 64 KiB chunks need ACCEPTED and spread over them too.
    with FakeDataServer(response_first=response_first) as server:
        fast, slow = _clients(server)
        with fast, slow:
            assert fast.active_transport() == "data_channel"
            q, k, v, dout, cu = _inputs(rng, dtype=dtype)
            options = dict(causal=True, softcap=3.0)
            forward, reference = (c.forward(q, k, v, cu, cu, **options) for c in (fast, slow))
            _same(forward.out, reference.out)
            _same(forward.lse, reference.lse)
            assert forward.out.flags.writeable
            args = (dout, q, k, v, forward.out, forward.lse, cu, cu)
            backward, reference = (c.backward(*args, **options) for c in (fast, slow))
            for name in ("dq", "dk", "dv"):
                _same(getattr(backward, name), getattr(reference, name))
        assert [r[0] for r in server.requests] == ["forward", "backward"]
        assert server.grpc_calls.count("Forward") == server.grpc_calls.count("Backward") == 1
        assert list(server.connections_per_session.values()) == [4]
    assert not server.violations


def test_small_payloads_go_inline_and_connections_are_capped(rng):
    with FakeDataServer(max_connections=2, shuffle=False) as server:
        fast, slow = _clients(server, data_connections=8)
        with fast, slow:
            q, k, v, _, cu = _inputs(rng, tokens=(3, 5), heads=2, heads_k=2, dim=16)
            _same(fast.forward(q, k, v, cu, cu).out, slow.forward(q, k, v, cu, cu).out)
        assert list(server.connections_per_session.values()) == [2]
    assert not server.violations


@pytest.mark.parametrize("max_inline_bytes", [0, 8 << 20], ids=["old_server", "inline"])
def test_payloads_up_to_max_inline_bytes_skip_accepted(rng, max_inline_bytes):
    # 64 KiB chunks: the request needs several; a server advertising max_inline_bytes takes them
    # right behind the REQUEST, one that does not answers ACCEPTED first.
    with FakeDataServer(max_inline_bytes=max_inline_bytes) as server:
        fast, slow = _clients(server)
        with fast, slow:
            q, k, v, _, cu = _inputs(rng)
            assert 3 * q.nbytes > 64 << 10
            _same(fast.forward(q, k, v, cu, cu).out, slow.forward(q, k, v, cu, cu).out)
        assert server.accepted_sent == (0 if max_inline_bytes else 1)
    assert not server.violations


def test_results_land_in_the_caller_s_arrays(rng):
    with FakeDataServer() as server, attnserve.Client(server.target, timeout=30) as client:
        q, k, v, _, cu = _inputs(rng)
        out = np.full(q.shape, np.nan, np.float32)
        lse = np.full((q.shape[1], q.shape[0]), np.nan, np.float32)
        result = client.forward(q, k, v, cu, cu, out=out, lse=lse)
        assert result.out is out and result.lse is lse and not np.isnan(out).any()
        with pytest.raises(ValueError, match="out"):
            client.forward(q, k, v, cu, cu, out=np.empty((1, 2, 3), np.float32))


def test_context_backward_sends_only_dout(rng):
    with FakeDataServer() as server:
        fast, slow = _clients(server)
        with fast, slow:
            q, k, v, dout, cu = _inputs(rng)
            forward = fast.forward(q, k, v, cu, cu, causal=True, keep_context=True)
            assert forward.context_id and forward.context_address == server.target
            full = slow.backward(dout, q, k, v, forward.out, forward.lse, cu, cu, causal=True)
            # out and lse are never looked at with a context: None proves it.
            backward = fast.backward(dout, q, k, v, None, None, cu, cu, causal=True,
                                     context_id=forward.context_id,
                                     context_address=forward.context_address)
            for name in ("dq", "dk", "dv"):
                _same(getattr(backward, name), getattr(full, name))
        assert server.requests[-1] == ("backward", dout.nbytes, forward.context_id)
        assert not server.contexts  # a backward releases its context
    assert not server.violations


class _Deferred:
    """An input fetched only when asked (np.asarray), as the torch drop-in passes its own."""

    def __init__(self, array):
        self.array, self.shape, self.fetched = array, array.shape, 0

    def __array__(self, dtype=None, copy=None):
        self.fetched += 1
        return self.array


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_lost_context_is_resent_in_full(rng, transport):
    with FakeDataServer(forget_contexts=True) as server, \
            attnserve.Client(server.target, timeout=30, transport=transport) as client:
        q, k, v, dout, cu = _inputs(rng)
        forward = client.forward(q, k, v, cu, cu, keep_context=True)
        inputs = [_Deferred(x) for x in (q, k, v, forward.out, forward.lse)]
        backward = client.backward(dout, *inputs, cu, cu, context_id=forward.context_id)
        expected = client.backward(dout, q, k, v, forward.out, forward.lse, cu, cu)
        _same(backward.dq, expected.dq)
        assert [x.fetched for x in inputs] == [1] * 5
    assert not server.violations


def test_release_context(rng):
    with FakeDataServer() as server, attnserve.Client(server.target, timeout=30) as client:
        q, k, v, _, cu = _inputs(rng)
        context_id = client.forward(q, k, v, cu, cu, keep_context=True).context_id
        assert client.release_context(context_id)
        assert not client.release_context(context_id)
        assert not server.contexts


def test_async_calls_run_at_once_and_match(rng):
    with FakeDataServer() as server:
        fast, slow = _clients(server)
        with fast, slow:
            problems = [_inputs(rng, tokens=(40 + i, 60)) for i in range(6)]
            futures = [fast.forward_async(q, k, v, cu, cu, causal=True)
                       for q, k, v, _, cu in problems]
            for future, (q, k, v, _, cu) in zip(futures, problems):
                _same(future.result(30).out, slow.forward(q, k, v, cu, cu, causal=True).out)
            q, k, v, dout, cu = problems[0]
            result = futures[0].result()
            backward = fast.backward_async(dout, q, k, v, result.out, result.lse, cu, cu,
                                           causal=True)
            assert backward.result(30).dq.shape == q.shape
    assert not server.violations


def test_many_threads_share_one_session(rng):
    with FakeDataServer() as server, attnserve.Client(server.target, timeout=30,
                                                      chunk_bytes=SMALL_CHUNK) as client:
        problems = [_inputs(np.random.default_rng(i)) for i in range(8)]
        expected = [client.forward(q, k, v, cu, cu).out for q, k, v, _, cu in problems]
        errors = []

        def run(index):
            q, k, v, _, cu = problems[index]
            try:
                _same(client.forward(q, k, v, cu, cu).out, expected[index])
            except Exception as error:  # reported below; a thread's assertion is lost otherwise
                errors.append(error)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert len(server.connections_per_session) == 1
    assert not server.violations


def test_server_dying_mid_response_fails_the_call_and_the_next_reopens(rng):
    with FakeDataServer(misbehave=fake.DIE_MID_RESPONSE) as server, \
            attnserve.Client(server.target, timeout=30, retries=0) as client:
        q, k, v, _, cu = _inputs(rng)
        with pytest.raises(attnserve.AttentionError) as error:
            client.forward(q, k, v, cu, cu)
        assert error.value.code == grpc.StatusCode.UNAVAILABLE
        assert "lost" in error.value.details
        server.misbehave = None
        assert client.forward(q, k, v, cu, cu).out.shape == q.shape
        assert len(server.connections_per_session) == 2


def test_unavailable_is_retried_on_a_new_session(rng):
    with FakeDataServer(misbehave=fake.DIE_MID_RESPONSE) as server, \
            attnserve.Client(server.target, timeout=30, retries=1) as client:
        q, k, v, _, cu = _inputs(rng)
        # The fake dies on every call, so both attempts fail; each opened its own session.
        with pytest.raises(attnserve.AttentionError):
            client.forward(q, k, v, cu, cu)
        assert len(server.connections_per_session) == 2


@pytest.mark.parametrize("misbehave, message", [
    (fake.BAD_MAGIC, "bad frame magic"),
    (fake.CHUNK_OUT_OF_RANGE, "runs past the response"),
    (fake.CHUNK_TWICE, "overlaps bytes already received"),
    (fake.UNKNOWN_REQUEST, "unknown request"),
    (fake.WRONG_SHAPE, "out: the server answered shape"),
])
def test_bad_frames_fail_the_call_with_the_problem_named(rng, misbehave, message):
    with FakeDataServer(misbehave=misbehave, shuffle=False) as server, \
            attnserve.Client(server.target, timeout=30, retries=0) as client:
        q, k, v, _, cu = _inputs(rng)
        with pytest.raises(attnserve.AttentionError, match=message) as error:
            client.forward(q, k, v, cu, cu)
        assert error.value.code == grpc.StatusCode.INTERNAL


def test_the_token_goes_in_the_hello(rng):
    q, k, v, _, cu = _inputs(rng, tokens=(4,), heads=2, dim=16)
    with FakeDataServer(token="sesame") as server:
        with attnserve.Client(server.target, timeout=30, token="sesame") as client:
            assert client.forward(q, k, v, cu, cu).out.shape == q.shape
        with attnserve.Client(server.target, timeout=30, token="wrong", retries=0) as client:
            with pytest.raises(attnserve.AttentionError) as error:
                client.forward(q, k, v, cu, cu)
        assert error.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_malformed_shapes_go_to_grpc_which_names_them(rng):
    with FakeDataServer() as server, attnserve.Client(server.target, timeout=30) as client:
        q = rng.standard_normal((8, 16)).astype(np.float32)
        with pytest.raises(Exception):
            client.forward(q, q, q, [0, 8], [0, 8])
        assert server.grpc_calls[-1] == "Forward" and not server.requests


def test_group_split_is_the_server_s():
    # The rule of GroupEnds (server/transport/data/group_tracker.cc): up to 4 runs of
    # consecutive sequences of about equal q + k tokens, for payloads of 16 MiB and more.
    cu = [0, 100, 200, 300, 400, 500, 600, 700, 800]
    assert groups.group_ends(cu, cu, 32 << 20) == [2, 4, 6, 8]
    assert groups.group_ends(cu, cu, (16 << 20) - 1) == []
    assert groups.group_ends([0, 800], [0, 800], 32 << 20) == []
    # A long first sequence takes the first groups' share: fewer, uneven groups.
    assert groups.group_ends([0, 700, 710, 800], [0, 700, 710, 800], 32 << 20) == [1, 3]


def test_chunk_order_sends_group_by_group():
    mib = 1 << 20
    cu = [0, 10, 20, 30, 40]
    row = mib // 4  # each tensor 10 MiB, each sequence 2.5 MiB of it; 1 MiB chunks
    tensors = [(40 * row, rows) for rows in groups.FORWARD_ROWS]
    offsets = [o // mib for o in groups.chunk_offsets(cu, cu, tensors, 30 * mib, mib)]
    assert sorted(offsets) == list(range(30))
    # Group g is sequence g: its q, k and v chunks, less those an earlier group sent.
    assert offsets[:9] == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert offsets[9:15] == [3, 4, 13, 14, 23, 24]
    # One sequence: payload order.
    assert groups.chunk_offsets([0, 40], [0, 40], tensors, 30 * mib, mib) == \
        [c * mib for c in range(30)]


def test_a_backward_s_chunks_go_by_group_with_all_of_lse_in_the_first():
    mib = 1 << 20
    cu = [0, 10, 20, 30, 40]
    row = mib // 4  # dout, q, k, v, out 10 MiB each; lse 2 MiB at the end; 1 MiB chunks
    tensors = [(40 * row, rows) for rows in groups.BACKWARD_ROWS[:5]]
    tensors.append((2 * mib, groups.ALL_WITH_FIRST))
    offsets = [o // mib for o in groups.chunk_offsets(cu, cu, tensors, 52 * mib, mib)]
    assert sorted(offsets) == list(range(52))
    # Group 0: the first 2.5 MiB of each of dout, q, k, v, out, then every chunk of lse.
    assert offsets[:17] == [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42, 50, 51]


@pytest.mark.parametrize("group_chunks", [True, False])
def test_large_forward_chunks_go_in_group_order(rng, group_chunks):
    tokens = (1024, 1024, 1024, 1024)
    q, k, v, _, cu = _inputs(rng, tokens=tokens, heads=8, heads_k=8, dim=64)  # 24 MiB
    with FakeDataServer(max_connections=1) as server, \
            attnserve.Client(server.target, timeout=30, chunk_bytes=1 << 20, data_connections=1,
                             group_chunks=group_chunks) as client:
        client.forward(q, k, v, cu, cu)
        order = server.chunk_orders[0]
    assert sorted(order) == [c << 20 for c in range(24)]
    if group_chunks:
        # 2 MiB of q, k and v per group of 1024 tokens: group 0 is chunks 0-1, 8-9, 16-17.
        assert [o >> 20 for o in order[:6]] == [0, 1, 8, 9, 16, 17]
    else:
        assert order == sorted(order)
    assert not server.violations
