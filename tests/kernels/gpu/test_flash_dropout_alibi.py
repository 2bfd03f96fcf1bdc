"""Dropout and ALiBi in the flash family (its sm80 kernels, which Hopper runs for such requests)
on the GPU, through its C ABI, against the float64 NumPy reference (client/python/attnserve/
reference.py, the contract's other implementation).

- Values: out and lse, then dq/dk/dv in both backward modes, on small varlen batches (fp16 and
  bf16, head dims 64 and 128, causal / full / window, GQA, per-head and per-sequence slopes,
  first_sequence != 0): relative errors within the plain flash tests' absolute caps
  (test_flash_forward.py ERROR_CAP, test_flash_backward.py GRAD_CAP), lse within 2e-3,
  unwritten (NaN-poisoned) elements and deterministic-mode bit differences fail.
- The mask itself, exactly: with V's key j row the unit vector e_j, out[i, j] = P_ij Z_ij, so
  out's zero pattern is the mask; with dO's row i the unit vector e_i, dV[j, i] = P_ij Z_ij, so
  the dK/dV kernel's is too. Both must equal the reference's keep mask element for element.
- Paths: on Hopper the default family and the one with the sm90 paths disabled run the same
  sm80 kernels (bitwise equal results); on a GPU newer than sm80 the backward also runs as an
  A100 would (compute_capability 80: the narrow dK/dV kernels, 16 keys per warp at head dim 64);
  the Turing path refuses these options with a message.
Needs torch with CUDA and a built libattn_capi.so; skipped otherwise. Seed: $ATTN_TEST_SEED.
"""

import math
import os
import pathlib
import sys
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "client" / "python"))
from attnserve import reference as npref  # noqa: E402
from capi_library import (PATH_SM90_BACKWARD, PATH_SM90_FORWARD, KernelError,  # noqa: E402
                          load_family)

LIB = load_family("flash")
SM80 = load_family("flash", disabled_paths=PATH_SM90_FORWARD | PATH_SM90_BACKWARD)
HOPPER = torch.cuda.get_device_capability()[0] == 9
# The backward as the device runs it (the wide dK/dV kernels on the H100), and as an A100 would.
BACKWARD_LIBS = [("device", LIB)]
if torch.cuda.get_device_capability() > (8, 0):
    BACKWARD_LIBS.append(("as sm80", load_family("flash", compute_capability=80)))
BASE_SEED = int(os.environ["ATTN_TEST_SEED"])
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ERROR_CAP = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2}  # test_flash_forward.py's
GRAD_CAP = {torch.float16: 1e-2, torch.bfloat16: 5e-2}     # test_flash_backward.py's
LSE_TOL = 2e-3

# Varlen batch: empty q, empty k, seqlen_q < seqlen_k, seqlen_q > seqlen_k, several key tiles.
LENS_Q = [0, 1, 17, 130, 77, 0, 200, 5]
LENS_K = [5, 0, 33, 130, 200, 9, 64, 5]
MASKS = {"full": (False, (-1, -1)), "causal": (True, (-1, -1)), "window": (False, (24, 7))}


def _seed(request, salt=0):
    return (BASE_SEED + zlib.crc32(request.node.nodeid.encode()) + salt) % (1 << 63)


def _cu(lens):
    return torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)


def make_case(request, dtype, head_dim, heads=4, heads_k=2, amplitude=1.0):
    gen = torch.Generator(device="cuda").manual_seed(_seed(request))

    def rand(rows, h):
        return (torch.randn(rows, h, head_dim, generator=gen, device="cuda") * amplitude).to(dtype)

    q, k, v = rand(sum(LENS_Q), heads), rand(sum(LENS_K), heads_k), rand(sum(LENS_K), heads_k)
    dout = rand(sum(LENS_Q), heads)
    return q, k, v, dout, _cu(LENS_Q), _cu(LENS_K)


def make_slopes(kind, batch, heads, first_sequence):
    """ALiBi slopes on the GPU: None, [H] or [first_sequence + batch, H] (the request's rows)."""
    if kind is None:
        return None
    base = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
    if kind == "per_sequence":
        rows = first_sequence + batch
        base = base[None, :] * torch.linspace(0.5, 2.0, rows)[:, None]
    return base.to(torch.float32).contiguous().cuda()


