#!/usr/bin/env python3
"""Forward (or, with --backward, backward) attention throughput on the GPU: our flash kernels
(through libattn_capi.so) against PyTorch's FlashAttention-2 varlen and cuDNN SDPA, on
the rows of shared/anchors/h100.md. Same bf16 inputs for all; median of CUDA-event-timed
repeats after warm-ups, the columns of a row timed in turns (time_columns); TFLOP/s with
FLOPs = 4 * sum(sq * sk) * d * heads, halved if causal, times 2.5 for the backward.

  python3 bench/bench_flash.py [--backward] [--lib NAME=PATH ...] [--markdown FILE]
  python3 bench/bench_flash.py --turing [--backward] ...

--turing times the flash family's Turing (sm75) path instead, run on this GPU with
compute_capability 75 (fp16, head dim 64 rows only), beside our sm80 path on the same fp16
inputs and PyTorch's memory-efficient attention (the kernel PyTorch runs on Turing).

Several --lib give one column per build (e.g. tile-size variants); the first is "ours" in the
ratio columns. NAME=PATH@CC runs that library's code path for compute capability CC (e.g.
ours-sm80=PATH@80 times the sm80 kernel on a Hopper GPU beside the sm90 one);
NAME=PATH+OFF disables a code path for that column's calls (OFF: a key of attn_capi.PATH_NAMES,
e.g. ours-sm80bwd=PATH+no-sm90-bwd times the sm80 backward on a Hopper GPU). Prints a markdown
table; --markdown also writes it to FILE.
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
from gpu_timing import add_throughputs, flops, seq_name  # noqa: E402

# (head_dim, heads) x sequence-length sets x causal, as in shared/anchors/h100.md (hdim 192 has
# no anchor rows; it takes the hdim-256 rows' 8 heads).
HEAD_CONFIGS = [(64, 32), (128, 16), (192, 8), (256, 8)]
SEQUENCE_SETS = [
    [512] * 32,
    [2048] * 8,
    [8192] * 2,
    [16384],
    [100, 3000, 700, 5000, 1200, 6384],
]


def fa2_varlen(q, k, v, cu, max_len, causal, scale):
    return torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, max_len, max_len, 0.0, causal, False, scale=scale)[0]


def bench_row(libs, head_dim, heads, lens, causal, warmup, repeats):
    total = sum(lens)
    max_len = max(lens)
    scale = 1.0 / math.sqrt(head_dim)
    q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    cu_host = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))],
                           dtype=torch.int32)
    cu = cu_host.cuda()
    work = flops(lens, head_dim, heads, causal)
    row = {"hdim": head_dim, "heads": heads, "seqs": seq_name(lens), "causal": causal}

    reference = fa2_varlen(q, k, v, cu, max_len, causal, scale)
    out = torch.empty_like(q)
    lse = torch.empty(heads, total, dtype=torch.float32, device="cuda")
    fns = {}
    for name, lib in libs.items():
        def ours(lib=lib):
            lib.forward(q, k, v, cu, cu, max_len, max_len, softmax_scale=scale, causal=causal,
                        out=out, lse=lse)
        ours()
        torch.cuda.synchronize()
        # Sanity on the benchmark inputs: agreement with FA2 (both bf16-rounded).
        row[f"{name}_diff"] = ((out.float() - reference.float()).norm() /
                               reference.float().norm()).item()
        fns[name] = ours
    fns["fa2"] = lambda: fa2_varlen(q, k, v, cu, max_len, causal, scale)
    row["cudnn"] = None
    if all(x == lens[0] for x in lens):
        shape = (len(lens), lens[0], heads, head_dim)
        q4, k4, v4 = (t.view(shape).transpose(1, 2) for t in (q, k, v))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, scale=scale)
        try:
            cudnn()
            fns["cudnn"] = cudnn
        except RuntimeError as err:  # cuDNN refused the shape
            print(f"cuDNN unavailable for {row['seqs']}: {err}", file=sys.stderr)
    add_throughputs(row, fns, work, warmup, repeats)
    return row


def fa2_varlen_backward_fn(q, k, v, dout, cu, max_len, causal, scale):
    """FA2 varlen backward on its own forward's out and lse, as a callable."""
    out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, max_len, max_len, 0.0, causal, False, scale=scale)

    def run():
        return torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse, cu, cu, max_len, max_len, 0.0, causal, seed, offset,
            scale=scale)
    return run


