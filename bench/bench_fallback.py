#!/usr/bin/env python3
"""Forward (or, with --backward, backward) throughput of the fallback kernels (kernels/fallback,
through libattn_capi.so) beside PyTorch's memory-efficient attention kernel (the xformers/CUTLASS
kernel PyTorch uses below sm80; torch.ops.aten._efficient_attention_forward/_backward with
cu_seqlens), on the rows of shared/anchors/h100.md, measured side by side in one run:

  bf16 columns: ours on the device's own code path (sm80+: mma.sync m16n8k16) vs mem-eff bf16;
  fp16 columns: ours on the sm75 code path (mma.sync m16n8k8, what a T4 runs) vs mem-eff fp16.

Same inputs for both; median of CUDA-event-timed repeats after warm-ups, ours and mem-eff of a
dtype timed in turns (gpu_timing.time_columns, as bench_flash.py); TFLOP/s with FLOPs = 4 * sum(s^2) * d * heads, halved if causal, x2.5 backward.

  python3 bench/bench_fallback.py [--backward] [--head-dims 64,128,256] [--markdown FILE]
"""

import argparse
import datetime
import math
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "kernels" / "capi"))
import attn_capi  # noqa: E402
from gpu_timing import add_throughputs, flops, seq_name  # noqa: E402

HEAD_CONFIGS = [(64, 32), (128, 16), (256, 8)]
SEQUENCE_SETS = [
    [512] * 32,
    [2048] * 8,
    [8192] * 2,
    [16384],
    [100, 3000, 700, 5000, 1200, 6384],
]
def _call_by_schema(op, **values):
    """Calls an aten op with the named values its schema has (names differ across versions)."""
    names = [a.name for a in op.default._schema.arguments]
    return op(**{n: values[n] for n in names if n in values})


class MemEff:
    """PyTorch's memory-efficient kernel on packed varlen tensors ([1, total, H, D])."""

    def __init__(self, q, k, v, cu, max_len, causal, scale):
        self.q4, self.k4, self.v4 = (t.unsqueeze(0) for t in (q, k, v))
        self.common = dict(query=self.q4, key=self.k4, value=self.v4, bias=None,
                           cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len,
                           max_seqlen_k=max_len, dropout_p=0.0,
                           custom_mask_type=2 if causal else 0, scale=scale)

    def forward(self, compute_lse=False):
        return _call_by_schema(torch.ops.aten._efficient_attention_forward,
                               compute_log_sumexp=compute_lse, **self.common)

    def backward_fn(self, dout):
        out, lse, seed, offset = self.forward(compute_lse=True)[:4]
        values = dict(self.common, grad_out_=dout.unsqueeze(0), grad_out=dout.unsqueeze(0),
                      out=out, logsumexp=lse, philox_seed=seed, philox_offset=offset,
                      bias_requires_grad=False)
        return lambda: _call_by_schema(torch.ops.aten._efficient_attention_backward, **values)


