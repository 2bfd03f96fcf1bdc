"""End-to-end on the GPU machine: a running attnserve (ATTNSERVE_GPU_TARGET) answers the Python
client from the GPU, checked against the float64 reference and against PyTorch's own attention
on the same inputs. Skipped elsewhere (CI has no GPU); scripts/gpu_e2e.sh runs it."""
import os

import numpy as np
import pytest
from ml_dtypes import bfloat16

import attnserve
from attnserve import reference

TARGET = os.environ.get("ATTNSERVE_GPU_TARGET")
pytestmark = pytest.mark.skipif(not TARGET, reason="needs a GPU server (ATTNSERVE_GPU_TARGET)")

DTYPES = {"fp16": np.float16, "bf16": bfloat16}
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2}

# (name, seqlens_q, seqlens_k, heads, heads_k, head_dim, options)
CASES = [
    ("hdim64", [300, 17, 129], [300, 17, 129], 8, 8, 64, {}),
    ("hdim128_causal", [257, 64], [257, 64], 4, 4, 128, {"causal": True}),
    ("hdim40_padded", [100, 33], [90, 70], 4, 2, 40, {}),
    ("hdim256_gqa", [130], [200], 8, 2, 256, {"causal": True}),
    ("hdim96_window", [200, 50], [200, 80], 2, 1, 96, {"window_size": (32, 8)}),
    ("softcap_scale", [180], [180], 4, 4, 64, {"softcap": 20.0, "softmax_scale": 0.2}),
    ("empty_and_longer_q", [0, 70, 5, 0], [12, 0, 9, 3], 2, 2, 32, {"causal": True}),
]


@pytest.fixture(scope="module")
def client():
    with attnserve.Client(TARGET, timeout=120) as c:
        yield c


def rel_error(got, want):
    got = np.asarray(got, dtype=np.float64)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), "non-finite entries differ"
    diff = np.linalg.norm(got[finite] - want[finite])
    return diff / max(np.linalg.norm(want[finite]), 1e-30)


def random_inputs(rng, seqlens_q, seqlens_k, heads, heads_k, dim, dtype):
    tq, tk = sum(seqlens_q), sum(seqlens_k)
    make = lambda *shape: rng.standard_normal(shape).astype(dtype)
    return make(tq, heads, dim), make(tk, heads_k, dim), make(tk, heads_k, dim)


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def torch_error(q, k, v, cu_q, cu_k, want_out, options):
    """PyTorch's own attention in the request's dtype on the GPU, against the same float64 answer."""
    torch = pytest.importorskip("torch")
    out = np.zeros(want_out.shape)
    dtype = torch.float16 if q.dtype == np.float16 else torch.bfloat16
    for b in range(len(cu_q) - 1):
        sq, sk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        if sq == 0 or sk == 0:
            continue
        to = lambda x, lo, hi: torch.from_numpy(x[lo:hi].astype(np.float32)).cuda().to(dtype)
        tq, tk, tv = to(q, cu_q[b], cu_q[b + 1]), to(k, cu_k[b], cu_k[b + 1]), to(v, cu_k[b], cu_k[b + 1])
        mask = torch.from_numpy(reference.visible_mask(
            sq, sk, options.get("causal", False), options.get("window_size", (-1, -1)))).cuda()
        groups = q.shape[1] // k.shape[1]
        tk, tv = tk.repeat_interleave(groups, 1), tv.repeat_interleave(groups, 1)
        scale = options.get("softmax_scale") or q.shape[2] ** -0.5
        s = torch.einsum("qhd,khd->hqk", tq, tk).float() * scale
        if options.get("softcap"):
            s = options["softcap"] * torch.tanh(s / options["softcap"])
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, -1).nan_to_num(0.0).to(dtype)
        out[cu_q[b]:cu_q[b + 1]] = torch.einsum("hqk,khd->qhd", p, tv).float().cpu().numpy()
    return rel_error(out, want_out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_on_the_gpu_matches_float64_and_pytorch(client, dtype, case):
    _, seqlens_q, seqlens_k, heads, heads_k, dim, options = case
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, seqlens_q, seqlens_k, heads, heads_k, dim, DTYPES[dtype])
    cu_q, cu_k = offsets(seqlens_q), offsets(seqlens_k)
    result = client.forward(q, k, v, cu_q, cu_k, **options)
    assert result.execution.device == "cuda:0"
    assert result.execution.kernel == "flash"
    want_out, want_lse = reference.attention_forward(q, k, v, cu_q, cu_k, **options)
    err = rel_error(result.out, want_out)
    assert err <= TOLERANCE[dtype]
    assert rel_error(result.lse, want_lse) <= 1e-4
    assert err <= 2 * torch_error(q, k, v, cu_q, cu_k, want_out, options) + 1e-4


