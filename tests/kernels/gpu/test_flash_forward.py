"""Correctness of the flash forward kernel (kernels/flash) on the GPU, through its C ABI.

Each case draws fresh random inputs, poisons out/lse with NaN, and checks against a float64
reference: ||out - ref|| / ||ref|| must be within 2x PyTorch's own fp16/bf16 attention error on
the same inputs (plus a small floor) and under an absolute cap; lse within 2e-3; rows that see
no key exactly 0 with lse +inf. On a GPU newer than sm80 every case runs both the device's own
code path (on Hopper the sm90 wgmma kernel for every head dim that rounds up to 64, 128 or 256)
and the sm80 kernel as an A100 would (compute_capability 80). Needs torch with CUDA and a
built libattn_capi.so ($ATTN_CAPI or build-gpu/lib/); skipped otherwise.

Seed: $ATTN_TEST_SEED (default: random, printed in pytest's header) fixes every case's inputs.
"""

import math
import os
import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from capi_library import PATH_SM90_FORWARD, KernelError, load_family  # noqa: E402
from oracle import Options, pytorch_low_precision, reference, relative_error  # noqa: E402

LIB = load_family("flash")
# The forward as the device runs it, and on newer GPUs also the sm80 path as an A100 would.
FORWARD_LIBS = [("device", LIB)]
if torch.cuda.get_device_capability() > (8, 0):
    FORWARD_LIBS.append(("as sm80", load_family("flash", compute_capability=80)))
SM80_ON_HOPPER = load_family("flash", disabled_paths=PATH_SM90_FORWARD)

BASE_SEED = int(os.environ["ATTN_TEST_SEED"])  # conftest.py draws one when unset
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Absolute caps on the relative error (shared/DESIGN.md) and the floor added to 2x PyTorch's.
ERROR_CAP = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
ERROR_FLOOR = {torch.float16: 1e-4, torch.bfloat16: 5e-4}
LSE_TOL = 2e-3

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


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def run_flash(q, k, v, cu_q, cu_k, opts, lib=LIB):
    lens_q = (cu_q[1:] - cu_q[:-1]).tolist()
    lens_k = (cu_k[1:] - cu_k[:-1]).tolist()
    out = torch.full_like(q, math.nan)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, dtype=torch.float32, device="cuda")
    lib.forward(q, k, v, cu_q.cuda(), cu_k.cuda(), max(lens_q, default=0),
                max(lens_k, default=0), softmax_scale=opts.scale(q.shape[2]),
                causal=opts.causal, window=(opts.window_left, opts.window_right),
                softcap=opts.softcap, out=out, lse=lse, cu_seqlens_q_host=cu_q,
                cu_seqlens_k_host=cu_k)
    torch.cuda.synchronize()
    return out, lse


def check(q, k, v, cu_q, cu_k, opts):
    ref_out, ref_lse, seen = reference(q, k, v, cu_q, cu_k, opts)
    theirs = None
    for path, lib in FORWARD_LIBS:
        out, lse = run_flash(q, k, v, cu_q, cu_k, opts, lib)
        assert not out.isnan().any(), f"{path}: out has unwritten (NaN) elements"
        assert not lse.isnan().any(), f"{path}: lse has unwritten (NaN) elements"
        # Rows that see no key: exactly 0 and +inf.
        assert (out[~seen] == 0).all(), f"{path}: rows without keys must be 0"
        assert torch.isposinf(lse[:, ~seen]).all(), f"{path}: rows without keys must have lse +inf"
        if not seen.any():
            continue
        assert torch.isfinite(lse[:, seen]).all(), path
        lse_err = (lse[:, seen].double() - ref_lse[:, seen]).abs().max().item()
        assert lse_err <= LSE_TOL, f"{path}: lse error {lse_err:.3g}"
        ours = relative_error(out, ref_out)
        if theirs is None:
            theirs = relative_error(pytorch_low_precision(q, k, v, cu_q, cu_k, opts), ref_out)
        bound = min(2 * theirs + ERROR_FLOOR[q.dtype], ERROR_CAP[q.dtype])
        assert ours <= bound, (
            f"{path}: rel error {ours:.3g} > {bound:.3g} (PyTorch's: {theirs:.3g})")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("head_dim", [8, 32, 40, 64, 72, 96, 104, 128, 136, 160, 192, 200, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dims(request, dtype, head_dim, causal):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, head_dim, dtype)
    check(q, k, v, cu_q, cu_k, Options(causal=causal))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("mask", MASKS.keys())
def test_masks(request, dtype, head_dim, mask):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 1, head_dim, dtype)
    check(q, k, v, cu_q, cu_k, MASKS[mask])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
