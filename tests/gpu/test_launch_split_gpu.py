"""Long GPU requests run as several launches (server/engine/launch_split.h) on the GPU machine:
scripts/gpu_e2e.sh starts a server with --max_launch_seconds=0.002 and one CUDA lane, so
requests of a few milliseconds are cut (groups of whole sequences; a forward's long sequence by
blocks of query rows), beside the native server, whose default slice (0.25 s) runs the same
requests as one launch each. The answers must match: bitwise by sequence groups (sequences are
independent) and for a deterministic backward; blocks of query rows start at multiples of every
kernel's query tile, so a forward's are expected bitwise too (a separate test says whether they
are). A backward's long sequence runs by the same blocks, its dk and dv summed over them in
float32 after each block's partial was rounded to fp16: close to one launch's, not bitwise.
A forward over the data channel, which arrives group by group, is cut within its groups, and
requests whose tensors lie in CUDA shared memory (the split server has --allow_shared_memory)
are cut the same way, reading at offsets into the client's device memory.
A request far longer than its deadline stops between launches: the request queued behind it on
the one lane runs at once instead of waiting for the rest of it. Skipped without the servers."""
import os
import re
import time
import urllib.request
import uuid

import grpc
import numpy as np
import pytest

import attnserve
from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from attnserve._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc

WHOLE = os.environ.get("ATTNSERVE_GPU_TARGET")
SPLIT = os.environ.get("ATTNSERVE_GPU_SPLIT_TARGET")
SPLIT_HTTP = os.environ.get("ATTNSERVE_GPU_SPLIT_HTTP")
WHOLE_HTTP = os.environ.get("ATTNSERVE_GPU_HTTP")
pytestmark = pytest.mark.skipif(not WHOLE or not SPLIT or not SPLIT_HTTP,
                                reason="needs gpu_e2e.sh's native and split GPU servers")
SLICE_SECONDS = 0.002  # gpu_e2e.sh: --max_launch_seconds=0.002
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 1 << 30),
                   ("grpc.max_receive_message_length", 1 << 30), ("grpc.enable_retries", 0)]


def split_launches(http):
    if not http:
        return 0.0
    text = urllib.request.urlopen(http + "/metrics", timeout=10).read().decode()
    match = re.search(r'^attnserve_split_launches_total\{device="cuda:0"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def tensor(a):
    return pb2.Tensor(dtype=pb2.DTYPE_FLOAT16, shape=a.shape, data=a.tobytes())


def lse_tensor(a):
    return pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=a.shape, data=a.tobytes())


def attention_options(causal, window):
    options = pb2.AttentionOptions(causal=causal)
    if window[0] >= 0:
        options.window_left = window[0]
    if window[1] >= 0:
        options.window_right = window[1]
    return options


class Case:
    def __init__(self, name, lens_q, lens_k, heads=8, heads_k=8, dim=128, causal=False,
                 window=(-1, -1), row_blocks=False):
        self.name, self.heads, self.heads_k, self.dim = name, heads, heads_k, dim
        self.causal, self.window, self.row_blocks = causal, window, row_blocks
        self.cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
        self.cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
        rng = np.random.default_rng(len(name))
        make = lambda n, h: rng.standard_normal((n, h, dim)).astype(np.float16)
        self.q = make(self.cu_q[-1], heads)
        self.k, self.v = make(self.cu_k[-1], heads_k), make(self.cu_k[-1], heads_k)
        self.dout = make(self.cu_q[-1], heads)

    def __repr__(self):
        return self.name

    def forward(self, stub, timeout=300):
        answer = stub.Forward(pb2.ForwardRequest(
            q=tensor(self.q), k=tensor(self.k), v=tensor(self.v), cu_seqlens_q=self.cu_q,
            cu_seqlens_k=self.cu_k, options=attention_options(self.causal, self.window)),
            timeout=timeout)
        assert answer.execution.device == "cuda:0", answer.execution
        out = np.frombuffer(answer.out.data, np.float16).reshape(self.q.shape)
        lse = np.frombuffer(answer.lse.data, np.float32).reshape(self.heads, -1)
        return out, lse

    def backward(self, stub, out, lse):
        answer = stub.Backward(pb2.BackwardRequest(
            dout=tensor(self.dout), q=tensor(self.q), k=tensor(self.k), v=tensor(self.v),
            out=tensor(out), lse=lse_tensor(lse), cu_seqlens_q=self.cu_q,
            cu_seqlens_k=self.cu_k, options=attention_options(self.causal, self.window),
            deterministic=True), timeout=300)
        assert answer.execution.device == "cuda:0", answer.execution
        return [np.frombuffer(t.data, np.float16) for t in (answer.dq, answer.dk, answer.dv)]