def reference_call(fn, *args, cu_q, cu_k, first_sequence, slopes, **kwargs):
    """The reference with first_sequence: its sequences are indexed from 0, so the launch's
    sequence b is the reference's first_sequence + b behind first_sequence empty ones."""
    pad = [0] * first_sequence
    cu_q = pad + cu_q.tolist()
    cu_k = pad + cu_k.tolist()
    host = lambda t: None if t is None else t.double().cpu().numpy()  # noqa: E731
    return fn(*[host(a) if isinstance(a, torch.Tensor) else a for a in args], cu_q, cu_k,
              alibi_slopes=host(slopes), **kwargs)


def relative_error(x, ref):
    ref = np.asarray(ref)
    diff = np.linalg.norm(x.double().cpu().numpy() - ref)
    norm = np.linalg.norm(ref)
    return diff / norm if norm > 0 else diff


def gradient_error(g, ref, term_scale):
    """tests/python/cases.py's gradient_error for 16-bit gradients: relative to the reference,
    never to less than a quarter of the term scale (where dS's terms cancel)."""
    diff = np.linalg.norm(g.double().cpu().numpy() - ref)
    return diff / max(np.linalg.norm(ref), np.linalg.norm(term_scale) / 4, 1e-300)


def run_forward(lib, q, k, v, cu_q, cu_k, causal, window, **extras):
    out = torch.full_like(q, math.nan)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, dtype=torch.float32, device="cuda")
    lib.forward(q, k, v, cu_q.cuda(), cu_k.cuda(), max(LENS_Q + [0]), max(LENS_K + [0]),
                causal=causal, window=window, out=out, lse=lse, cu_seqlens_q_host=cu_q,
                cu_seqlens_k_host=cu_k, **extras)
    torch.cuda.synchronize()
    return out, lse


def run_backward(lib, dout, q, k, v, out, lse, cu_q, cu_k, causal, window, deterministic,
                 **extras):
    grads = [torch.full_like(t, math.nan) for t in (q, k, v)]
    lib.backward(dout, q, k, v, out, lse, cu_q.cuda(), cu_k.cuda(), max(LENS_Q + [0]),
                 max(LENS_K + [0]), causal=causal, window=window, deterministic=deterministic,
                 dq=grads[0], dk=grads[1], dv=grads[2], cu_seqlens_q_host=cu_q,
                 cu_seqlens_k_host=cu_k, **extras)
    torch.cuda.synchronize()
    return grads