@pytest.mark.parametrize("mask", ["none", "causal", "window32_32"])
@pytest.mark.parametrize("softcap", [2.0, 30.0])
def test_softcap(request, dtype, head_dim, mask, softcap):
    # Larger scores so the cap bends them.
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, head_dim, dtype,
                                      amplitude=2.0)
    opts = MASKS[mask]
    check(q, k, v, cu_q, cu_k, Options(causal=opts.causal, window_left=opts.window_left,
                                       window_right=opts.window_right, softcap=softcap))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("heads", [(8, 8), (8, 4), (8, 1), (6, 3)], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gqa_mqa(request, dtype, heads, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, *heads, head_dim, dtype)
    check(q, k, v, cu_q, cu_k, Options(causal=True))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("lens", [(1000, 1000), (700, 1500), (1500, 300), (129, 4097)], ids=str)
@pytest.mark.parametrize("mask", ["none", "causal", "causal_left24", "window32_32"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_long_sequences(request, dtype, lens, mask, head_dim):
    q, k, v, cu_q, cu_k = make_inputs(request, [lens[0]], [lens[1]], 2, 1, head_dim, dtype)
    check(q, k, v, cu_q, cu_k, MASKS[mask])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("mask", ["none", "causal", "window_left20"])
def test_many_blocks_per_cta(request, head_dim, mask):
    # Far more query blocks than SMs, and at most 700 keys, so the Hopper forward runs
    # persistent: each CTA runs one block after another, reusing its Q slots and continuing its
    # K/V ring, with blocks past their sequence's end and (causal, more queries than keys)
    # blocks that see no key among them.
    lens_q = [300, 0, 129, 513, 64, 1, 700]
    lens_k = [64, 5, 129, 513, 300, 1, 200]
    q, k, v, cu_q, cu_k = make_inputs(request, lens_q, lens_k, 40, 8, head_dim, torch.bfloat16)
    check(q, k, v, cu_q, cu_k, MASKS[mask])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("lens_k", [[130, 90, 200], [1100, 90, 1300]], ids=["short", "long"])
def test_non_finite_neighbour_stays_out(request, head_dim, mask, lens_k):
    # A sequence of NaN and infinities between two finite ones. Key tiles and query blocks that
    # cross a sequence's end reach into the next one's rows, which must read as zeros or be
    # masked: nothing of the poisoned sequence may reach its neighbours' answers (P = 0 times
    # an infinite V is NaN). Their answers must be bitwise those of the same batch with the
    # poisoned sequence zeroed (the forward is deterministic), which `check` holds to the
    # reference. Short keys run the Hopper forward persistent, long ones one CTA per block.
    lens_q = [77, 40, 50]
    q, k, v, cu_q, cu_k = make_inputs(request, lens_q, lens_k, 4, 2, head_dim, torch.bfloat16)
    rows_q = slice(lens_q[0], lens_q[0] + lens_q[1])
    rows_k = slice(lens_k[0], lens_k[0] + lens_k[1])
    for tensor, rows in ((q, rows_q), (k, rows_k), (v, rows_k)):
        tensor[rows] = 0
    check(q, k, v, cu_q, cu_k, MASKS[mask])
    clean = [run_flash(q, k, v, cu_q, cu_k, MASKS[mask], lib) for _, lib in FORWARD_LIBS]
    q[rows_q] = math.nan
    k[rows_k, 0] = math.nan
    k[rows_k, 1] = math.inf
    v[rows_k] = -math.inf
    keep = torch.ones(q.shape[0], dtype=torch.bool, device="cuda")
    keep[rows_q] = False
    for (path, lib), (clean_out, clean_lse) in zip(FORWARD_LIBS, clean):
        out, lse = run_flash(q, k, v, cu_q, cu_k, MASKS[mask], lib)
        assert torch.equal(out[keep], clean_out[keep]), f"{path}: a neighbour's out changed"
        assert torch.equal(lse[:, keep], clean_lse[:, keep]), f"{path}: a neighbour's lse changed"


@pytest.mark.parametrize("head_dim", [64, 128])
def test_large_scores_stay_finite(request, head_dim):
    # Scores around +-100: the online softmax must rescale without overflow.
    q, k, v, cu_q, cu_k = make_inputs(request, [256, 3], [512, 700], 2, 2, head_dim,
                                      torch.bfloat16, amplitude=4.0)
    check(q, k, v, cu_q, cu_k, Options(softmax_scale=0.5))


def test_no_keys_anywhere(request):
    q, k, v, cu_q, cu_k = make_inputs(request, [3, 200], [0, 0], 2, 1, 64, torch.float16)
    for path, lib in FORWARD_LIBS:
        out, lse = run_flash(q, k, v, cu_q, cu_k, Options(), lib)
        assert (out == 0).all() and torch.isposinf(lse).all(), path


def test_batch_zero():
    q = torch.empty(0, 2, 64, dtype=torch.bfloat16, device="cuda")
    cu = torch.zeros(1, dtype=torch.int32)
    out, lse = LIB.forward(q, q, q, cu.cuda(), cu.cuda(), 0, 0, cu_seqlens_q_host=cu,
                           cu_seqlens_k_host=cu)
    torch.cuda.synchronize()
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)


def test_empty_sequences_only(request):
    q, k, v, cu_q, cu_k = make_inputs(request, [0, 0, 0], [0, 4, 0], 2, 2, 64, torch.bfloat16)
    for path, lib in FORWARD_LIBS:
        out, lse = run_flash(q, k, v, cu_q, cu_k, Options(causal=True), lib)
        assert out.numel() == 0 and lse.numel() == 0, path


def test_side_stream(request):
    q, k, v, cu_q, cu_k = make_inputs(request, VARLEN_Q, VARLEN_K, 4, 2, 128, torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out, _ = LIB.forward(q, k, v, cu_q.cuda(), cu_k.cuda(), max(VARLEN_Q), max(VARLEN_K),
                             causal=True)
    stream.synchronize()
    ref_out, _, _ = reference(q, k, v, cu_q, cu_k, Options(causal=True))
    assert relative_error(out, ref_out) < ERROR_CAP[torch.bfloat16]


def _expect_error(match, **overrides):
    q = torch.randn(8, 2, 64, device="cuda").to(torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    kwargs = dict(q=q, k=q, v=q, cu_seqlens_q=cu.cuda(), cu_seqlens_k=cu.cuda(), max_seqlen_q=8,
                  max_seqlen_k=8, cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
    kwargs.update(overrides)
    with pytest.raises(KernelError, match=match):
        LIB.forward(**kwargs)


def test_error_fp32():
    q = torch.randn(8, 2, 64, device="cuda")
    _expect_error("flash: fp32 is not supported", q=q, k=q, v=q)


@pytest.mark.parametrize("head_dim", [12, 260, 512])
def test_error_head_dim(head_dim):
    q = torch.randn(8, 2, head_dim, device="cuda").to(torch.float16)
    _expect_error("head_dim", q=q, k=q, v=q)


def test_error_misaligned():
    buf = torch.randn(8 * 2 * 64 + 1, device="cuda").to(torch.float16)
    q = buf[1:].view(8, 2, 64)
    _expect_error("16-byte aligned", q=q)


def test_error_heads_not_divisible():
    q = torch.randn(8, 3, 64, device="cuda").to(torch.float16)
    k = torch.randn(8, 2, 64, device="cuda").to(torch.float16)
    _expect_error("num_heads", q=q, k=k, v=k)


def test_error_max_seqlen_too_small():
    _expect_error("max_seqlen", max_seqlen_q=4)


def _forward_kernels(lib, head_dim, max_seqlen_k):
    """Names of the CUDA kernels one forward ran (PyTorch's profiler), for 2 x 1000 tokens."""
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(2000, 4, head_dim, device="cuda").to(torch.bfloat16)
    cu = torch.tensor([0, 1000, 2000], dtype=torch.int32)

    def call():
        lib.forward(q, q, q, cu.cuda(), cu.cuda(), 1000, max_seqlen_k, cu_seqlens_q_host=cu,
                    cu_seqlens_k_host=cu)
        torch.cuda.synchronize()

    call()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
    return [event.key for event in prof.key_averages()]


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] != 9, reason="needs a 9.x GPU")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sm90_forward_choice(head_dim):
    """Hopper: the wgmma forward runs whatever the lengths (when this build has it: sm_90
    targeted, the head dim in ATTN_HEAD_DIMS), persistent up to 2048 keys at head dim 64 and 1024
    above, one CTA per query block beyond (kernels/flash/tile_config.h, Sm90ForwardPersistent);
    disabling PATH_SM90_FORWARD switches it off."""
    bound = 2048 if head_dim == 64 else 1024

    def sm90_kernels(lib, max_seqlen_k):
        names = _forward_kernels(lib, head_dim, max_seqlen_k)
        assert any("FlashForward" in name for name in names), names
        return {kernel for kernel in ("FlashForwardSm90Kernel", "FlashForwardSm90PersistentKernel")
                if any(kernel in name for name in names)}

    assert sm90_kernels(LIB, 1000) == {"FlashForwardSm90PersistentKernel"}
    assert sm90_kernels(LIB, bound) == {"FlashForwardSm90PersistentKernel"}
    assert sm90_kernels(LIB, bound + 1) == {"FlashForwardSm90Kernel"}
    assert sm90_kernels(LIB, 8192) == {"FlashForwardSm90Kernel"}
    assert not sm90_kernels(SM80_ON_HOPPER, 1000)
    assert not sm90_kernels(SM80_ON_HOPPER, 8192)
