"""Correctness of the fallback forward kernels (kernels/fallback) on the GPU, through
libattn_capi.so, on every code path: compute_capability 70 (fp16 wmma), 75 (fp16 mma.sync
m16n8k8) and the device's own (sm80+: fp16/bf16 mma.sync m16n8k16); bf16 below sm80 and fp32
everywhere run fp32 CUDA-core math.

Each case draws fresh random inputs, poisons out/lse with NaN, and checks against a float64
reference: fp16/bf16 ||out - ref|| / ||ref|| within 2x PyTorch's own attention error on the same
inputs (plus a small floor) and under an absolute cap; fp32 within 1e-5. lse within 2e-3 (fp32:
2e-5); rows that see no key exactly 0 with lse +inf. Skipped without CUDA or the library.
Seed: $ATTN_TEST_SEED.
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

# Code paths by compute capability (0 = the device's own).
PATHS = {"sm70": 70, "sm75": 75, "native": 0}
FAMILIES = {cc: load_family("fallback", cc) for cc in PATHS.values()}

BASE_SEED = int(os.environ["ATTN_TEST_SEED"])
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
ERROR_CAP = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
ERROR_FLOOR = {torch.float16: 1e-4, torch.bfloat16: 5e-4}
FP32_TOL = 1e-5
LSE_TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-3, torch.float32: 2e-5}

# Varlen batch: empty q, empty k, seqlen_q < seqlen_k, seqlen_q > seqlen_k, equal, tiny.
VARLEN_Q = [0, 1, 17, 130, 77, 0, 300, 5]
VARLEN_K = [5, 0, 33, 130, 200, 9, 64, 5]

MASKS = {
    "none": Options(),
    "causal": Options(causal=True),
    "causal_left24": Options(causal=True, window_left=24),
    "causal_right7": Options(causal=True, window_right=7),
    "window32_32": Options(window_left=32, window_right=32),
    "window_left20": Options(window_left=20),
    "window_right5": Options(window_right=5),
    "window0_0": Options(window_left=0, window_right=0),
}


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def make_inputs(request, lens_q, lens_k, num_heads, num_heads_k, head_dim, dtype, amplitude=1.0):
    seed = (BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % (1 << 63)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total_q, total_k = sum(lens_q), sum(lens_k)

    def rand(rows, heads):
        return (torch.randn(rows, heads, head_dim, generator=gen, device="cuda") * amplitude).to(
            dtype)

    q, k, v = rand(total_q, num_heads), rand(total_k, num_heads_k), rand(total_k, num_heads_k)
    cu_q = torch.tensor([0] + list(_cumsum(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(_cumsum(lens_k)), dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def run_forward(family, q, k, v, cu_q, cu_k, opts):
    lens_q = (cu_q[1:] - cu_q[:-1]).tolist()
    lens_k = (cu_k[1:] - cu_k[:-1]).tolist()
    out = torch.full_like(q, math.nan)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, dtype=torch.float32, device="cuda")
    family.forward(q, k, v, cu_q.cuda(), cu_k.cuda(), max(lens_q, default=0),
                   max(lens_k, default=0), softmax_scale=opts.scale(q.shape[2]),
                   causal=opts.causal, window=(opts.window_left, opts.window_right),
                   softcap=opts.softcap, out=out, lse=lse, cu_seqlens_q_host=cu_q,
                   cu_seqlens_k_host=cu_k)
    torch.cuda.synchronize()
    return out, lse


def out_error_bound(q, k, v, cu_q, cu_k, opts, ref_out):
    """The relative error our out may have: 2x PyTorch's own (low precision) or FP32_TOL."""
    if q.dtype == torch.float32:
        return FP32_TOL, None
    theirs = relative_error(pytorch_low_precision(q, k, v, cu_q, cu_k, opts), ref_out)
    return min(2 * theirs + ERROR_FLOOR[q.dtype], ERROR_CAP[q.dtype]), theirs


def check(family, q, k, v, cu_q, cu_k, opts):
    out, lse = run_forward(family, q, k, v, cu_q, cu_k, opts)
    ref_out, ref_lse, seen = reference(q, k, v, cu_q, cu_k, opts)
    assert not out.isnan().any(), "out has unwritten (NaN) elements"
    assert not lse.isnan().any(), "lse has unwritten (NaN) elements"
    assert (out[~seen] == 0).all(), "rows without keys must be 0"
    assert torch.isposinf(lse[:, ~seen]).all(), "rows without keys must have lse +inf"
    if not seen.any():
        return
    assert torch.isfinite(lse[:, seen]).all()
    lse_err = (lse[:, seen].double() - ref_lse[:, seen]).abs().max().item()
    assert lse_err <= LSE_TOL[q.dtype], f"lse error {lse_err:.3g}"
    ours = relative_error(out, ref_out)
    bound, theirs = out_error_bound(q, k, v, cu_q, cu_k, opts, ref_out)
    assert ours <= bound, f"rel error {ours:.3g} > {bound:.3g} (PyTorch's: {theirs})"


dtype_param = pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
path_param = pytest.mark.parametrize("cc", PATHS.values(), ids=PATHS.keys())