def bench_row_backward(libs, head_dim, heads, lens, causal, warmup, repeats,
                       modes=(False, True)):
    total = sum(lens)
    max_len = max(lens)
    scale = 1.0 / math.sqrt(head_dim)
    q, k, v, dout = (torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    cu_host = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))],
                           dtype=torch.int32)
    cu = cu_host.cuda()
    work = 2.5 * flops(lens, head_dim, heads, causal)
    row = {"hdim": head_dim, "heads": heads, "seqs": seq_name(lens), "causal": causal}

    fa2 = fa2_varlen_backward_fn(q, k, v, dout, cu, max_len, causal, scale)
    ref_dq = fa2()[0]
    fns = {}
    for name, lib in libs.items():
        out, lse = lib.forward(q, k, v, cu, cu, max_len, max_len, softmax_scale=scale,
                               causal=causal)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        workspace = torch.empty(max(1, lib.backward_workspace_bytes(q, k, cu, cu)),
                                dtype=torch.uint8, device="cuda")

        # Default (atomic dQ) and deterministic mode, as columns NAME and NAME-det.
        for deterministic in modes:
            column = f"{name}-det" if deterministic else name
            def ours(lib=lib, out=out, lse=lse, dq=dq, dk=dk, dv=dv, workspace=workspace,
                     deterministic=deterministic):
                lib.backward(dout, q, k, v, out, lse, cu, cu, max_len, max_len,
                             softmax_scale=scale, causal=causal, dq=dq, dk=dk, dv=dv,
                             workspace=workspace, deterministic=deterministic)
            try:
                ours()
            except attn_capi.KernelError as err:
                print(f"{column}: {err}", file=sys.stderr)
                row[column], row[f"{column}_diff"] = None, math.nan
                continue
            torch.cuda.synchronize()
            row[f"{column}_diff"] = ((dq.float() - ref_dq.float()).norm() /
                                     ref_dq.float().norm()).item()
            fns[column] = ours
    fns["fa2"] = fa2
    row["cudnn"] = None
    if all(x == lens[0] for x in lens):
        shape = (len(lens), lens[0], heads, head_dim)
        q4, k4, v4 = (t.view(shape).transpose(1, 2).detach().requires_grad_()
                      for t in (q, k, v))
        do4 = dout.view(shape).transpose(1, 2)
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out4 = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, scale=scale)

            def cudnn():
                torch.autograd.grad(out4, (q4, k4, v4), do4, retain_graph=True)
            cudnn()
            fns["cudnn"] = cudnn
        except RuntimeError as err:  # cuDNN refused the shape
            print(f"cuDNN unavailable for {row['seqs']}: {err}", file=sys.stderr)
    add_throughputs(row, fns, work, warmup, repeats)
    return row


def mem_efficient_fn(q, k, v, dout, lens, causal, scale, backward):
    """PyTorch's memory-efficient SDPA kernel on the padded-batch view of equal-length sequences
    (None for mixed lengths); with backward, its backward on its own forward."""
    if any(x != lens[0] for x in lens):
        return None
    shape = (len(lens), lens[0], q.shape[1], q.shape[2])
    q4, k4, v4 = (t.view(shape).transpose(1, 2).detach().requires_grad_(backward)
                  for t in (q, k, v))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out4 = F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, scale=scale)
    if not backward:
        def forward():
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, scale=scale)
        return forward
    do4 = dout.view(shape).transpose(1, 2)

    def run_backward():
        torch.autograd.grad(out4, (q4, k4, v4), do4, retain_graph=True)
    return run_backward


