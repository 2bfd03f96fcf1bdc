"""Correctness of the flash backward kernels (kernels/flash) on the GPU, through its C ABI.

Each case draws fresh random inputs and dout, runs our forward for out and lse, poisons dq/dk/dv
with NaN, runs our backward in both modes (atomic dQ, and deterministic with its separate dQ
pass) and checks every gradient against float64 autograd with explicit
masks: ||g - ref|| / ||ref|| within 2x PyTorch's own fp16/bf16 backward error on the same inputs
plus a small floor, under an absolute cap. Rows that see no key (lse = +inf) and keys no row
sees get exactly zero gradients. Deterministic mode is bitwise reproducible. On a GPU newer
than sm80 every case also runs the sm80 code path as an A100 would (compute_capability 80:
163 KB of shared memory per block, so the narrow dK/dV kernel instead of the wide one: 4 warps
at head dims up to 128, one stage instead of two at 192/256). On a 9.x GPU the device path runs
the Hopper (wgmma) dK/dV kernels (head dims 64 / 128: bwd_sm90_kernel.cuh, 192 / 256:
bwd_sm90_wide_kernel.cuh) in both modes: in the atomic mode below 256 adding dQ by tile, in the
deterministic mode and at 256 without dQ, followed by the dQ kernel (bwd_sm90_dq_kernel.cuh). So
every case also runs with PATH_SM90_BACKWARD disabled, the sm80 kernels on the same device, and
test_sm90_backward_runs checks which kernels ran.
Needs torch with CUDA and a built libattn_capi.so; skipped otherwise. Seed: $ATTN_TEST_SEED.
"""

import math
import os
import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from capi_library import PATH_SM90_BACKWARD, KernelError, load_family  # noqa: E402
from oracle import Options, relative_error, visible_mask  # noqa: E402
from oracle_backward import pytorch_low_precision_grads, reference_grads  # noqa: E402
from test_flash_forward import (DTYPES, LIB, MASKS, VARLEN_K, VARLEN_Q, make_inputs,  # noqa: E402
                                run_flash)

# The backward as the device runs it, and on newer GPUs also as an A100 would.
BACKWARD_LIBS = [("device", LIB)]
if torch.cuda.get_device_capability() > (8, 0):
    BACKWARD_LIBS.append(("as sm80", load_family("flash", compute_capability=80)))
# The sm80 kernels on a Hopper GPU (its own path runs the wgmma dK/dV kernel at 64 and 128).
SM80_ON_HOPPER = ("sm90 backward off",
                  load_family("flash", disabled_paths=PATH_SM90_BACKWARD))
if torch.cuda.get_device_capability()[0] == 9:
    BACKWARD_LIBS.append(SM80_ON_HOPPER)

# ATTN_TEST_BWD_DEVICE_ATOMIC_ONLY=1: only the device path's atomic mode, a quick check of a
# build variant of a Hopper dK/dV kernel (bench/run_gpu.sh --bwd-variant-tests sets it); its
# deterministic mode, the dK/dV kernel without dQ, is left to the whole suite.
DEVICE_ATOMIC_ONLY = os.environ.get("ATTN_TEST_BWD_DEVICE_ATOMIC_ONLY", "0") == "1"

GRAD_FLOOR = {torch.float16: 2e-4, torch.bfloat16: 1e-3}
GRAD_CAP = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic=False, lib=LIB):
    lens_q = (cu_q[1:] - cu_q[:-1]).tolist()
    lens_k = (cu_k[1:] - cu_k[:-1]).tolist()
    dq = torch.full_like(q, math.nan)
    dk = torch.full_like(k, math.nan)
    dv = torch.full_like(v, math.nan)
    lib.backward(dout, q, k, v, out, lse, cu_q.cuda(), cu_k.cuda(), max(lens_q, default=0),
                 max(lens_k, default=0), softmax_scale=opts.scale(q.shape[2]),
                 causal=opts.causal, window=(opts.window_left, opts.window_right),
                 softcap=opts.softcap, deterministic=deterministic, dq=dq, dk=dk, dv=dv,
                 cu_seqlens_q_host=cu_q, cu_seqlens_k_host=cu_k)
    torch.cuda.synchronize()
    return dq, dk, dv