@path_param
@dtype_param
@pytest.mark.parametrize("head_dim", [1, 7, 16, 32, 40, 64, 72, 100, 128, 200, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dims(request, cc, dtype, head_dim, causal):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, head_dim, dtype)
    check(FAMILIES[cc], q, k, v, cu_q, cu_k, Options(causal=causal))


@path_param
@dtype_param
@pytest.mark.parametrize("head_dim", [64, 96])
@pytest.mark.parametrize("mask", MASKS.keys())
def test_masks(request, cc, dtype, head_dim, mask):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 1, head_dim, dtype)
    check(FAMILIES[cc], q, k, v, cu_q, cu_k, MASKS[mask])


@path_param
@dtype_param
@pytest.mark.parametrize("mask", ["none", "causal", "window32_32"])
@pytest.mark.parametrize("softcap", [2.0, 30.0])
def test_softcap(request, cc, dtype, mask, softcap):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, 64, dtype,
                                      amplitude=2.0)
    opts = MASKS[mask]
    check(FAMILIES[cc], q, k, v, cu_q, cu_k,
          Options(causal=opts.causal, window_left=opts.window_left,
                  window_right=opts.window_right, softcap=softcap))


@path_param
@dtype_param
@pytest.mark.parametrize("heads", [(8, 8), (8, 4), (8, 1), (6, 3)], ids=str)
def test_gqa_mqa(request, cc, dtype, heads):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, *heads, 128, dtype)
    check(FAMILIES[cc], q, k, v, cu_q, cu_k, Options(causal=True))


@path_param
@dtype_param
@pytest.mark.parametrize("lens", [(1000, 1000), (700, 1500), (1500, 300)], ids=str)
@pytest.mark.parametrize("mask", ["none", "causal", "causal_left24"])
def test_long_sequences(request, cc, dtype, lens, mask):
    q, k, v, cu_q, cu_k = make_inputs(request, [lens[0]], [lens[1]], 2, 1, 128, dtype)
    check(FAMILIES[cc], q, k, v, cu_q, cu_k, MASKS[mask])


@path_param
@pytest.mark.parametrize("head_dim", [64, 256])
def test_large_scores_stay_finite(request, cc, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, [256, 3], [512, 700], 2, 2, head_dim,
                                      torch.bfloat16, amplitude=4.0)
    check(FAMILIES[cc], q, k, v, cu_q, cu_k, Options(softmax_scale=0.5))


@path_param
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_unaligned_rows(request, cc, dtype):
    # Tensors starting one element past a 16-byte boundary: the element-wise load path.
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, 64, dtype)

    def shifted(t):
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")
        view = buf[1:].view(t.shape)
        view.copy_(t)
        return view
    check(FAMILIES[cc], shifted(q), shifted(k), shifted(v), cu_q, cu_k, Options(causal=True))


def test_no_keys_anywhere(request):
    q, k, v, cu_q, cu_k = make_inputs(request, [3, 200], [0, 0], 2, 1, 64, torch.float16)
    out, lse = run_forward(FAMILIES[0], q, k, v, cu_q, cu_k, Options())
    assert (out == 0).all() and torch.isposinf(lse).all()


def test_batch_zero():
    q = torch.empty(0, 2, 64, dtype=torch.bfloat16, device="cuda")
    cu = torch.zeros(1, dtype=torch.int32)
    out, lse = FAMILIES[0].forward(q, q, q, cu.cuda(), cu.cuda(), 0, 0, cu_seqlens_q_host=cu,
                                   cu_seqlens_k_host=cu)
    torch.cuda.synchronize()
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)


def test_side_stream(request):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, 128, torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out, _ = FAMILIES[0].forward(q, k, v, cu_q.cuda(), cu_k.cuda(), max(VARLEN_Q),
                                     max(VARLEN_K), causal=True)
    stream.synchronize()
    ref_out, _, _ = reference(q, k, v, cu_q, cu_k, Options(causal=True))
    assert relative_error(out, ref_out) < ERROR_CAP[torch.bfloat16]


def _expect_error(match, cc=0, **overrides):
    q = torch.randn(8, 2, 64, device="cuda").to(torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    kwargs = dict(q=q, k=q, v=q, cu_seqlens_q=cu.cuda(), cu_seqlens_k=cu.cuda(), max_seqlen_q=8,
                  max_seqlen_k=8, cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
    kwargs.update(overrides)
    family = FAMILIES.get(cc) or load_family("fallback", cc)
    with pytest.raises(KernelError, match=match):
        family.forward(**kwargs)


@pytest.mark.parametrize("head_dim", [257, 512])
def test_error_head_dim(head_dim):
    q = torch.randn(8, 2, head_dim, device="cuda").to(torch.float16)
    _expect_error(r"fallback: head_dim \d+ is not supported", q=q, k=q, v=q)


def test_error_compute_capability_too_old():
    _expect_error(r"fallback: needs compute capability >= 7.0, requested 61", cc=61)


def test_error_compute_capability_newer_than_device():
    _expect_error(r"fallback: the code path of compute capability 200 cannot run", cc=200)


def test_error_heads_not_divisible():
    q = torch.randn(8, 3, 64, device="cuda").to(torch.float16)
    k = torch.randn(8, 2, 64, device="cuda").to(torch.float16)
    _expect_error("num_heads", q=q, k=k, v=k)


def test_error_max_seqlen_too_small():
    _expect_error("max_seqlen", max_seqlen_q=4)
