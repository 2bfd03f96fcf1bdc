"""A few small flash calls for compute-sanitizer, whose race and barrier checks are too slow for
the whole GPU suite: the forward at every Hopper head dim (warp specialized: producer, consumers,
mbarriers, ping-pong turns) on a varlen batch, causal and not, and the backward (warp
specialized too) at every Hopper head dim, causal. Run on the GPU machine as

  compute-sanitizer --tool racecheck --error-exitcode 1 python3 tests/kernels/gpu/sanitize_flash.py
  compute-sanitizer --tool synccheck --error-exitcode 1 python3 tests/kernels/gpu/sanitize_flash.py

(--head-dims 64,128 limits both directions to those head dims, for a build of fewer of them.)

Results are checked against PyTorch loosely: the point is the sanitizer's verdict, and that a
broken barrier shows up as a wrong answer too.
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from capi_library import load_family  # noqa: E402

LIB = load_family("flash")


def attention(q, k, v, lens, causal):
    """Per-sequence PyTorch attention in float32 (the loose reference); equal query and key
    lengths, so PyTorch's top-left causal mask is the kernels' bottom-right one."""
    outs, start = [], 0
    for n in lens:
        if n == 0:
            continue
        qs, ks, vs = (t[start:start + n].transpose(0, 1).float() for t in (q, k, v))
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, is_causal=causal).transpose(0, 1))
        start += n
    return torch.cat(outs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", default="64,128,192,256")
    head_dims = [int(d) for d in parser.parse_args().head_dims.split(",")]
    torch.manual_seed(0)
    lens = [300, 0, 129, 513]  # partial tiles, an empty sequence, several key tiles
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    total = int(cu[-1])
    for head_dim in (d for d in head_dims if d in (64, 128, 256)):
        for causal in (False, True):
            q, k, v = (torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            out = LIB.forward(q, k, v, cu.cuda(), cu.cuda(), max(lens), max(lens), causal=causal,
                              cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)[0]
            err = (out.float() - attention(q, k, v, lens, causal)).abs().max().item()
            print(f"forward hdim {head_dim} causal {causal}: max abs error {err:.2e}")
            assert err < 2e-2, err
    for head_dim in head_dims:
        q, k, v = (torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        dout = torch.randn_like(q)
        out, lse = LIB.forward(q, k, v, cu.cuda(), cu.cuda(), max(lens), max(lens), causal=True,
                               cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
        grads = LIB.backward(dout, q, k, v, out, lse, cu.cuda(), cu.cuda(), max(lens), max(lens),
                             causal=True, cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
        leaves = [t.float().requires_grad_() for t in (q, k, v)]
        attention(*leaves, lens, True).backward(dout.float())
        for name, ours, leaf in zip("qkv", grads, leaves):
            err = ((ours.float() - leaf.grad).norm() / leaf.grad.norm()).item()
            print(f"backward hdim {head_dim} d{name}: relative error {err:.2e}")
            assert err < 2e-2, err
    torch.cuda.synchronize()
    print("sanitize_flash: done")


if __name__ == "__main__":
    main()