def bench_row_turing(libs, head_dim, heads, lens, causal, warmup, repeats, backward):
    """fp16; columns: each lib's flash family on the sm75 path ("NAME-sm75") and on the sm80 path
    ("NAME-sm80", compute capability 80: on a Hopper GPU the default would be the sm90 kernels),
    PyTorch's memory-efficient kernel ("memeff")."""
    total = sum(lens)
    max_len = max(lens)
    scale = 1.0 / math.sqrt(head_dim)
    q, k, v, dout = (torch.randn(total, heads, head_dim, device="cuda", dtype=torch.float16)
                     for _ in range(4))
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32,
                      device="cuda")
    work = flops(lens, head_dim, heads, causal) * (2.5 if backward else 1)
    row = {"hdim": head_dim, "heads": heads, "seqs": seq_name(lens), "causal": causal}
    reference = None
    fns = {}
    for name, lib in libs.items():
        for path, cc in (("sm75", 75), ("sm80", 80)):
            family = lib.family("flash", compute_capability=cc)
            out, lse = family.forward(q, k, v, cu, cu, max_len, max_len, softmax_scale=scale,
                                      causal=causal)
            if backward:
                grads = [torch.empty_like(t) for t in (q, k, v)]
                workspace = torch.empty(
                    max(1, family.backward_workspace_bytes(q, k, cu, cu, dtype_code=0)),
                    dtype=torch.uint8, device="cuda")

                def fn(family=family, out=out, lse=lse, grads=grads, workspace=workspace):
                    family.backward(dout, q, k, v, out, lse, cu, cu, max_len, max_len,
                                    softmax_scale=scale, causal=causal, dq=grads[0],
                                    dk=grads[1], dv=grads[2], workspace=workspace)
                fn()
                result = grads[0]
            else:
                def fn(family=family, out=out, lse=lse):
                    family.forward(q, k, v, cu, cu, max_len, max_len, softmax_scale=scale,
                                   causal=causal, out=out, lse=lse)
                result = out
            torch.cuda.synchronize()
            column = f"{name}-{path}"
            reference = result.float().clone() if reference is None else reference
            row[f"{column}_diff"] = ((result.float() - reference).norm() /
                                     reference.norm()).item()
            fns[column] = fn
    memeff = mem_efficient_fn(q, k, v, dout, lens, causal, scale, backward)
    row["memeff"] = None
    if memeff is not None:
        fns["memeff"] = memeff
    add_throughputs(row, fns, work, warmup, repeats)
    return row