def check(request, dtype, head_dim, mask, dropout_p, alibi, first_sequence=0, heads=4,
          heads_k=2, softcap=0.0):
    causal, window = MASKS[mask]
    q, k, v, dout, cu_q, cu_k = make_case(request, dtype, head_dim, heads, heads_k,
                                          amplitude=2.0 if softcap else 1.0)
    slopes = make_slopes(alibi, len(LENS_Q), heads, first_sequence)
    seed = _seed(request, 7) | 1
    extras = dict(dropout_p=dropout_p, dropout_seed=seed, alibi_slopes=slopes,
                  first_sequence=first_sequence)
    opts = dict(causal=causal, window_size=window, softcap=softcap, dropout_p=dropout_p,
                dropout_seed=seed)
    where = dict(cu_q=cu_q, cu_k=cu_k, first_sequence=first_sequence, slopes=slopes)
    ref_out, ref_lse = reference_call(npref.attention_forward, q, k, v, **where, **opts)

    out, lse = run_forward(LIB, q, k, v, cu_q, cu_k, causal, window, softcap=softcap, **extras)
    assert not out.isnan().any() and not lse.isnan().any(), "unwritten out/lse"
    if HOPPER:
        # The default family must have run the sm80 kernels, as the one without sm90 paths does.
        out80, lse80 = run_forward(SM80, q, k, v, cu_q, cu_k, causal, window, softcap=softcap,
                                   **extras)
        assert torch.equal(out, out80) and torch.equal(lse, lse80), "Hopper took another path"
    seen = np.isfinite(ref_lse)
    assert np.array_equal(torch.isfinite(lse).cpu().numpy(), seen), "rows seeing no key"
    lse_err = np.abs(lse.double().cpu().numpy()[seen] - ref_lse[seen]).max()
    assert lse_err <= LSE_TOL, f"lse error {lse_err:.3g}"
    err = relative_error(out, ref_out)
    assert err <= ERROR_CAP[dtype], f"out: rel error {err:.3g} > {ERROR_CAP[dtype]}"

    refs = reference_call(npref.attention_backward, dout, q, k, v, ref_out, ref_lse, **where,
                          **opts)
    scales = reference_call(npref.attention_backward_term_scales, dout, q, k, v, ref_out,
                            ref_lse, **where, **opts)
    for path, lib in BACKWARD_LIBS:
        for deterministic in (False, True):
            mode = f"{'deterministic' if deterministic else 'atomic'}, {path}"
            grads = run_backward(lib, dout, q, k, v, out, lse, cu_q, cu_k, causal, window,
                                 deterministic, softcap=softcap, **extras)
            for name, g, ref, scale in zip(("dq", "dk", "dv"), grads, refs, scales):
                assert not g.isnan().any(), f"{name} ({mode}): unwritten elements"
                e = gradient_error(g, ref, scale)
                assert e <= GRAD_CAP[dtype], f"{name} ({mode}): rel error {e:.3g}"
            if deterministic:
                again = run_backward(lib, dout, q, k, v, out, lse, cu_q, cu_k, causal, window,
                                     True, softcap=softcap, **extras)
                assert all(torch.equal(a, b) for a, b in zip(grads, again)), f"{mode}: not bitwise"


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask", MASKS.keys())
@pytest.mark.parametrize("dropout_p,alibi", [(0.3, None), (0.0, "per_head"),
                                             (0.17, "per_sequence")],
                         ids=["dropout", "alibi", "both"])
def test_values(request, dtype, head_dim, mask, dropout_p, alibi):
    check(request, dtype, head_dim, mask, dropout_p, alibi)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("head_dim", [64, 128])
def test_first_sequence_and_mqa(request, dtype, head_dim):
    # Slopes of rows 3.. of a [3 + batch, H] tensor and the mask of sequences 3.., one kv head.
    check(request, dtype, head_dim, "causal", 0.25, "per_sequence", first_sequence=3, heads=4,
          heads_k=1)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_softcap(request, dtype):
    # ALiBi shifts the capped score, and its derivative is softcap's alone.
    check(request, dtype, 128, "window", 0.2, "per_head", softcap=5.0)


def _unit_rows(rows, heads, head_dim, dtype):
    """[rows, heads, head_dim] with row r the unit vector e_r in every head."""
    x = torch.zeros(rows, heads, head_dim, dtype=dtype, device="cuda")
    x[torch.arange(rows), :, torch.arange(rows)] = 1
    return x


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("path", range(len(BACKWARD_LIBS)),
                         ids=[name for name, _ in BACKWARD_LIBS])
