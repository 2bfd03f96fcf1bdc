"""Routing end to end on the GPU machine (scripts/gpu_e2e.sh starts the servers): every request
lands on the family the routing table names for the device and is answered correctly.

- ATTNSERVE_GPU_TARGET: the H100 as itself (--max_head_dim=512).
- ATTNSERVE_GPU_EMULATED_TARGET: the same GPU under --emulate_compute_capability=7.5, served as a
  Turing GPU would be: flash (Turing variant) for fp16 head_dim <= 64, fallback for the rest.
- ATTNSERVE_GPU_SM86_TARGET: the same GPU under --emulate_compute_capability=8.6, whose blocks
  get 99 KB of shared memory: flash where its kernel fits (forward up to head_dim 128, backward
  up to 96), fallback for larger head dims.
- ATTNSERVE_GPU_CUBLAS_TARGET: --kernel=cublas --max_head_dim=512, every request on cuBLAS.
Skipped where the variables are unset (CI has no GPU)."""
import os
import re

import numpy as np
import pytest
from ml_dtypes import bfloat16

import attnserve
from attnserve import reference
from attnserve._proto.attnserve.v1 import attention_pb2 as pb2

TARGETS = {
    "native": os.environ.get("ATTNSERVE_GPU_TARGET"),
    "sm75": os.environ.get("ATTNSERVE_GPU_EMULATED_TARGET"),
    "sm86": os.environ.get("ATTNSERVE_GPU_SM86_TARGET"),
    "cublas": os.environ.get("ATTNSERVE_GPU_CUBLAS_TARGET"),
}
DTYPES = {"fp16": np.float16, "bf16": bfloat16, "fp32": np.float32}
# Relative error against float64 for outputs and gradients: the kernels round inputs and P to the
# request's dtype (fp32 stays fp32 throughout).
TOLERANCE = {"fp16": 4e-3, "bf16": 2.5e-2, "fp32": 1e-4}


def server(name):
    if not TARGETS[name]:
        pytest.skip(f"needs the {name} GPU server (scripts/gpu_e2e.sh)")
    return attnserve.Client(TARGETS[name], timeout=120)


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def rel_error(got, want):
    got = np.asarray(got, dtype=np.float64)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), "non-finite entries differ"
    return np.linalg.norm(got[finite] - want[finite]) / max(np.linalg.norm(want[finite]), 1e-30)


def check_round_trip(client, dtype, head_dim, want_family, *, seqlens_q=(70, 33), seqlens_k=None,
                     heads=4, heads_k=2, **options):
    """Forward then backward on the server; both ran on cuda:0 with want_family (or, given a
    pair, the forward with the first and the backward with the second) and match the float64
    reference."""
    forward_family, backward_family = (
        want_family if isinstance(want_family, tuple) else (want_family, want_family))
    seqlens_k = seqlens_k or seqlens_q
    rng = np.random.default_rng()
    np_dtype = DTYPES[dtype]
    q = rng.standard_normal((sum(seqlens_q), heads, head_dim)).astype(np_dtype)
    k = rng.standard_normal((sum(seqlens_k), heads_k, head_dim)).astype(np_dtype)
    v = rng.standard_normal((sum(seqlens_k), heads_k, head_dim)).astype(np_dtype)
    cu_q, cu_k = offsets(seqlens_q), offsets(seqlens_k)
    forward = client.forward(q, k, v, cu_q, cu_k, **options)
    assert (forward.execution.device, forward.execution.kernel) == ("cuda:0", forward_family)
    assert forward.execution.code_path.startswith(forward_family + "/")  # e.g. "flash/sm90"
    want_out, want_lse = reference.attention_forward(q, k, v, cu_q, cu_k, **options)
    assert rel_error(forward.out, want_out) <= TOLERANCE[dtype]
    assert rel_error(forward.lse, want_lse) <= 1e-4
    dout = rng.standard_normal(q.shape).astype(np_dtype)
    backward = client.backward(dout, q, k, v, forward.out, forward.lse, cu_q, cu_k, **options)
    assert (backward.execution.device, backward.execution.kernel) == ("cuda:0", backward_family)
    assert backward.execution.code_path.startswith(backward_family + "/")
    want = reference.attention_backward(dout, q, k, v, forward.out, forward.lse, cu_q, cu_k,
                                        **options)
    for name, got, exp in zip(("dq", "dk", "dv"), (backward.dq, backward.dk, backward.dv), want):
        err = rel_error(got, exp)
        assert err <= 2 * TOLERANCE[dtype], f"{name}: relative error {err}"


@pytest.mark.parametrize("dtype,head_dim,family", [
    ("bf16", 64, "flash"),
    ("fp16", 40, "flash"),      # a multiple of 8: flash rounds it up to an instantiated size
    ("fp16", 36, "fallback"),   # not a multiple of 8
    ("fp32", 64, "fallback"),   # flash has no fp32
    ("fp16", 256, "flash"),     # forward and backward up to 256
    ("bf16", 320, "cublas"),    # past the tiled kernels' 256
])
def test_native_device_routes_each_request_to_its_family(dtype, head_dim, family):
    with server("native") as client:
        check_round_trip(client, dtype, head_dim, family, causal=True)


