"""A training step through CUDA shared memory on the GPU machine (issue 21's co-located
target), against local attention on the same GPU in the same process: forward + backward of
8 x 2048 tokens, 16 heads, head_dim 128, bf16, causal. The client keeps one registered region
(tests/gpu/cuda_region.py) holding q, k, v, dout and the outputs; a step copies q, k, v and
dout in (device to device), runs attention_forward and attention_backward through the server
(which reads and writes the region where it lies), and copies out, dq, dk, dv out. The peer is
torch's scaled_dot_product_attention on the flash backend (PyTorch's FlashAttention-2), timed
in turns with the step. Prints medians and the ratio. --dropin first times the torch drop-in
itself by each path the client offers (needs the server started with --allow_shared_memory).

    python3 bench/cuda_ipc_bench.py --target 127.0.0.1:8001 --dropin"""
import argparse
import os
import statistics
import sys
import time
import uuid

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))
from cuda_region import CudaRegion  # noqa: E402

BATCH, SEQLEN, HEADS, DIM = 8, 2048, 16, 128


def local_step(q, k, v, dout):
    qs, ks, vs = (t.view(BATCH, SEQLEN, HEADS, DIM).transpose(1, 2).detach().requires_grad_()
                  for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    out.backward(dout.view(BATCH, SEQLEN, HEADS, DIM).transpose(1, 2))
    return out, qs.grad, ks.grad, vs.grad


def remote_step(region, q, k, v, dout, cu):
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        region.places[name][0].copy_(t)
    offsets = {"cu_seqlens_q": cu, "cu_seqlens_k": cu}
    region.infer("attention_forward", ["q", "k", "v"], ["out", "lse"], offsets, {"causal": True})
    region.infer("attention_backward", ["dout", "q", "k", "v", "out", "lse"], ["dq", "dk", "dv"],
                 offsets, {"causal": True})
    return [region.places[n][0].clone() for n in ("out", "dq", "dk", "dv")]


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def dropin_table(target: str, rounds: int, repeats: int) -> None:
    """The torch drop-in's step (transport_bench.dropin_step) as a client's defaults take it
    (CUDA shared memory), over the data channel (cuda_shared_memory="off"), through system
    shared memory (shared_memory="auto"), and local FA2, in turns; medians of the rounds."""
    sys.path.insert(0, os.path.dirname(__file__))
    import attnserve
    from transport_bench import dropin_step

    total = BATCH * SEQLEN
    q, k, v, dout = (torch.randn(total, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    clients = {
        "CUDA shared memory (defaults)": attnserve.Client(target, timeout=600),
        "data channel (cuda_shared_memory=off)": attnserve.Client(
            target, timeout=600, cuda_shared_memory="off"),
        "system shared memory (shared_memory=auto, cuda off)": attnserve.Client(
            target, timeout=600, cuda_shared_memory="off", shared_memory="auto"),
    }
    times = {label: [] for label in (*clients, "local FA2 (torch SDPA flash)")}
    for _ in range(rounds):
        for label, client in clients.items():
            times[label].append(dropin_step(client, repeats))
        times["local FA2 (torch SDPA flash)"].append(statistics.median(
            timed(lambda: local_step(q, k, v, dout)) for _ in range(repeats)))
    local = statistics.median(times["local FA2 (torch SDPA flash)"])
    print("| drop-in step (8x2048, 16 heads, 128, bf16, causal) | median | rounds | / local |")
    print("|---|---|---|---|")
    for label, ts in times.items():
        rounds_ms = ", ".join(f"{t * 1e3:.2f}" for t in ts)
        print(f"| {label} | {statistics.median(ts) * 1e3:.2f} ms | {rounds_ms} | "
              f"{statistics.median(ts) / local:.2f}x |")
    for client in clients.values():
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dropin", action="store_true",
                        help="also time the torch drop-in's step by each path (dropin_table)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.dropin:
        dropin_table(args.target, args.rounds, 5)
    total = BATCH * SEQLEN
    q, k, v, dout = (torch.randn(total, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    cu = [i * SEQLEN for i in range(BATCH + 1)]
    region = CudaRegion(args.target, f"bench-{uuid.uuid4().hex[:8]}", 640 << 20)
    region.register()
    for name in ("q", "k", "v", "dout", "out", "dq", "dk", "dv"):
        region.place(name, q)
    region.place("lse", torch.empty(HEADS, total, device="cuda"))
    try:
        got = remote_step(region, q, k, v, dout, cu)  # warm-up, and a check against local
        want = local_step(q, k, v, dout)
        out_local = want[0].transpose(1, 2).reshape(total, HEADS, DIM)
        grads_local = [g.transpose(1, 2).reshape(total, HEADS, DIM) for g in want[1:]]
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, [out_local] + grads_local):
            err = ((a.float() - b.float()).norm() / b.float().norm()).item()
            print(f"  {name}: rel. error against local {err:.2e}")
            if err > 2e-2:
                print("checks: FAILED")
                return 1
        remote, local = [], []
        for _ in range(args.repeats):  # in turns
            remote.append(timed(lambda: remote_step(region, q, k, v, dout, cu)))
            local.append(timed(lambda: local_step(q, k, v, dout)))
    finally:
        region.close()
    r, l = statistics.median(remote), statistics.median(local)
    print(f"| step (8x2048, 16 heads, 128, bf16, causal) | through CUDA shared memory "
          f"{r * 1e3:.2f} ms | local FA2 (torch SDPA flash) {l * 1e3:.2f} ms | {r / l:.2f}x |")
    print("checks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
