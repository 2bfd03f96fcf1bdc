#!/usr/bin/env python3
"""Quick look at the flash forward's error per code path and shape (float32 reference), for
locating layout mistakes: relative error overall, per 16-row group and per 64-column block of the
output of the worst case. Usage: ATTN_CAPI=... python3 bench/sm90_diag.py"""

import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "kernels" / "capi"))
import attn_capi  # noqa: E402


def reference(q, k, v, causal, scale):
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        s = s.masked_fill(j > i + sk - sq, -math.inf)
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v.float())


def main():
    lib = attn_capi.AttnLibrary(attn_capi.find_library())
    paths = {"device": lib.family("flash"), "sm80": lib.family("flash", 80)}
    for head_dim in (64, 128, 256):
        for sq, sk in ((64, 64), (128, 128), (128, 256), (200, 333), (1000, 1000)):
            for causal in (False, True):
                q, k, v = (torch.randn(n, 2, head_dim, device="cuda", dtype=torch.bfloat16)
                           for n in (sq, sk, sk))
                cu_q = torch.tensor([0, sq], dtype=torch.int32)
                cu_k = torch.tensor([0, sk], dtype=torch.int32)
                scale = 1 / math.sqrt(head_dim)
                ref = reference(q, k, v, causal, scale)
                cells = []
                for name, fam in paths.items():
                    out = torch.full_like(q, math.nan)
                    lse = torch.full((2, sq), math.nan, device="cuda")
                    fam.forward(q, k, v, cu_q.cuda(), cu_k.cuda(), sq, sk, softmax_scale=scale,
                                causal=causal, out=out, lse=lse, cu_seqlens_q_host=cu_q,
                                cu_seqlens_k_host=cu_k)
                    torch.cuda.synchronize()
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    cells.append(f"{name} {err:.2e} nan={out.isnan().sum().item()}")
                    if name == "device" and not err < 1e-2:
                        e = (out.float() - ref).nan_to_num(1e9).abs()
                        rows = [f"{e[r:r + 16].max().item():.1e}" for r in range(0, min(sq, 128), 16)]
                        cols = [f"{e[..., c:c + 64].max().item():.1e}" for c in range(0, head_dim, 64)]
                        cells.append(f"rows16 {rows} cols64 {cols}")
                print(f"hdim {head_dim} {sq}x{sk} causal={causal}: " + "; ".join(cells),
                      flush=True)


if __name__ == "__main__":
    main()
