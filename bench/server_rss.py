#!/usr/bin/env python3
"""Server resident memory during one large forward (issue 24: RSS during a 1 GB request should
stay within the payload + 64 MB).

Sends one forward of about --payload_mb MB of q, k, v (bf16, 16 heads, head_dim 128, sequences
of 64 tokens) with the Python client's default transport to a running server, sampling the
server's VmRSS every 5 ms from /proc/<pid>/status (same host), and prints the RSS before, the
peak during the call, and the peak's growth over the payload:

    python bench/server_rss.py --target 127.0.0.1:8001 --pid $(pgrep -f attnserve)
"""
import argparse
import threading
import time

import numpy as np
from ml_dtypes import bfloat16

import attnserve

HEADS, DIM, SEQLEN = 16, 128, 64


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the server's process id")
    parser.add_argument("--payload_mb", type=float, default=1000)
    args = parser.parse_args()
    row_bytes = HEADS * DIM * 2
    tokens = int(args.payload_mb * 1e6 / (3 * row_bytes)) // SEQLEN * SEQLEN
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((tokens, HEADS, DIM), np.float32).astype(bfloat16)
               for _ in range(3))
    cu = np.arange(0, tokens + 1, SEQLEN, dtype=np.int32)
    client = attnserve.Client(args.target, timeout=600)
    small = tokens // 64 // SEQLEN * SEQLEN or SEQLEN
    client.forward(q[:small], k[:small], v[:small], cu[:small // SEQLEN + 1],
                   cu[:small // SEQLEN + 1])  # sessions and the server's first allocations
    before = rss_bytes(args.pid)
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes(args.pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    client.forward(q, k, v, cu, cu, causal=True)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    payload = 3 * q.nbytes
    transport = client.active_transport() if hasattr(client, "active_transport") else "grpc"
    print(f"| transport | payload MB | seconds | RSS before MB | peak RSS MB | "
          f"peak - before - payload MB |")
    print("|---|---|---|---|---|---|")
    print(f"| {transport} | {payload / 1e6:.0f} | {seconds:.2f} | {before / 1e6:.0f} | "
          f"{peak[0] / 1e6:.0f} | {(peak[0] - before - payload) / 1e6:.0f} |")
    client.close()


if __name__ == "__main__":
    main()