def seen_rows_and_keys(q, k, cu_q, cu_k, opts):
    rows = torch.zeros(q.shape[0], dtype=torch.bool, device="cuda")
    keys = torch.zeros(k.shape[0], dtype=torch.bool, device="cuda")
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        if cq[b + 1] > cq[b] and ck[b + 1] > ck[b]:
            mask = visible_mask(cq[b + 1] - cq[b], ck[b + 1] - ck[b], opts, "cuda")
            rows[cq[b]:cq[b + 1]] = mask.any(dim=1)
            keys[ck[b]:ck[b + 1]] = mask.any(dim=0)
    return rows, keys


def check(request, q, k, v, cu_q, cu_k, opts):
    out, lse = run_flash(q, k, v, cu_q, cu_k, opts)
    seed = (int(os.environ["ATTN_TEST_SEED"]) + zlib.crc32(request.node.nodeid.encode()) + 1)
    gen = torch.Generator(device="cuda").manual_seed(seed % (1 << 63))
    dout = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)
    refs = reference_grads(q, k, v, dout, cu_q, cu_k, opts)
    theirs = pytorch_low_precision_grads(q, k, v, dout, cu_q, cu_k, opts)
    rows, keys = seen_rows_and_keys(q, k, cu_q, cu_k, opts)
    for path, lib in BACKWARD_LIBS:
        for deterministic in (False, True):
            if DEVICE_ATOMIC_ONLY and (deterministic or path != "device"):
                continue
            grads = run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic, lib)
            check_grads(grads, refs, theirs, rows, keys, deterministic, path)


def check_grads(grads, refs, theirs, rows, keys, deterministic, path="device"):
    mode = ("deterministic" if deterministic else "atomic") + ", " + path
    for name, g, ref, base in zip((f"dq ({mode})", "dk", "dv"), grads, refs, theirs):
        assert not g.isnan().any(), f"{name} has unwritten (NaN) elements"
        unseen = ~rows if name.startswith("dq") else ~keys
        assert (g[unseen] == 0).all(), f"{name}: rows/keys without attention must be 0"
        if ref.norm() == 0:
            continue
        ours = relative_error(g, ref)
        budget = relative_error(base, ref)
        bound = min(2 * budget + GRAD_FLOOR[g.dtype], GRAD_CAP[g.dtype])
        assert ours <= bound, (
            f"{name}: rel error {ours:.3g} > {bound:.3g} (PyTorch's: {budget:.3g})")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("head_dim", [8, 32, 40, 64, 72, 96, 104, 128, 136, 160, 192, 200, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dims(request, dtype, head_dim, causal):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, head_dim, dtype)
    check(request, q, k, v, cu_q, cu_k, Options(causal=causal))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("mask", MASKS.keys())
def test_masks(request, dtype, head_dim, mask):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 1, head_dim, dtype)
    check(request, q, k, v, cu_q, cu_k, MASKS[mask])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("mask", ["none", "causal", "window32_32"])