def torch_backward_error(q, k, v, dout, cu_q, cu_k, want, options):
    """PyTorch's own autograd in the request's dtype on the GPU, against the same float64 grads."""
    torch = pytest.importorskip("torch")
    dtype = torch.float16 if q.dtype == np.float16 else torch.bfloat16
    grads = [np.zeros(x.shape) for x in (q, k, v)]
    groups = q.shape[1] // k.shape[1]
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        sq, sk = qs.stop - qs.start, ks.stop - ks.start
        if sq == 0 or sk == 0:
            continue
        leaf = lambda x: torch.from_numpy(x.astype(np.float32)).cuda().to(dtype).requires_grad_()
        tq, tk, tv = leaf(q[qs]), leaf(k[ks]), leaf(v[ks])
        mask = torch.from_numpy(reference.visible_mask(
            sq, sk, options.get("causal", False), options.get("window_size", (-1, -1)))).cuda()
        scale = options.get("softmax_scale") or q.shape[2] ** -0.5
        s = torch.einsum("qhd,khd->hqk", tq, tk.repeat_interleave(groups, 1)).float() * scale
        if options.get("softcap"):
            s = options["softcap"] * torch.tanh(s / options["softcap"])
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0).to(dtype)
        out = torch.einsum("hqk,khd->qhd", p, tv.repeat_interleave(groups, 1))
        out.backward(torch.from_numpy(dout[qs].astype(np.float32)).cuda().to(dtype))
        for g, t, rows in zip(grads, (tq, tk, tv), (qs, ks, ks)):
            g[rows] = t.grad.float().cpu().numpy()
    return [rel_error(g, w) for g, w in zip(grads, want)]


BACKWARD_CASES = CASES  # flash runs the backward at every head dim up to 256


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=[c[0] for c in BACKWARD_CASES])
def test_backward_on_the_gpu_matches_float64_and_pytorch(client, dtype, case):
    _, seqlens_q, seqlens_k, heads, heads_k, dim, options = case
    rng = np.random.default_rng()
    q, k, v = random_inputs(rng, seqlens_q, seqlens_k, heads, heads_k, dim, DTYPES[dtype])
    dout = rng.standard_normal(q.shape).astype(DTYPES[dtype])
    cu_q, cu_k = offsets(seqlens_q), offsets(seqlens_k)
    forward = client.forward(q, k, v, cu_q, cu_k, **options)
    backward = client.backward(dout, q, k, v, forward.out, forward.lse, cu_q, cu_k, **options)
    assert backward.execution.device == "cuda:0"
    assert backward.execution.kernel == "flash"
    want = reference.attention_backward(dout, q, k, v, forward.out, forward.lse, cu_q, cu_k,
                                        **options)
    torch_errors = torch_backward_error(q, k, v, dout, cu_q, cu_k, want, options)
    for name, got, exp, peer in zip(("dq", "dk", "dv"), (backward.dq, backward.dk, backward.dv),
                                    want, torch_errors):
        err = rel_error(got, exp)
        assert err <= 2 * peer + 1e-3, f"{name}: {err} vs PyTorch's {peer}"