def rel_diff(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def bench_row(ours, head_dim, heads, lens, causal, backward, warmup, repeats):
    total, max_len = sum(lens), max(lens)
    scale = 1.0 / math.sqrt(head_dim)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))],
                      dtype=torch.int32).cuda()
    work = flops(lens, head_dim, heads, causal) * (2.5 if backward else 1.0)
    row = {"hdim": head_dim, "heads": heads, "seqs": seq_name(lens), "causal": causal}
    for dtype, column, family in ((torch.bfloat16, "ours", ours["native"]),
                                  (torch.float16, "ours75", ours["sm75"])):
        q, k, v, dout = (torch.randn(total, heads, head_dim, device="cuda", dtype=dtype)
                         for _ in range(4))
        memeff = MemEff(q, k, v, cu, max_len, causal, scale)
        kw = dict(softmax_scale=scale, causal=causal)
        out, lse = family.forward(q, k, v, cu, cu, max_len, max_len, **kw)
        suffix = "bf16" if dtype == torch.bfloat16 else "fp16"
        fns = {}
        row[f"memeff_{suffix}"], ref = None, None
        try:
            memeff_fn = memeff.backward_fn(dout) if backward else memeff.forward
            ref = memeff_fn()[0].squeeze(0)
            fns[f"memeff_{suffix}"] = memeff_fn
        except RuntimeError as err:
            print(f"mem-eff {suffix} unavailable for {row['seqs']}: {err}", file=sys.stderr)
        if backward:
            dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
            workspace = torch.empty(max(1, family.backward_workspace_bytes(q, k, cu, cu)),
                                    dtype=torch.uint8, device="cuda")

            def ours_fn(family=family, q=q, k=k, v=v, out=out, lse=lse, dout=dout, dq=dq,
                        dk=dk, dv=dv, workspace=workspace):
                family.backward(dout, q, k, v, out, lse, cu, cu, max_len, max_len, dq=dq,
                                dk=dk, dv=dv, workspace=workspace, **kw)
            ours_fn()
            result = dq
        else:
            result = torch.empty_like(q)

            def ours_fn(family=family, q=q, k=k, v=v, result=result, lse=lse):
                family.forward(q, k, v, cu, cu, max_len, max_len, out=result, lse=lse, **kw)
            ours_fn()
        torch.cuda.synchronize()
        row[f"{column}_diff"] = rel_diff(result, ref) if ref is not None else math.nan
        fns[column] = ours_fn
        add_throughputs(row, fns, work, warmup, repeats)
    return row


def fmt(x, digits=0):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def ratio(a, b):
    return a / b if a and b else None


def table(rows, kind):
    head = ["hdim", "heads", "sequence lengths", "causal", f"ours bf16 {kind}",
            f"mem-eff bf16 {kind}", "ours/mem-eff bf16", f"ours sm75-path fp16 {kind}",
            f"mem-eff fp16 {kind}", "sm75-path/mem-eff fp16", "rel diff vs mem-eff"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["hdim"]), str(r["heads"]), r["seqs"], "yes" if r["causal"] else "no",
                 fmt(r["ours"]), fmt(r["memeff_bf16"]), fmt(ratio(r["ours"], r["memeff_bf16"]), 2),
                 fmt(r["ours75"]), fmt(r["memeff_fp16"]),
                 fmt(ratio(r["ours75"], r["memeff_fp16"]), 2),
                 f"{max(r['ours_diff'], r['ours75_diff']):.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows):
    out = []
    for column, base in (("ours", "memeff_bf16"), ("ours75", "memeff_fp16")):
        ratios = [ratio(r[column], r[base]) for r in rows if ratio(r[column], r[base])]
        if ratios:
            out.append(f"{column}/{base}: min {min(ratios):.2f}, median "
                       f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", help="path of libattn_capi.so (default: found)")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--markdown", type=pathlib.Path)
    args = parser.parse_args()

    lib = attn_capi.AttnLibrary(args.lib or attn_capi.find_library())
    ours = {"native": lib.family("fallback"), "sm75": lib.family("fallback", 75)}
    head_dims = {int(x) for x in args.head_dims.split(",")}
    rows = []
    for head_dim, heads in HEAD_CONFIGS:
        if head_dim not in head_dims:
            continue
        for lens in SEQUENCE_SETS:
            for causal in (False, True):
                row = bench_row(ours, head_dim, heads, lens, causal, args.backward, args.warmup,
                                args.repeats)
                rows.append(row)
                print(f"hdim {head_dim} {row['seqs']} causal={causal}: ours {fmt(row['ours'])} "
                      f"mem-eff bf16 {fmt(row['memeff_bf16'])}, sm75-path {fmt(row['ours75'])} "
                      f"mem-eff fp16 {fmt(row['memeff_fp16'])}", flush=True)
    kind = "bwd" if args.backward else "fwd"
    header = (f"{datetime.date.today().isoformat()}, {torch.cuda.get_device_name()}, "
              f"torch {torch.__version__}, fallback {'backward' if args.backward else 'forward'}"
              f", median of {args.repeats} CUDA-event timed repeats after {args.warmup} "
              f"warm-ups, columns of a dtype timed in turns, TFLOP/s")
    text = header + "\n\n" + table(rows, kind) + "\n\n" + summary(rows) + "\n"
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
