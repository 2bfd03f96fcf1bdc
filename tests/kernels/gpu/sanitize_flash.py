"""A few small flash calls for compute-sanitizer, whose race and barrier checks are too slow for
the whole GPU suite: the forward at every Hopper head dim (warp specialized and persistent:
producer, consumers, mbarriers, ping-pong turns, Q slots and the K/V ring reused across the
several query blocks each CTA runs) on a varlen batch, causal and not, and the backward (warp
specialized too) at every Hopper head dim, causal, in both modes (the deterministic one, and at
256 both, run the dK/dV kernel without dQ and then the dQ kernel). Run on the GPU
machine as

  compute-sanitizer --tool racecheck --error-exitcode 1 python3 tests/kernels/gpu/sanitize_flash.py
  compute-sanitizer --tool synccheck --error-exitcode 1 python3 tests/kernels/gpu/sanitize_flash.py

(--head-dims 64,128 limits both directions to those head dims, for a build of fewer of them;
--directions forward or backward runs one direction only.)

Results are checked against PyTorch loosely: the point is the sanitizer's verdict, and that a
broken barrier shows up as a wrong answer too.
"""
import argparse
import itertools
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
    parser.add_argument("--directions", default="forward,backward")
    options = parser.parse_args()
    head_dims = [int(d) for d in options.head_dims.split(",")]
    directions = options.directions.split(",")
    torch.manual_seed(0)
    lens = [300, 0, 129, 513]  # partial tiles, an empty sequence, several key tiles
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    total = int(cu[-1])
    # The forward's two schedules (kernels/flash/tile_config.h, Sm90ForwardPersistent): up to
    # 1024 keys persistent (2048 at head dim 64), with 16 heads 192-320 query blocks, several per
    # CTA; then one CTA per query block, with a sequence of 2100.
    schedules = [(lens, 16), ([2100, 0, 129, 5], 2)]
    for head_dim in (d for d in head_dims if d in (64, 128, 256) and "forward" in directions):
        for (fwd_lens, heads), causal in itertools.product(schedules, (False, True)):
            fwd_cu = torch.tensor([0] + torch.tensor(fwd_lens).cumsum(0).tolist(),
                                  dtype=torch.int32)
            q, k, v = (torch.randn(int(fwd_cu[-1]), heads, head_dim, device="cuda",
                                   dtype=torch.bfloat16) for _ in range(3))
            out = LIB.forward(q, k, v, fwd_cu.cuda(), fwd_cu.cuda(), max(fwd_lens),
                              max(fwd_lens), causal=causal, cu_seqlens_q_host=fwd_cu,
                              cu_seqlens_k_host=fwd_cu)[0]
            err = (out.float() - attention(q, k, v, fwd_lens, causal)).abs().max().item()
            print(f"forward hdim {head_dim} lengths {fwd_lens} causal {causal}: "
                  f"max abs error {err:.2e}")
            assert err < 2e-2, err
    for head_dim in (d for d in head_dims if "backward" in directions):
        q, k, v = (torch.randn(total, 2, head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        dout = torch.randn_like(q)
        out, lse = LIB.forward(q, k, v, cu.cuda(), cu.cuda(), max(lens), max(lens), causal=True,
                               cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
        leaves = [t.float().requires_grad_() for t in (q, k, v)]
        attention(*leaves, lens, True).backward(dout.float())
        for deterministic in (False, True):
            grads = LIB.backward(dout, q, k, v, out, lse, cu.cuda(), cu.cuda(), max(lens),
                                 max(lens), causal=True, deterministic=deterministic,
                                 cu_seqlens_q_host=cu, cu_seqlens_k_host=cu)
            for name, ours, leaf in zip("qkv", grads, leaves):
                err = ((ours.float() - leaf.grad).norm() / leaf.grad.norm()).item()
                print(f"backward hdim {head_dim} deterministic {deterministic} d{name}: "
                      f"relative error {err:.2e}")
                assert err < 2e-2, err
    torch.cuda.synchronize()
    print("sanitize_flash: done")


if __name__ == "__main__":
    main()
