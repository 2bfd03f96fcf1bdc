"""Correctness of the flash family's Turing (sm75) path on the GPU, through the C ABI with
compute_capability = 75: the same kernels a T4 / RTX 20xx runs (m16n8k8 mma, register-staged
tile loads, Turing's tile sizes), here on whatever GPU the machine has.

Forward and backward (both dQ modes) for every feature the path has: fp16, head dims 8..64
(32 and 64 instantiated; 8, 16, 40, 48, 56 run on the next one up), varlen with empty and
unequal sequences, GQA/MQA, causal, sliding windows, softcap, lse. Against the float64 oracle
with the flash tests' rule: relative error within 2x PyTorch's own fp16 error on the same inputs
plus a small floor, under an absolute cap; outputs poisoned with NaN first; rows and keys that
see nothing exactly 0 (lse +inf). Deterministic mode is bitwise reproducible. What the path
refuses (bf16, head_dim > 64, a compute capability below 7.5 or above the device's) is an error
that says to route elsewhere. Seed: $ATTN_TEST_SEED.
"""

import math
import os
import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from capi_library import KernelError, load_family  # noqa: E402
from oracle import Options, pytorch_low_precision, reference, relative_error  # noqa: E402
from oracle_backward import pytorch_low_precision_grads, reference_grads  # noqa: E402
from test_flash_backward import GRAD_CAP, GRAD_FLOOR, seen_rows_and_keys  # noqa: E402
from test_flash_forward import (ERROR_CAP, ERROR_FLOOR, LSE_TOL, MASKS, VARLEN_K,  # noqa: E402
                                VARLEN_Q, make_inputs)

TURING = load_family("flash", compute_capability=75)
FP16 = torch.float16
_MAJOR, _MINOR = torch.cuda.get_device_capability()
DEVICE_CC = _MAJOR * 10 + _MINOR


def _lens(cu):
    return (cu[1:] - cu[:-1]).tolist()


def run_forward(q, k, v, cu_q, cu_k, opts, lib=TURING):
    out = torch.full_like(q, math.nan)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, dtype=torch.float32, device="cuda")
    lib.forward(q, k, v, cu_q.cuda(), cu_k.cuda(), max(_lens(cu_q), default=0),
                max(_lens(cu_k), default=0), softmax_scale=opts.scale(q.shape[2]),
                causal=opts.causal, window=(opts.window_left, opts.window_right),
                softcap=opts.softcap, out=out, lse=lse, cu_seqlens_q_host=cu_q,
                cu_seqlens_k_host=cu_k)
    torch.cuda.synchronize()
    return out, lse


def run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic):
    grads = [torch.full_like(t, math.nan) for t in (q, k, v)]
    TURING.backward(dout, q, k, v, out, lse, cu_q.cuda(), cu_k.cuda(),
                    max(_lens(cu_q), default=0), max(_lens(cu_k), default=0),
                    softmax_scale=opts.scale(q.shape[2]), causal=opts.causal,
                    window=(opts.window_left, opts.window_right), softcap=opts.softcap,
                    deterministic=deterministic, dq=grads[0], dk=grads[1], dv=grads[2],
                    cu_seqlens_q_host=cu_q, cu_seqlens_k_host=cu_k)
    torch.cuda.synchronize()
    return grads


def check_forward(q, k, v, cu_q, cu_k, opts):
    out, lse = run_forward(q, k, v, cu_q, cu_k, opts)
    ref_out, ref_lse, seen = reference(q, k, v, cu_q, cu_k, opts)
    assert not out.isnan().any(), "out has unwritten (NaN) elements"
    assert not lse.isnan().any(), "lse has unwritten (NaN) elements"
    assert (out[~seen] == 0).all(), "rows without keys must be 0"
    assert torch.isposinf(lse[:, ~seen]).all(), "rows without keys must have lse +inf"
    if seen.any():
        lse_err = (lse[:, seen].double() - ref_lse[:, seen]).abs().max().item()
        assert lse_err <= LSE_TOL, f"lse error {lse_err:.3g}"
        ours = relative_error(out, ref_out)
        theirs = relative_error(pytorch_low_precision(q, k, v, cu_q, cu_k, opts), ref_out)
        bound = min(2 * theirs + ERROR_FLOOR[FP16], ERROR_CAP[FP16])
        assert ours <= bound, f"rel error {ours:.3g} > {bound:.3g} (PyTorch's: {theirs:.3g})"
    return out, lse