def test_emulated_turing_reports_both_capabilities_and_its_routes():
    with server("sm75") as client:
        info = client.server_info()
    device = info.devices[0]
    assert (device.compute_capability, device.native_compute_capability) == ("7.5", "9.0")
    # nvidia-smi's spelling of the GPU's UUID (co-located clients match their GPU by it).
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", device.uuid), device.uuid
    first = device.routes[0]
    assert (first.family, first.direction, first.max_head_dim) == ("flash", "forward", 64)
    assert list(first.dtypes) == [pb2.DTYPE_FLOAT16]
    assert {r.family for r in device.routes} >= {"flash", "fallback"}


@pytest.mark.parametrize("dtype,head_dim,family,options", [
    ("fp16", 128, "fallback", {"causal": True}),   # the case: hdim-128 backward on sm75
    ("fp16", 64, "flash", {"causal": True}),       # Turing flash
    ("fp16", 32, "flash", {"window_size": (16, 4), "softcap": 15.0}),
    ("bf16", 64, "fallback", {}),                  # Turing has no bf16 tensor cores
    ("fp32", 96, "fallback", {"window_size": (20, 0)}),
    ("fp16", 200, "fallback", {}),
])
def test_emulated_turing_serves_like_a_turing_gpu(dtype, head_dim, family, options):
    with server("sm75") as client:
        check_round_trip(client, dtype, head_dim, family, **options)


@pytest.mark.parametrize("dtype,head_dim,family", [
    ("bf16", 96, "flash"),                     # forward 40 KB, backward 88 KB: both fit
    ("bf16", 128, ("flash", "fallback")),      # the backward needs 121 KB
    ("fp16", 192, "fallback"),                 # the forward needs 100 KB (backward 119 KB)
])
def test_emulated_sm86_sends_what_flash_cannot_fit_to_fallback(dtype, head_dim, family):
    with server("sm86") as client:
        check_round_trip(client, dtype, head_dim, family, causal=True)


def test_emulated_sm86_routes_show_the_cut_head_dims():
    with server("sm86") as client:
        device = client.server_info().devices[0]
    assert device.shared_memory_per_block == 99 * 1024
    flash = {r.direction: r for r in device.routes if r.family == "flash"}
    assert (flash["forward"].max_head_dim, flash["backward"].max_head_dim) == (128, 96)
    assert "99 KB of shared memory" in flash["backward"].reason


@pytest.mark.parametrize("dtype,head_dim", [("fp32", 320), ("bf16", 64), ("fp16", 7)])
def test_forced_cublas_family_answers_everything(dtype, head_dim):
    with server("cublas") as client:
        check_round_trip(client, dtype, head_dim, "cublas", causal=True,
                         seqlens_q=(90, 0, 41), seqlens_k=(120, 5, 41))


# Dropout and ALiBi on a GPU: the mask is the reference's (kernels/dropout_mask.h), so the
# float64 reference with the same seed checks every element. Each family that serves them is the
# route somewhere: flash's sm80 kernels for fp16/bf16 on sm80+ (on the H100 too: its sm90 kernels
# do not take them), fallback for fp32 and on Turing, cuBLAS past the tiled families' head dims.
DROPOUT_ALIBI_OPTIONS = pytest.mark.parametrize("options", [
    dict(causal=True, dropout_p=0.2, dropout_seed=12345),
    dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32)),
    dict(window_size=(40, 3), dropout_p=0.35, dropout_seed=7,
         alibi_slopes=np.array([[0.3, 0.2, 0.1, 0.05], [0.02, 0.04, 0.08, 0.16]], np.float32)),
], ids=["dropout-causal", "alibi", "window-dropout-alibi-per-sequence"])


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@DROPOUT_ALIBI_OPTIONS
def test_dropout_and_alibi_run_on_flash_or_fallback(dtype, options):
    with server("native") as client:
        check_round_trip(client, dtype, 64, "fallback" if dtype == "fp32" else "flash",
                         seqlens_q=(70, 33), seqlens_k=(90, 21), **options)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@DROPOUT_ALIBI_OPTIONS
def test_dropout_and_alibi_run_on_cublas(dtype, options):
    with server("native") as client:
        check_round_trip(client, dtype, 320, "cublas", seqlens_q=(70, 33), seqlens_k=(90, 21),
                         **options)


# On a Turing GPU flash's Turing variant takes neither: fp16 head_dim 64 goes to fallback, as do
# head_dim 128 and bf16/fp32, which are past Turing flash anyway.
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@DROPOUT_ALIBI_OPTIONS
def test_dropout_and_alibi_run_on_fallback_on_turing(dtype, options):
    with server("sm75") as client:
        check_round_trip(client, dtype, 128, "fallback", seqlens_q=(70, 33), seqlens_k=(90, 21),
                         **options)


def test_emulated_turing_sends_fp16_dropout_past_flash_to_fallback():
    with server("sm75") as client:
        check_round_trip(client, "fp16", 64, "fallback", causal=True, dropout_p=0.25,
                         dropout_seed=99, alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625],
                                                                np.float32))
