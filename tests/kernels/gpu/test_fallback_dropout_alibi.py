"""Dropout and ALiBi in the fallback kernels (kernels/fallback, the kExtras instantiations) on the
GPU, through libattn_capi.so, on every code path (compute_capability 70, 75 and the device's own),
against the float64 NumPy reference of the Python client (client/python/attnserve/reference.py),
whose dropout mask is kernels/dropout_mask.h's.

- Values: out, lse and the gradients of fresh random varlen inputs (per-head and per-sequence
  slopes, first_sequence != 0, GQA/MQA, causal, windows, softcap) within fixed relative bounds;
  the backward's reference takes our own out and lse (D = rowsum(dO * O) of the dropped out).
- The mask exactly: with v one-hot by key (v_j = e_j) the forward's out[i, :len_k] is P Z, and
  with dout one-hot by query the backward's dv[j, :len_q] is (P Z)^T, so their zero patterns
  must equal the reference's keep mask on the visible keys, element for element.
Skipped without CUDA or the library. Seed: $ATTN_TEST_SEED.
"""

import importlib.util
import math
import pathlib
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from capi_library import KernelError  # noqa: E402
from test_fallback_forward import (BASE_SEED, DTYPES, FAMILIES, PATHS, VARLEN_K,  # noqa: E402
                                   VARLEN_Q, make_inputs)

# The reference module alone (the attnserve package would import the gRPC client).
_REFERENCE_PATH = (pathlib.Path(__file__).resolve().parents[3] / "client" / "python" /
                   "attnserve" / "reference.py")
_spec = importlib.util.spec_from_file_location("attnserve_reference", _REFERENCE_PATH)
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

# Relative errors against float64: P and the inputs are rounded to the dtype (P Z carries the
# 1 / (1 - p) scale). ALiBi biases of hundreds (in score units) cost fp32 a few ulps of them.
OUT_TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 5e-5}
GRAD_TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 2e-4}
LSE_TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-3, torch.float32: 5e-5}


class Case:
    def __init__(self, heads=(4, 2), causal=False, window=(-1, -1), softcap=0.0, dropout_p=0.0,
                 alibi=None, first_sequence=0):
        self.heads, self.causal, self.window, self.softcap = heads, causal, window, softcap
        self.dropout_p, self.alibi, self.first_sequence = dropout_p, alibi, first_sequence


CASES = {
    "dropout": Case(dropout_p=0.17),
    "dropout_causal_first3": Case(causal=True, dropout_p=0.3, first_sequence=3),
    "alibi_heads_causal": Case(causal=True, alibi="head"),
    "alibi_sequences_window_first2": Case(window=(32, 16), alibi="sequence", first_sequence=2),
    "both_gqa3_softcap": Case(heads=(6, 2), softcap=5.0, dropout_p=0.1, alibi="head"),
    "both_mqa_causal_left20_first1": Case(heads=(4, 1), causal=True, window=(20, -1),
                                          dropout_p=0.25, alibi="sequence", first_sequence=1),
}


def _seed(request, salt):
    return (BASE_SEED + zlib.crc32(request.node.nodeid.encode()) + salt) % (1 << 63)


def make_slopes(request, case, batch):
    """float32 CUDA slopes ([H] or [first_sequence + batch, H]) or None."""
    if case.alibi is None:
        return None
    rows = () if case.alibi == "head" else (case.first_sequence + batch,)
    gen = torch.Generator(device="cuda").manual_seed(_seed(request, 7))
    return torch.rand(*rows, case.heads[0], generator=gen, device="cuda") * 0.3 + 0.02


def padded(cu, first):
    """Offsets with `first` empty sequences in front: the reference numbers sequences from 0,
    the kernels from first_sequence."""
    return np.concatenate([np.zeros(first, np.int32), cu.numpy().astype(np.int32)])


