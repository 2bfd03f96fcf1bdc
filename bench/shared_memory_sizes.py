#!/usr/bin/env python3
"""Numpy forwards of growing size (one causal sequence, bf16), the data channel against system
shared memory, in turns, against a server on this host with --allow_shared_memory: where shared
memory starts to pay (the client's SHARED_MEMORY_MIN_BYTES).

    python bench/shared_memory_sizes.py --target 127.0.0.1:8001
"""
import argparse
import statistics
import sys
import time

import numpy as np
from ml_dtypes import bfloat16

import attnserve

SHAPES = ((64, 4, 64), (512, 8, 64), (2048, 16, 128), (8192, 16, 128), (32768, 16, 128))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="a running server's gRPC host:port")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = attnserve.Client(args.target, timeout=60, shared_memory="off")
    shared = attnserve.Client(args.target, timeout=60, shared_memory="auto")
    attnserve.client.SHARED_MEMORY_MIN_BYTES = 0  # every size through shared memory
    if (data.active_transport(), shared.active_transport()) != ("data_channel", "shared_memory"):
        print("needs a data channel and shared memory: is the server on this host, with "
              "--allow_shared_memory?", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    print("| tokens x heads x dim (bf16) | payload | data channel | shared memory | shm / data |")
    print("|---|---|---|---|---|")
    for tokens, heads, dim in SHAPES:
        q, k, v = (rng.standard_normal((tokens, heads, dim), np.float32).astype(bfloat16)
                   for _ in range(3))
        cu = np.array([0, tokens], np.int32)
        payload = 4 * q.nbytes + heads * tokens * 4  # q, k, v in; out, lse back
        repeats = max(5, min(200, int(2e9 / payload)))
        times = {"data": [], "shared": []}
        for _ in range(args.rounds):  # the two clients take turns
            for name, client in (("data", data), ("shared", shared)):
                client.forward(q, k, v, cu, cu, causal=True)
                start = time.perf_counter()
                for _ in range(repeats):
                    client.forward(q, k, v, cu, cu, causal=True)
                times[name].append((time.perf_counter() - start) / repeats)
        d, s = statistics.median(times["data"]), statistics.median(times["shared"])
        print(f"| {tokens}x{heads}x{dim} | {payload / 1e6:.2f} MB | {d * 1e3:.3f} ms | "
              f"{s * 1e3:.3f} ms | {s / d:.2f} |")
    data.close()
    shared.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