def check_backward(request, q, k, v, cu_q, cu_k, opts):
    out, lse = check_forward(q, k, v, cu_q, cu_k, opts)
    seed = int(os.environ["ATTN_TEST_SEED"]) + zlib.crc32(request.node.nodeid.encode()) + 1
    gen = torch.Generator(device="cuda").manual_seed(seed % (1 << 63))
    dout = torch.randn(q.shape, generator=gen, device="cuda").to(FP16)
    refs = reference_grads(q, k, v, dout, cu_q, cu_k, opts)
    theirs = pytorch_low_precision_grads(q, k, v, dout, cu_q, cu_k, opts)
    rows, keys = seen_rows_and_keys(q, k, cu_q, cu_k, opts)
    for deterministic in (False, True):
        mode = "deterministic" if deterministic else "atomic"
        grads = run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic)
        for name, g, ref, base in zip((f"dq ({mode})", "dk", "dv"), grads, refs, theirs):
            assert not g.isnan().any(), f"{name} has unwritten (NaN) elements"
            unseen = ~rows if name.startswith("dq") else ~keys
            assert (g[unseen] == 0).all(), f"{name}: rows/keys without attention must be 0"
            if ref.norm() == 0:
                continue
            ours = relative_error(g, ref)
            budget = relative_error(base, ref)
            bound = min(2 * budget + GRAD_FLOOR[FP16], GRAD_CAP[FP16])
            assert ours <= bound, (
                f"{name}: rel error {ours:.3g} > {bound:.3g} (PyTorch's: {budget:.3g})")


@pytest.mark.parametrize("head_dim", [8, 16, 32, 40, 48, 56, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dims(request, head_dim, causal):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, head_dim, FP16)
    check_backward(request, q, k, v, cu_q, cu_k, Options(causal=causal))


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("mask", MASKS.keys())
def test_masks(request, head_dim, mask):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 1, head_dim, FP16)
    check_backward(request, q, k, v, cu_q, cu_k, MASKS[mask])


@pytest.mark.parametrize("head_dim", [40, 64])
@pytest.mark.parametrize("mask", ["none", "causal", "window32_32"])
@pytest.mark.parametrize("softcap", [2.0, 30.0])
def test_softcap(request, head_dim, mask, softcap):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, head_dim, FP16,
                                      amplitude=2.0)
    opts = MASKS[mask]
    check_backward(request, q, k, v, cu_q, cu_k,
                   Options(causal=opts.causal, window_left=opts.window_left,
                           window_right=opts.window_right, softcap=softcap))


@pytest.mark.parametrize("heads", [(8, 8), (8, 4), (8, 1), (6, 3)], ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
def test_gqa_mqa(request, heads, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, *heads, head_dim, FP16)
    check_backward(request, q, k, v, cu_q, cu_k, Options(causal=True))


@pytest.mark.parametrize("lens", [(1000, 1000), (700, 1500), (1500, 300)], ids=str)
@pytest.mark.parametrize("mask", ["none", "causal", "causal_left24", "window32_32"])
@pytest.mark.parametrize("head_dim", [32, 64])
def test_long_sequences(request, lens, mask, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, [lens[0]], [lens[1]], 2, 1, head_dim, FP16)
    check_backward(request, q, k, v, cu_q, cu_k, MASKS[mask])


def test_large_scores_stay_finite(request):
    q, k, v, cu_q, cu_k = make_inputs(request, [256, 3], [512, 700], 2, 2, 64, FP16,
                                      amplitude=4.0)
    check_forward(q, k, v, cu_q, cu_k, Options(softmax_scale=0.5))


@pytest.mark.parametrize("head_dim", [32, 64])
def test_deterministic_bitwise(request, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, [900, 300, 17], [1100, 300, 40], 8, 2, head_dim,
                                      FP16)
    opts = Options(causal=True)
    out, lse = run_forward(q, k, v, cu_q, cu_k, opts)
    dout = torch.randn_like(q)
    first = run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic=True)
    second = run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_no_keys_anywhere(request):
    q, k, v, cu_q, cu_k = make_inputs(request, [3, 200], [0, 0], 2, 1, 64, FP16)
    out, lse = run_forward(q, k, v, cu_q, cu_k, Options())
    assert (out == 0).all() and torch.isposinf(lse).all()
    dq, dk, dv = run_backward(q, k, v, out, lse, torch.randn_like(q), cu_q, cu_k, Options(),
                              deterministic=False)
    assert (dq == 0).all() and dk.numel() == 0 and dv.numel() == 0