def test_mask_is_the_contracts(request, head_dim, causal, deterministic, path):
    """out = P Z V with V = I shows Z; dV = (P Z)^T dO with dO = I shows it again."""
    gen = torch.Generator(device="cuda").manual_seed(_seed(request))
    heads, heads_k, first_sequence, p = 4, 2, 5, 0.4
    lens_q = [head_dim, 37, head_dim - 3]
    lens_k = [head_dim, head_dim - 9, 50]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    dtype = torch.float16
    # Small scores: P is near uniform, so every visible kept element is far from 0.
    q = (torch.randn(sum(lens_q), heads, head_dim, generator=gen, device="cuda") * 0.1).to(dtype)
    k = (torch.randn(sum(lens_k), heads_k, head_dim, generator=gen, device="cuda") * 0.1).to(
        dtype)
    v = torch.cat([_unit_rows(n, heads_k, head_dim, dtype) for n in lens_k])
    dout = torch.cat([_unit_rows(n, heads, head_dim, dtype) for n in lens_q])
    seed = _seed(request, 11) | (1 << 40)  # the key's high word matters too
    extras = dict(dropout_p=p, dropout_seed=seed, first_sequence=first_sequence)
    out = torch.full_like(q, math.nan)
    lse = torch.full((heads, q.shape[0]), math.nan, dtype=torch.float32, device="cuda")
    hosts = dict(cu_seqlens_q_host=cu_q, cu_seqlens_k_host=cu_k)
    LIB.forward(q, k, v, cu_q.cuda(), cu_k.cuda(), max(lens_q), max(lens_k), causal=causal,
                out=out, lse=lse, **hosts, **extras)
    grads = [torch.full_like(t, math.nan) for t in (q, k, v)]
    BACKWARD_LIBS[path][1].backward(
        dout, q, k, v, out, lse, cu_q.cuda(), cu_k.cuda(), max(lens_q), max(lens_k),
        causal=causal, deterministic=deterministic, dq=grads[0], dk=grads[1], dv=grads[2],
        **hosts, **extras)
    torch.cuda.synchronize()
    out, dv = out.cpu(), grads[2].float().cpu()
    group = heads // heads_k
    cq, ck = cu_q.tolist(), cu_k.tolist()
    dropped_somewhere = False
    for b in range(len(lens_q)):
        sq, sk = lens_q[b], lens_k[b]
        keep = npref.dropout_keep(seed, first_sequence + b, heads, sq, sk, p)  # [H, sq, sk]
        visible = npref.visible_mask(sq, sk, causal, (-1, -1))
        expected = keep & visible[None]
        got = out[cq[b]:cq[b + 1], :, :sk].permute(1, 0, 2).numpy() != 0  # [H, sq, sk]
        bad = np.argwhere(got != expected)
        assert bad.size == 0, f"forward mask differs in sequence {b} at [h, i, j] {bad[:5]}"
        # dV[j, kv head, i] sums P Z over the kv head's query heads: nonzero iff any keeps it.
        got_t = dv[ck[b]:ck[b + 1], :, :sq].numpy() != 0  # [sk, Hk, sq]
        expected_t = expected.reshape(heads_k, group, sq, sk).any(axis=1).transpose(2, 0, 1)
        bad = np.argwhere(got_t != expected_t)
        assert bad.size == 0, f"dV mask differs in sequence {b} at [j, kv head, i] {bad[:5]}"
        dropped_somewhere |= bool((visible[None] & ~keep).any())
    assert dropped_somewhere


def test_zero_dropout_and_no_slopes_match_plain(request):
    """The extras kernels with both off compute what the plain kernels do (on Hopper: the sm80
    plain kernels, which is what they replace)."""
    q, k, v, dout, cu_q, cu_k = make_case(request, torch.bfloat16, 128)
    plain = run_forward(SM80, q, k, v, cu_q, cu_k, True, (-1, -1))
    zero_slopes = torch.zeros(4, dtype=torch.float32, device="cuda")
    extra = run_forward(LIB, q, k, v, cu_q, cu_k, True, (-1, -1), alibi_slopes=zero_slopes)
    assert torch.equal(plain[0], extra[0]) and torch.equal(plain[1], extra[1])


def test_turing_path_refuses():
    turing = load_family("flash", compute_capability=75)
    q = torch.zeros(8, 2, 64, dtype=torch.float16, device="cuda")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    slopes = torch.ones(2, dtype=torch.float32, device="cuda")
    for extras in (dict(dropout_p=0.1, dropout_seed=1), dict(alibi_slopes=slopes)):
        with pytest.raises(KernelError, match="dropout or ALiBi"):
            turing.forward(q, q, q, cu.cuda(), cu.cuda(), 8, 8, cu_seqlens_q_host=cu,
                           cu_seqlens_k_host=cu, **extras)
        with pytest.raises(KernelError, match="dropout or ALiBi"):
            turing.backward(q, q, q, q, q, torch.zeros(2, 8, device="cuda"), cu.cuda(),
                            cu.cuda(), 8, 8, cu_seqlens_q_host=cu, cu_seqlens_k_host=cu,
                            **extras)


def test_bad_dropout_p_is_refused():
    q = torch.zeros(8, 2, 64, dtype=torch.float16, device="cuda")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(KernelError, match="dropout_p"):
        LIB.forward(q, q, q, cu.cuda(), cu.cuda(), 8, 8, cu_seqlens_q_host=cu,
                    cu_seqlens_k_host=cu, dropout_p=1.0, dropout_seed=1)