@pytest.mark.parametrize("softcap", [2.0, 30.0])
def test_softcap(request, dtype, head_dim, mask, softcap):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, head_dim, dtype,
                                      amplitude=2.0)
    opts = MASKS[mask]
    check(request, q, k, v, cu_q, cu_k,
          Options(causal=opts.causal, window_left=opts.window_left,
                  window_right=opts.window_right, softcap=softcap))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("heads", [(8, 8), (8, 4), (8, 1), (6, 3)], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_gqa_mqa(request, dtype, heads, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, *heads, head_dim, dtype)
    check(request, q, k, v, cu_q, cu_k, Options(causal=True))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("lens", [(1000, 1000), (700, 1500), (1500, 300)], ids=str)
@pytest.mark.parametrize("mask", ["none", "causal", "causal_left24", "window32_32"])
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_long_sequences(request, dtype, lens, mask, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, [lens[0]], [lens[1]], 2, 1, head_dim, dtype)
    check(request, q, k, v, cu_q, cu_k, MASKS[mask])


@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_non_finite_neighbour_stays_out(request, head_dim, mask):
    # A sequence of NaN and infinities (q, k, v and dout) between two finite ones. Query tiles
    # and key blocks that cross a sequence's end reach into the next one's rows, which must read
    # as zeros or be masked (P = 0 times an infinite dO is NaN), and dQ must not be added across
    # it: the neighbours' gradients must match the reference of the same batch with the
    # poisoned sequence zeroed.
    lens_q, lens_k = [77, 40, 150], [130, 90, 200]
    opts = MASKS[mask]
    q, k, v, cu_q, cu_k = make_inputs(request, lens_q, lens_k, 4, 2, head_dim, torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(
        (int(os.environ["ATTN_TEST_SEED"]) + zlib.crc32(request.node.nodeid.encode())) % (1 << 63))
    dout = torch.randn(q.shape, generator=gen, device="cuda").to(q.dtype)
    rows_q = slice(lens_q[0], lens_q[0] + lens_q[1])
    rows_k = slice(lens_k[0], lens_k[0] + lens_k[1])
    for tensor, rows in ((q, rows_q), (dout, rows_q), (k, rows_k), (v, rows_k)):
        tensor[rows] = 0
    refs = reference_grads(q, k, v, dout, cu_q, cu_k, opts)
    theirs = pytorch_low_precision_grads(q, k, v, dout, cu_q, cu_k, opts)
    rows, keys = seen_rows_and_keys(q, k, cu_q, cu_k, opts)
    q[rows_q] = math.nan
    dout[rows_q] = math.inf
    k[rows_k, 0] = math.nan
    k[rows_k, 1] = math.inf
    v[rows_k] = -math.inf
    out, lse = run_flash(q, k, v, cu_q, cu_k, opts)
    keep_q = torch.ones(q.shape[0], dtype=torch.bool, device="cuda")
    keep_q[rows_q] = False
    keep_k = torch.ones(k.shape[0], dtype=torch.bool, device="cuda")
    keep_k[rows_k] = False
    keep = (keep_q, keep_k, keep_k)
    for path, lib in BACKWARD_LIBS:
        for deterministic in (False, True):
            if DEVICE_ATOMIC_ONLY and (deterministic or path != "device"):
                continue
            grads = run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic, lib)
            check_grads([g[m] for g, m in zip(grads, keep)], [r[m] for r, m in zip(refs, keep)],
                        [t[m] for t, m in zip(theirs, keep)], rows[keep_q], keys[keep_k],
                        deterministic, path)


@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_deterministic_bitwise(request, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, [900, 300, 17], [1100, 300, 40], 8, 2, head_dim,
                                      torch.bfloat16)
    opts = Options(causal=True)
    out, lse = run_flash(q, k, v, cu_q, cu_k, opts)
    dout = torch.randn_like(q)
    first = run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic=True)
    second = run_backward(q, k, v, out, lse, dout, cu_q, cu_k, opts, deterministic=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("head_dim", [64, 192, 256])
def test_no_keys_anywhere(request, head_dim, deterministic):
    q, k, v, cu_q, cu_k = make_inputs(request, [3, 200], [0, 0], 2, 1, head_dim, torch.float16)
    out, lse = run_flash(q, k, v, cu_q, cu_k, Options())
    dq, dk, dv = run_backward(q, k, v, out, lse, torch.randn_like(q), cu_q, cu_k, Options(),
                              deterministic)
    assert (dq == 0).all() and dk.numel() == 0 and dv.numel() == 0


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("head_dim", [64, 192, 256])
def test_no_queries_anywhere(request, head_dim, deterministic):
    q, k, v, cu_q, cu_k = make_inputs(request, [0, 0], [70, 5], 2, 1, head_dim, torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(2, 0, device="cuda")
    dq, dk, dv = run_backward(q, k, v, out, lse, torch.empty_like(q), cu_q, cu_k, Options(),
                              deterministic)
    assert (dk == 0).all() and (dv == 0).all()


def test_batch_zero():
    q = torch.empty(0, 2, 64, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(2, 0, device="cuda")
    cu = torch.zeros(1, dtype=torch.int32)
    dq, dk, dv = LIB.backward(q, q, q, q, q, lse, cu.cuda(), cu.cuda(), 0, 0,
                              cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
    torch.cuda.synchronize()
    assert dq.shape == (0, 2, 64)


def _backward_call(**overrides):
    q = torch.randn(8, 2, overrides.pop("head_dim", 64), device="cuda").to(
        overrides.pop("dtype", torch.bfloat16))
    lse = torch.zeros(2, 8, device="cuda")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    kwargs = dict(dout=q, q=q, k=q, v=q, out=q, lse=lse, cu_seqlens_q=cu.cuda(),
                  cu_seqlens_k=cu.cuda(), max_seqlen_q=8, max_seqlen_k=8,
                  cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
    kwargs.update(overrides)
    return kwargs


def test_error_head_dim_too_large():
    with pytest.raises(KernelError, match="head_dim 264 is not supported"):
        LIB.backward(**_backward_call(head_dim=264))


def test_error_fp32():
    with pytest.raises(KernelError, match="fp32 is not supported"):
        LIB.backward(**_backward_call(dtype=torch.float32))


def test_error_workspace_too_small():
    kwargs = _backward_call()
    kwargs["workspace"] = torch.empty(4, dtype=torch.uint8, device="cuda")
    with pytest.raises(KernelError, match=r"needs a workspace of 37120 bytes"):
        LIB.backward(**kwargs)
    kwargs["deterministic"] = True
    with pytest.raises(KernelError, match=r"needs a workspace of 256 bytes"):
        LIB.backward(**kwargs)


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] != 9, reason="needs a 9.x GPU")
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_sm90_backward_runs(head_dim):
    """On a 9.x GPU the wgmma dK/dV kernel is the one that runs (when this build has it: sm_90 in
    CMAKE_CUDA_ARCHITECTURES and the head dim in ATTN_HEAD_DIMS), in both modes, with the dQ
    kernel in the deterministic mode and at 256 in both, and disabling PATH_SM90_BACKWARD switches
    it off."""
    from torch.profiler import ProfilerActivity, profile

    kwargs = _backward_call(head_dim=head_dim)

    def kernels_run(lib, deterministic=False):
        lib.backward(**kwargs, deterministic=deterministic)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            lib.backward(**kwargs, deterministic=deterministic)
            torch.cuda.synchronize()
        return [event.key for event in prof.key_averages()]

    # (At 64 persistent CTAs: Sm90BackwardRunsPersistent, test_sm90_backward_persistent_at_64.)
    expected = ("FlashBackwardDkDvSm90WideKernel" if head_dim > 128
                else "FlashBackwardDkDvSm90PersistentKernel" if head_dim == 64
                else "FlashBackwardDkDvSm90Kernel")
    for deterministic in (False, True):
        names = kernels_run(LIB, deterministic)
        assert any(expected in name for name in names), names
        dq_kernel = deterministic or head_dim == 256
        assert any("FlashBackwardDqSm90" in name for name in names) == dq_kernel, names
    names = kernels_run(SM80_ON_HOPPER[1])
    assert not any("Sm90" in name for name in names), names
    assert any("FlashBackwardDkDv" in name for name in names), names


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] != 9, reason="needs a 9.x GPU")
@pytest.mark.parametrize("keys,causal,deterministic,persistent", [
    (2048, True, False, True), (2049, True, False, False), (4096, False, False, True),
    (4096, True, True, True), (4096, (8, 8), False, True), (4096, (-1, 8), False, False),
    (4096, (8, -1), False, False)])
def test_sm90_backward_persistent_at_64(keys, causal, deterministic, persistent):
    """At head dim 64 the persistent dK/dV kernel runs, except with dQ fused under a mask that
    bounds one side of the window (causal: the early key blocks are the heavy ones) on more than
    2048 keys, where one CTA per key block runs (Sm90BackwardRunsPersistent). `causal`: True,
    False or a window."""
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(keys, 2, 64, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, keys], dtype=torch.int32)
    window = causal if isinstance(causal, tuple) else (-1, -1)
    kwargs = dict(dout=q, q=q, k=q, v=q, out=q, lse=torch.zeros(2, keys, device="cuda"),
                  cu_seqlens_q=cu.cuda(), cu_seqlens_k=cu.cuda(), max_seqlen_q=keys,
                  max_seqlen_k=keys, cu_seqlens_q_host=cu, cu_seqlens_k_host=cu,
                  causal=causal is True, window=window, deterministic=deterministic)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        LIB.backward(**kwargs)
        torch.cuda.synchronize()
    names = [event.key for event in prof.key_averages()]
    ran = ("FlashBackwardDkDvSm90PersistentKernel" if persistent
           else "FlashBackwardDkDvSm90Kernel")
    assert any(ran in name for name in names), names