def kernel_kwargs(case, head_dim, seed, slopes):
    return dict(softmax_scale=1.0 / math.sqrt(head_dim), causal=case.causal, window=case.window,
                softcap=case.softcap, dropout_p=case.dropout_p, dropout_seed=seed,
                alibi_slopes=slopes, first_sequence=case.first_sequence)


def reference_kwargs(case, head_dim, seed, slopes):
    return dict(softmax_scale=1.0 / math.sqrt(head_dim), causal=case.causal,
                window_size=case.window, softcap=case.softcap, dropout_p=case.dropout_p,
                dropout_seed=seed, alibi_slopes=None if slopes is None else slopes.cpu().numpy())


def run_forward(family, q, k, v, cu_q, cu_k, kwargs):
    out = torch.full_like(q, math.nan)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, dtype=torch.float32, device="cuda")
    family.forward(q, k, v, cu_q.cuda(), cu_k.cuda(), int((cu_q[1:] - cu_q[:-1]).max()),
                   int((cu_k[1:] - cu_k[:-1]).max()), out=out, lse=lse,
                   cu_seqlens_q_host=cu_q, cu_seqlens_k_host=cu_k, **kwargs)
    torch.cuda.synchronize()
    return out, lse


def run_backward(family, q, k, v, out, lse, dout, cu_q, cu_k, kwargs):
    grads = [torch.full_like(x, math.nan) for x in (q, k, v)]
    family.backward(dout, q, k, v, out, lse, cu_q.cuda(), cu_k.cuda(),
                    int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max()),
                    dq=grads[0], dk=grads[1], dv=grads[2], cu_seqlens_q_host=cu_q,
                    cu_seqlens_k_host=cu_k, **kwargs)
    torch.cuda.synchronize()
    return grads


def rel_error(got, want):
    got = got.double().cpu().numpy()
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def check(request, family, case, head_dim, dtype):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, *case.heads, head_dim, dtype,
                                      amplitude=2.0 if case.softcap else 1.0)
    seed = _seed(request, 1) | 1  # the dropout seed (never 0 when dropout is on)
    slopes = make_slopes(request, case, len(VARLEN_Q))
    kwargs = kernel_kwargs(case, head_dim, seed, slopes)
    rkwargs = reference_kwargs(case, head_dim, seed, slopes)
    rcu_q, rcu_k = padded(cu_q, case.first_sequence), padded(cu_k, case.first_sequence)
    host = [x.float().cpu().numpy() for x in (q, k, v)]

    out, lse = run_forward(family, q, k, v, cu_q, cu_k, kwargs)
    assert not out.isnan().any() and not lse.isnan().any(), "unwritten (NaN) outputs"
    want_out, want_lse = ref.attention_forward(*host, rcu_q, rcu_k, **rkwargs)
    err = rel_error(out, want_out)
    assert err <= OUT_TOL[dtype], f"out: rel error {err:.3g}"
    got_lse = lse.double().cpu().numpy()
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(got_lse), finite), "lse: +inf rows differ"
    lse_err = np.abs(got_lse[finite] - want_lse[finite]) / np.maximum(1.0, np.abs(want_lse[finite]))
    assert lse_err.max(initial=0.0) <= LSE_TOL[dtype], f"lse: error {lse_err.max():.3g}"

    gen = torch.Generator(device="cuda").manual_seed(_seed(request, 2))
    dout = torch.randn(q.shape, generator=gen, device="cuda").to(dtype)
    grads = run_backward(family, q, k, v, out, lse, dout, cu_q, cu_k, kwargs)
    wants = ref.attention_backward(dout.float().cpu().numpy(), *host, out.float().cpu().numpy(),
                                   got_lse, rcu_q, rcu_k, **rkwargs)
    for name, got, want in zip(("dq", "dk", "dv"), grads, wants):
        assert not got.isnan().any(), f"{name} has unwritten (NaN) elements"
        err = rel_error(got, want)
        assert err <= GRAD_TOL[dtype], f"{name}: rel error {err:.3g}"