SEQUENCE_CASES = [
    Case("many causal sequences, GQA", [1000 + 37 * i for i in range(24)],
         [1000 + 37 * i for i in range(24)], heads_k=2, causal=True),
    # Its longest sequences alone exceed the split server's 2 ms slice in a backward (their
    # rows' bytes over the host link count), so they run as row blocks there (below).
    Case("many sequences, sq != sk, windowed", [700 + 91 * i for i in range(20)],
         [900 + 53 * i for i in range(20)], window=(256, 64), row_blocks=True),
]
ROW_BLOCK_CASES = [
    Case("one long causal sequence, sq < sk", [24000], [30000], causal=True, row_blocks=True),
    Case("one long causal sequence, sq > sk", [30000], [20000], causal=True, row_blocks=True),
    Case("long windowed sequence, window_right > 0", [30000], [26000], window=(2000, 300),
         row_blocks=True),
    Case("short, long, short", [3000, 28000, 500], [3000, 28000, 700], row_blocks=True),
]
# A backward's blocks with fewer kv heads: dk and dv sum over the query heads of each kv head.
GQA_ROW_BLOCK_CASES = [
    Case("one long causal sequence, GQA", [20000], [20000], heads_k=2, causal=True,
         row_blocks=True),
    Case("one long sequence, GQA, no mask", [16000], [16000], heads_k=4, row_blocks=True),
]


@pytest.fixture(scope="module")
def stubs():
    with grpc.insecure_channel(WHOLE, options=CHANNEL_OPTIONS) as whole, \
            grpc.insecure_channel(SPLIT, options=CHANNEL_OPTIONS) as split:
        yield pb2_grpc.AttentionServiceStub(whole), pb2_grpc.AttentionServiceStub(split)


def forward_both(stubs, case):
    whole_stub, split_stub = stubs
    before_whole, before = split_launches(WHOLE_HTTP), split_launches(SPLIT_HTTP)
    want = case.forward(whole_stub)
    got = case.forward(split_stub)
    assert split_launches(SPLIT_HTTP) - before >= 2, "the split server ran it as one launch"
    assert split_launches(WHOLE_HTTP) == before_whole, "the native server split it"
    return want, got


@pytest.mark.parametrize("case", SEQUENCE_CASES, ids=repr)
def test_sequence_groups_answer_bitwise_as_one_launch(stubs, case):
    (out, lse), (split_out, split_lse) = forward_both(stubs, case)
    np.testing.assert_array_equal(split_out, out)
    np.testing.assert_array_equal(split_lse, lse)
    before = split_launches(SPLIT_HTTP)
    want = case.backward(stubs[0], out, lse)
    got = case.backward(stubs[1], out, lse)
    assert split_launches(SPLIT_HTTP) - before >= 2
    np.testing.assert_array_equal(got[0], want[0], err_msg="dq")
    for name, w, g in zip(("dk", "dv"), want[1:], got[1:]):
        if case.row_blocks:
            # A sequence cut into row blocks sums fp16 partials of dk and dv (launch_split.h).
            assert relative_error(g, w) <= 2e-3, (name, relative_error(g, w))
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("case", ROW_BLOCK_CASES, ids=repr)
def test_row_blocks_answer_as_one_launch(stubs, case):
    (out, lse), (split_out, split_lse) = forward_both(stubs, case)
    finite = np.isfinite(lse)
    np.testing.assert_array_equal(np.isfinite(split_lse), finite)  # rows that see no key
    np.testing.assert_allclose(split_lse[finite], lse[finite], rtol=0, atol=1e-5)
    np.testing.assert_allclose(split_out.astype(np.float32), out.astype(np.float32), rtol=0,
                               atol=1e-3)


