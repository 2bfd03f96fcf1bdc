#!/usr/bin/env python3
"""A quick timing of the cublas family (through libattn_capi.so) against PyTorch's math and
memory-efficient SDPA on a few anchor rows, forward and backward, fp32 and bf16. Equal-length
sequences (so SDPA runs on one padded-free [B, H, S, D] batch); same inputs for all; median of
CUDA-event-timed repeats after warm-ups, a row's columns timed in turns (gpu_timing.py); TFLOP/s
with FLOPs = 4 * sum(s^2) * d * heads, halved if causal, times 2.5 for the backward. Workspace: the family's own ForwardWorkspaceBytes /
BackwardWorkspaceBytes (capped at 256 MiB), allocated once outside the timing.

  python3 bench/bench_cublas.py [--markdown FILE] [--repeats N]
"""

import argparse
import datetime
import math
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "kernels" / "capi"))
import attn_capi  # noqa: E402
from gpu_timing import time_columns  # noqa: E402

# (dtype, head_dim, heads, sequences, causal)
ROWS = [
    (torch.float32, 64, 16, [1024] * 8, False),
    (torch.float32, 64, 16, [1024] * 8, True),
    (torch.float32, 128, 16, [4096] * 2, True),
    (torch.float32, 256, 8, [2048] * 4, False),
    (torch.float32, 512, 8, [2048] * 2, True),
    (torch.bfloat16, 128, 16, [4096] * 2, True),
    (torch.bfloat16, 512, 8, [2048] * 2, True),
]
def bench_row(family, dtype, head_dim, heads, lens, causal, warmup, repeats):
    batch, seq = len(lens), lens[0]
    total = batch * seq
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(total, heads, head_dim, generator=gen, device="cuda").to(dtype)
                     for _ in range(4))
    cu_host = torch.arange(0, total + 1, seq, dtype=torch.int32)
    cu = cu_host.cuda()
    scale = 1.0 / math.sqrt(head_dim)
    common = dict(softmax_scale=scale, causal=causal, cu_seqlens_q_host=cu_host,
                  cu_seqlens_k_host=cu_host)
    out, lse = family.forward(q, k, v, cu, cu, seq, seq, **common)
    fwd_ws = torch.empty(max(1, family.forward_workspace_bytes(q, k, v, out, lse, cu, cu, seq,
                                                               seq, **common)),
                         dtype=torch.uint8, device="cuda")
    grads = [torch.empty_like(t) for t in (q, k, v)]
    bwd_ws = torch.empty(family.backward_workspace_bytes(q, k, cu_host, cu_host,
                                                         dtype_code=_code(dtype)),
                         dtype=torch.uint8, device="cuda")
    result = {}
    fns = {
        "ours fwd": lambda: family.forward(q, k, v, cu, cu, seq, seq, out=out, lse=lse,
                                           workspace=fwd_ws, **common),
        "ours bwd": lambda: family.backward(dout, q, k, v, out, lse, cu, cu, seq, seq,
                                            dq=grads[0], dk=grads[1], dv=grads[2],
                                            workspace=bwd_ws, **common),
    }

    def padded(t):
        return t.view(batch, seq, heads, head_dim).transpose(1, 2)

    qp, kp, vp = (padded(t).detach().requires_grad_() for t in (q, k, v))
    dp = padded(dout)
    ref = padded(out).float()
    peers = []
    for name, backend in (("math", SDPBackend.MATH), ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def fwd(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal, scale=scale)

        def fwd_bwd(fwd=fwd):
            fwd().backward(dp)
        try:
            diff = ((fwd().float() - ref).norm() / ref.norm()).item()
            fwd_bwd()  # out of memory or an unsupported configuration shows here
        except RuntimeError as e:
            result[f"{name} error"] = str(e).splitlines()[0][:60]
            torch.cuda.empty_cache()
            continue
        result[f"{name} diff"] = diff
        fns[f"{name} fwd"] = fwd
        fns[f"{name} fwd+bwd"] = fwd_bwd
        peers.append(name)
    result.update(time_columns(fns, warmup, repeats))
    for name in peers:
        # A peer's backward is timed with its forward; the forward's time is subtracted.
        result[f"{name} bwd"] = max(result.pop(f"{name} fwd+bwd") - result[f"{name} fwd"], 1e-6)
    return result


def _code(dtype):
    return {torch.float16: attn_capi.DTYPE_FLOAT16, torch.bfloat16: attn_capi.DTYPE_BFLOAT16,
            torch.float32: attn_capi.DTYPE_FLOAT32}[dtype]


def tflops(lens, head_dim, heads, causal, ms, backward):
    f = 4 * sum(x * x for x in lens) * head_dim * heads * (0.5 if causal else 1.0)
    return f * (2.5 if backward else 1.0) / (ms * 1e-3) / 1e12


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    lib = attn_capi.AttnLibrary(attn_capi.find_library())
    family = lib.family("cublas")
    lines = [
        f"{datetime.date.today()}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"median of {args.repeats} CUDA-event timed repeats after {args.warmup} warm-ups, "
        "columns timed in turns, TFLOP/s (ms)",
        "",
        "| dtype | hdim | heads | seqs | causal | ours fwd | math fwd | efficient fwd | ours bwd "
        "| math bwd | efficient bwd | ours vs efficient out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dtype, head_dim, heads, lens, causal in ROWS:
        r = bench_row(family, dtype, head_dim, heads, lens, causal, args.warmup, args.repeats)

        def cell(name, backward):
            key = f"{name} {'bwd' if backward else 'fwd'}"
            if key not in r:
                return "–"
            ms = r[key]
            return f"{tflops(lens, head_dim, heads, causal, ms, backward):.1f} ({ms:.2f})"

        diff = r.get("efficient diff")
        lines.append(
            f"| {str(dtype).replace('torch.', '')} | {head_dim} | {heads} | {len(lens)}x{lens[0]} "
            f"| {'yes' if causal else 'no'} | {cell('ours', False)} | {cell('math', False)} "
            f"| {cell('efficient', False)} | {cell('ours', True)} | {cell('math', True)} "
            f"| {cell('efficient', True)} | {'–' if diff is None else f'{diff:.1e}'} |")
        print(lines[-1], flush=True)
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