path_param = pytest.mark.parametrize("cc", PATHS.values(), ids=PATHS.keys())
dtype_param = pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())


@path_param
@dtype_param
@pytest.mark.parametrize("head_dim", [24, 128])
@pytest.mark.parametrize("case", CASES.keys())
def test_values(request, cc, dtype, head_dim, case):
    check(request, FAMILIES[cc], CASES[case], head_dim, dtype)


# Head dim 256: the dK/dV pass splits dK/dV's columns over two warps per 16 keys.
@path_param
@dtype_param
@pytest.mark.parametrize("case", ["both_gqa3_softcap", "both_mqa_causal_left20_first1"])
def test_values_head_dim_256(request, cc, dtype, case):
    check(request, FAMILIES[cc], CASES[case], 256, dtype)


# Sequences no longer than the head dim (so one-hot rows fit): q > k, q < k, equal, empty.
MASK_LENS_Q = [17, 0, 64, 33, 5, 50]
MASK_LENS_K = [40, 5, 64, 1, 60, 9]


@path_param
@dtype_param
@pytest.mark.parametrize("dropout_p", [0.4, 0.85])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mask_is_the_reference_mask(request, cc, dtype, dropout_p, causal):
    head_dim, heads, first = 64, 2, 5
    family = FAMILIES[cc]
    q, k, v, cu_q, cu_k = make_inputs(request, MASK_LENS_Q, MASK_LENS_K, heads, heads, head_dim,
                                      dtype)
    eye = torch.eye(head_dim, device="cuda", dtype=dtype)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    dout = torch.zeros_like(q)
    for b in range(len(MASK_LENS_Q)):
        v[ck[b]:ck[b + 1]] = eye[:ck[b + 1] - ck[b], None, :]     # v_j = e_j
        dout[cq[b]:cq[b + 1]] = eye[:cq[b + 1] - cq[b], None, :]  # dout_i = e_i
    seed = _seed(request, 3) | 1
    case = Case(heads=(heads, heads), causal=causal, dropout_p=dropout_p, first_sequence=first)
    kwargs = kernel_kwargs(case, head_dim, seed, None)
    out, lse = run_forward(family, q, k, v, cu_q, cu_k, kwargs)
    _, _, dv = run_backward(family, q, k, v, out, lse, dout, cu_q, cu_k, kwargs)
    out, dv = out.cpu(), dv.cpu()
    for b, (len_q, len_k) in enumerate(zip(MASK_LENS_Q, MASK_LENS_K)):
        if len_q == 0 or len_k == 0:
            continue
        keep = ref.dropout_keep(seed, first + b, heads, len_q, len_k, dropout_p)
        want = torch.from_numpy(keep & ref.visible_mask(len_q, len_k, causal)[None])
        got_out = out[cq[b]:cq[b + 1]].permute(1, 0, 2)  # [H, len_q, head_dim]
        assert torch.equal(got_out[..., :len_k] != 0, want), f"forward mask, sequence {b}"
        assert (got_out[..., len_k:] == 0).all()
        got_dv = dv[ck[b]:ck[b + 1]].permute(1, 2, 0)  # [H, head_dim, len_k]
        assert torch.equal(got_dv[:, :len_q] != 0, want), f"dK/dV pass mask, sequence {b}"
        assert (got_dv[:, len_q:] == 0).all()


def test_error_dropout_p_one(request):
    q, k, v, cu_q, cu_k = make_inputs(request, [8], [8], 2, 1, 64, torch.float16)
    kwargs = kernel_kwargs(Case(heads=(2, 1), dropout_p=1.0), 64, 1, None)
    with pytest.raises(KernelError, match=r"fallback: dropout_p must be in \[0, 1\)"):
        run_forward(FAMILIES[0], q, k, v, cu_q, cu_k, kwargs)