def turing_table(rows, names, kind):
    first = names[0]
    head = ["hdim", "heads", "sequence lengths", "causal"] + [f"{n} {kind}" for n in names] + [
        f"PyTorch mem-efficient {kind}", f"{first}/mem-efficient", f"{first}/{names[1]}",
        "max rel diff vs first"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["hdim"]), str(r["heads"]), r["seqs"], "yes" if r["causal"] else "no"]
        cells += [fmt(r[n]) for n in names] + [fmt(r["memeff"])]
        cells += [fmt(r[first] / r["memeff"] if r["memeff"] else None, 2),
                  fmt(r[first] / r[names[1]], 2),
                  f"{max(r[f'{n}_diff'] for n in names):.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt(x, digits=0):
    return "–" if x is None else f"{x:.{digits}f}"


def table(rows, names, kind="fwd"):
    first = names[0]
    diff = "max rel diff vs FA2" if kind == "fwd" else "max dq rel diff vs FA2"
    head = ["hdim", "heads", "sequence lengths", "causal"] + [f"{n} {kind}" for n in names] + [
        f"FA2 varlen {kind}", f"cuDNN {kind}", f"{first}/FA2", f"{first}/cuDNN", diff]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratio_fa2 = r[first] / r["fa2"] if r[first] else None
        ratio_cudnn = r[first] / r["cudnn"] if r["cudnn"] and r[first] else None
        cells = [str(r["hdim"]), str(r["heads"]), r["seqs"], "yes" if r["causal"] else "no"]
        cells += [fmt(r[n]) for n in names]
        cells += [fmt(r["fa2"]), fmt(r["cudnn"]), fmt(ratio_fa2, 2),
                  fmt(ratio_cudnn, 2), f"{max(r[f'{n}_diff'] for n in names):.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", action="append", default=[],
                        help="NAME=PATH[@CC][+OFF...] of a libattn_capi.so, optionally run "
                             "as compute capability CC and with code paths OFF disabled "
                             "(no-sm90-fwd, no-sm90-bwd) (default: ours=<found>)")
    parser.add_argument("--backward", action="store_true",
                        help="time the backward (dq, dk, dv) instead of the forward")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--markdown", type=pathlib.Path)
    parser.add_argument("--seqs", default="",
                        help="comma-separated sequence-set names to run (e.g. 2x8192); default all")
    parser.add_argument("--causal", choices=("both", "no", "yes"), default="both")
    parser.add_argument("--no-deterministic", action="store_true",
                        help="backward: time the atomic-dQ mode only (no NAME-det columns)")
    parser.add_argument("--turing", action="store_true",
                        help="time the sm75 path (fp16, hdim 64) against PyTorch's "
                             "memory-efficient kernel")
    args = parser.parse_args()
    if args.turing:
        return main_turing(args)

    specs = args.lib or [f"ours={attn_capi.find_library()}"]
    libs = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        path, *paths_off = path.split("+")
        path, _, cc = path.partition("@")
        disabled = sum(attn_capi.PATH_NAMES[p] for p in set(paths_off))
        libs[name] = attn_capi.AttnLibrary(path).family("flash", int(cc or 0), disabled)
    head_dims = {int(x) for x in args.head_dims.split(",")}

    rows = []
    for head_dim, heads in HEAD_CONFIGS:
        if head_dim not in head_dims:
            continue
        for lens in SEQUENCE_SETS:
            if args.seqs and seq_name(lens) not in args.seqs.split(","):
                continue
            for causal in (False, True):
                if args.causal != "both" and causal != (args.causal == "yes"):
                    continue
                if args.backward:
                    modes = (False,) if args.no_deterministic else (False, True)
                    row = bench_row_backward(libs, head_dim, heads, lens, causal, args.warmup,
                                             args.repeats, modes)
                else:
                    row = bench_row(libs, head_dim, heads, lens, causal, args.warmup,
                                    args.repeats)
                rows.append(row)
                names = [n for n in row if f"{n}_diff" in row]
                print(f"hdim {head_dim} {row['seqs']} causal={causal}: " + ", ".join(
                    f"{n} {fmt(row[n])}" for n in names + ["fa2", "cudnn"]), flush=True)

    names = [n for n in rows[0] if f"{n}_diff" in rows[0]] if rows else list(libs)
    kind_name = "backward" if args.backward else "forward"
    header = (f"{datetime.date.today().isoformat()}, {torch.cuda.get_device_name()}, "
              f"torch {torch.__version__}, bf16, {kind_name}, median of {args.repeats} CUDA-event "
              f"timed repeats after {args.warmup} warm-ups, columns timed in turns, TFLOP/s")
    text = header + "\n\n" + table(rows, names, "bwd" if args.backward else "fwd") + "\n"
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text)


def main_turing(args):
    specs = args.lib or [f"ours={attn_capi.find_library()}"]
    libs = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        libs[name] = attn_capi.AttnLibrary(path)
    rows = []
    for head_dim, heads in HEAD_CONFIGS:
        if head_dim != 64:  # the Turing path stops at head dim 64
            continue
        for lens in SEQUENCE_SETS:
            for causal in (False, True):
                row = bench_row_turing(libs, head_dim, heads, lens, causal, args.warmup,
                                       args.repeats, args.backward)
                rows.append(row)
                names = [n for n in row if f"{n}_diff" in row]
                print(f"hdim {head_dim} {row['seqs']} causal={causal}: " + ", ".join(
                    f"{n} {fmt(row[n])}" for n in names + ["memeff"]), flush=True)
    names = [n for n in rows[0] if f"{n}_diff" in rows[0]]
    kind = "bwd" if args.backward else "fwd"
    header = (f"{datetime.date.today().isoformat()}, {torch.cuda.get_device_name()}, "
              f"torch {torch.__version__}, fp16, Turing path (compute_capability 75) "
              f"{'backward' if args.backward else 'forward'}, median of {args.repeats} CUDA-event "
              f"timed repeats after {args.warmup} warm-ups, columns timed in turns, TFLOP/s")
    text = header + "\n\n" + turing_table(rows, names, kind) + "\n"
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