def test_no_queries_anywhere(request):
    q, k, v, cu_q, cu_k = make_inputs(request, [0, 0], [70, 5], 2, 1, 64, FP16)
    out = torch.empty_like(q)
    lse = torch.empty(2, 0, device="cuda")
    for deterministic in (False, True):
        _, dk, dv = run_backward(q, k, v, out, lse, torch.empty_like(q), cu_q, cu_k, Options(),
                                 deterministic)
        assert (dk == 0).all() and (dv == 0).all()


def test_same_results_as_sm80_path(request):
    """Both paths compute the same function; on an sm80+ GPU they differ by rounding only."""
    if DEVICE_CC < 80:
        pytest.skip("the sm80 path needs an sm80+ GPU")
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, 64, FP16)
    opts = Options(causal=True)
    ours, _ = run_forward(q, k, v, cu_q, cu_k, opts)
    theirs, _ = run_forward(q, k, v, cu_q, cu_k, opts, lib=load_family("flash"))
    assert relative_error(ours, theirs.double()) < ERROR_CAP[FP16]


def _call(lib, backward=False, dtype=FP16, head_dim=64):
    q = torch.randn(8, 2, head_dim, device="cuda").to(dtype)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    common = dict(cu_seqlens_q=cu.cuda(), cu_seqlens_k=cu.cuda(), max_seqlen_q=8,
                  max_seqlen_k=8, cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
    if backward:
        lse = torch.zeros(2, 8, device="cuda")
        return lib.backward(q, q, q, q, q, lse, **common)
    return lib.forward(q, q, q, **common)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 64), (FP16, 72), (FP16, 128),
                                            (torch.bfloat16, 128)], ids=str)
def test_error_unsupported_on_sm75(backward, dtype, head_dim):
    with pytest.raises(KernelError,
                       match="flash on sm75 supports fp16 head_dim <= 64; route to fallback"):
        _call(TURING, backward, dtype, head_dim)


@pytest.mark.parametrize("cc", [70, 61])
def test_error_below_turing(cc):
    with pytest.raises(KernelError, match=r"needs compute capability >= 7\.5"):
        _call(load_family("flash", compute_capability=cc))


def test_error_newer_than_device():
    cc = DEVICE_CC + 10
    with pytest.raises(KernelError, match="cannot run on it"):
        _call(load_family("flash", compute_capability=cc))
    with pytest.raises(KernelError, match="cannot run on it"):
        _call(load_family("flash", compute_capability=cc), backward=True)


def test_sm86_runs_sm80_path_with_bf16(request):
    """A compute capability between 8.0 and the device's own runs the sm80 kernels."""
    if DEVICE_CC < 86:
        pytest.skip("needs a device of compute capability >= 8.6")
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, 64, torch.bfloat16)
    out, _ = run_forward(q, k, v, cu_q, cu_k, Options(), lib=load_family("flash", 86))
    ref, _, _ = reference(q, k, v, cu_q, cu_k, Options())
    assert relative_error(out, ref) < ERROR_CAP[torch.bfloat16]