def relative_error(got, want):
    got, want = got.astype(np.float64), want.astype(np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("case", ROW_BLOCK_CASES + GQA_ROW_BLOCK_CASES, ids=repr)
def test_backward_row_blocks_answer_as_one_launch(stubs, case):
    # The long sequence's backward runs by blocks of query rows: dq of each row in its block's
    # launch, dk and dv as fp16 partials summed in float32 across the blocks (launch_split.h).
    out, lse = case.forward(stubs[0])
    want = case.backward(stubs[0], out, lse)
    before = split_launches(SPLIT_HTTP)
    got = case.backward(stubs[1], out, lse)
    assert split_launches(SPLIT_HTTP) - before >= 3, "the long sequence was not cut"
    for name, w, g in zip(("dq", "dk", "dv"), want, got):
        assert np.isfinite(g).all(), name
        # fp16's tolerance of DESIGN.md: each partial rounds to fp16 once before the sum.
        assert relative_error(g, w) <= 2e-3, (name, relative_error(g, w))
    # Deterministic: the blocks sum in a fixed order, so a second run is bitwise the first.
    again = case.backward(stubs[1], out, lse)
    for name, a, g in zip(("dq", "dk", "dv"), again, got):
        np.testing.assert_array_equal(a, g, err_msg=name)


def test_a_forward_over_the_data_channel_is_cut_as_it_arrives(stubs):
    # The data channel hands the server a request group by group (sequence_groups.h): each
    # group is cut where it alone exceeds the slice, and the answer is still one launch's.
    case = ROW_BLOCK_CASES[-1]
    out, lse = case.forward(stubs[0])
    before = split_launches(SPLIT_HTTP)
    with attnserve.Client(SPLIT, timeout=300, shared_memory="off",
                          cuda_shared_memory="off") as client:
        got = client.forward(case.q, case.k, case.v, case.cu_q, case.cu_k, causal=case.causal,
                             window_size=case.window)
    assert got.execution.device == "cuda:0"
    assert split_launches(SPLIT_HTTP) - before >= 2
    finite = np.isfinite(lse)
    np.testing.assert_array_equal(np.isfinite(got.lse), finite)
    np.testing.assert_allclose(got.lse[finite], lse[finite], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.out.astype(np.float32), out.astype(np.float32), rtol=0,
                               atol=1e-3)


@pytest.mark.parametrize("case", ROW_BLOCK_CASES, ids=repr)
def test_row_blocks_are_bitwise_one_launch(stubs, case):
    # Blocks start at multiples of 768 rows, a multiple of every query tile, so each row meets
    # the same key tiles in the same order as in one launch.
    (out, lse), (split_out, split_lse) = forward_both(stubs, case)
    np.testing.assert_array_equal(split_out, out)
    np.testing.assert_array_equal(split_lse, lse)


def test_a_request_past_its_deadline_stops_within_a_slice(stubs):
    # One sequence of 2M tokens at head_dim 32 (384 MB in): seconds of one H100, hundreds of
    # launches here. Timed once in full, then sent with a deadline half way through its
    # compute: the small request queued behind it on the one lane must not wait for the rest.
    _, split_stub = stubs
    tokens = 1 << 21
    long = Case("long", [tokens], [tokens], heads=1, heads_k=1, dim=32)
    small = Case("small", [256], [256], heads=1, heads_k=1, dim=32)
    request = pb2.ForwardRequest(q=tensor(long.q), k=tensor(long.k), v=tensor(long.v),
                                 cu_seqlens_q=long.cu_q, cu_seqlens_k=long.cu_k)
    start = time.monotonic()
    full = split_stub.Forward(request, timeout=300)
    wall = time.monotonic() - start
    compute = full.execution.compute_us / 1e6
    if compute < 1.0:
        pytest.skip(f"the GPU ran the long request in {compute:.2f} s: too fast to stop part way")
    # Its inputs are 3/4 of the bytes that cross (q, k, v in; out and lse back), so it starts
    # computing about 0.75 * transfers in, and is half way through at this deadline.
    transfers = wall - compute
    deadline = 0.75 * transfers + compute / 2
    with pytest.raises(grpc.RpcError) as expired:
        split_stub.Forward(request, timeout=deadline)
    assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    start_small = time.monotonic()
    small.forward(split_stub, timeout=30)
    waited = time.monotonic() - start_small
    print(f"long request: {compute:.2f} s of compute, {transfers:.2f} s of transfers; "
          f"deadline {deadline:.2f} s; the next request answered {waited * 1e3:.1f} ms after it")
    # Unsplit, it would have waited about compute / 2 for the long request to finish.
    assert waited < min(0.5, compute / 4), waited


def test_resident_requests_are_cut_and_answer_as_one_launch(stubs):
    # Tensors in the client's device memory (CUDA shared memory) used to run as one launch
    # whatever their length; now they are cut like any other request.
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA to make the region")
    from cuda_region import CudaRegion
    case = Case("resident: one long causal sequence, GQA", [20000], [20000], heads_k=2,
                causal=True, row_blocks=True)
    out, lse = case.forward(stubs[0])
    want = case.backward(stubs[0], out, lse)
    region = CudaRegion(SPLIT, f"split-{uuid.uuid4().hex[:8]}", 384 << 20)
    region.register()
    try:
        def on_gpu(a):
            return torch.from_numpy(np.array(a)).cuda()  # a copy: frombuffer arrays are read-only
        for name, a in (("q", case.q), ("k", case.k), ("v", case.v), ("dout", case.dout)):
            region.place(name, on_gpu(a)).copy_(on_gpu(a))
        got_out = region.place("out", on_gpu(case.q))
        got_lse = region.place("lse", on_gpu(lse))
        offsets = {"cu_seqlens_q": case.cu_q.tolist(), "cu_seqlens_k": case.cu_k.tolist()}
        before = split_launches(SPLIT_HTTP)
        region.infer("attention_forward", ["q", "k", "v"], ["out", "lse"], offsets,
                     {"causal": True})
        torch.cuda.synchronize()
        assert split_launches(SPLIT_HTTP) - before >= 2, "the resident forward was not cut"
        split_out, split_lse = got_out.cpu().numpy(), got_lse.cpu().numpy()
        finite = np.isfinite(lse)
        np.testing.assert_array_equal(np.isfinite(split_lse), finite)
        np.testing.assert_allclose(split_lse[finite], lse[finite], rtol=0, atol=1e-5)
        np.testing.assert_allclose(split_out.astype(np.float32), out.astype(np.float32), rtol=0,
                                   atol=1e-3)

        # The backward reads the native forward's out and lse, as the gRPC one did.
        got_out.copy_(on_gpu(out))
        got_lse.copy_(on_gpu(lse))
        grads = [region.place(n, on_gpu(a)) for n, a in
                 (("dq", case.q), ("dk", case.k), ("dv", case.v))]
        before = split_launches(SPLIT_HTTP)
        region.infer("attention_backward", ["dout", "q", "k", "v", "out", "lse"],
                     ["dq", "dk", "dv"], offsets, {"causal": True, "deterministic": True})
        torch.cuda.synchronize()
        assert split_launches(SPLIT_HTTP) - before >= 2, "the resident backward was not cut"
        for name, w, g in zip(("dq", "dk", "dv"), want, grads):
            got = g.cpu().numpy().ravel()
            assert np.isfinite(got).all(), name
            assert relative_error(got, w) <= 2e-3, (name, relative_error(got, w))
    finally:
        region.close()
