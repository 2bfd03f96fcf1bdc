#!/usr/bin/env python3
"""Transport benchmark of the Python client against a running server, on loopback, in one run:

  raw socket       a plain Python TCP socket pair moving bytes one way (1 connection, and N
                   connections in parallel): the ceiling a Python client can hope for
  numpy forward    Client.forward of one large request of short sequences, over gRPC and over
                   the data channel (payload GB/s: request and response tensor bytes / time),
                   and with --shared-memory through system shared memory too (the server on
                   this host with --allow_shared_memory; issue 21's target: at least 5x the
                   payload rate of the same call over loopback TCP)
  torch drop-in    flash_attn_varlen_func forward + backward of 8 x 2048 tokens, 16 heads,
                   head_dim 128, bf16, causal, CUDA tensors (only where CUDA is present): total
                   seconds, and their ratio to 537 MB / raw-socket GB/s (issue 24's target:
                   at most 1.25)

Prints a markdown table of medians over --repeats. The server must admit the sizes (e.g.
--max_total_tokens, --max_message_bytes for the gRPC rows):

    python bench/transport_bench.py --target 127.0.0.1:8001 [--shared-memory]
"""
import argparse
import socket
import statistics
import sys
import threading
import time

import numpy as np
from ml_dtypes import bfloat16

import attnserve

RAW_BYTES = 1 << 30
SLICE_BYTES = 4 << 20
DROPIN_SHAPE = dict(batch=8, seqlen=2048, heads=16, dim=128)
# Bytes the drop-in must move per step with saved contexts: q, k, v, out, lse, dout, dq, dk, dv.
DROPIN_TARGET_BYTES = 537e6


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up: sessions, pinned buffers, the server's first allocation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def raw_socket_gbps(connections: int, total_bytes: int, repeats: int) -> float:
    """One-way throughput of `connections` loopback TCP connections, each moving its share from
    a preallocated buffer with sendall into one with recv_into (no copies in Python)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pairs = []
    for _ in range(connections):
        client = socket.create_connection(("127.0.0.1", port))
        server, _ = listener.accept()
        pairs.append((client, server))
    listener.close()
    share = total_bytes // connections
    source = memoryview(bytearray(SLICE_BYTES))
    sinks = [memoryview(bytearray(SLICE_BYTES)) for _ in pairs]

    def send(sock):
        for offset in range(0, share, SLICE_BYTES):
            sock.sendall(source[:min(SLICE_BYTES, share - offset)])

    def receive(sock, sink):
        left = share
        while left:
            left -= sock.recv_into(sink, min(left, SLICE_BYTES))

    def run():
        threads = [threading.Thread(target=send, args=(c,)) for c, _ in pairs]
        threads += [threading.Thread(target=receive, args=(s, sink))
                    for (_, s), sink in zip(pairs, sinks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    seconds = _median_time(run, repeats)
    for client, server in pairs:
        client.close()
        server.close()
    return share * connections / seconds / 1e9


def numpy_forward(client: attnserve.Client, tokens: int, seqlen: int, heads: int, dim: int,
                  repeats: int):
    """(seconds, payload bytes) of one forward of `tokens` bf16 tokens in sequences of
    `seqlen`."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((tokens, heads, dim), np.float32).astype(bfloat16)
               for _ in range(3))
    cu = np.arange(0, tokens + 1, seqlen, dtype=np.int32)
    payload = 4 * q.nbytes + heads * tokens * 4  # q, k, v in; out, lse back
    return _median_time(lambda: client.forward(q, k, v, cu, cu, causal=True), repeats), payload


def dropin_step(client: attnserve.Client, repeats: int) -> float:
    """Seconds of one forward + backward of the issue's shape on CUDA tensors."""
    import torch

    shape = DROPIN_SHAPE
    tokens = shape["batch"] * shape["seqlen"]
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    q, k, v, dout = (torch.randn(tokens, shape["heads"], shape["dim"], device=device,
                                 dtype=torch.bfloat16, generator=gen) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    cu = torch.arange(0, tokens + 1, shape["seqlen"], dtype=torch.int32, device=device)

    def step():
        out = attnserve.flash_attn_varlen_func(*leaves, cu, cu, shape["seqlen"],
                                               shape["seqlen"], causal=True, client=client)
        out.backward(dout)
        torch.cuda.synchronize()

    return _median_time(step, repeats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="a running server's gRPC host:port")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, default=4,
                        help="parallel raw connections and data channel connections")
    parser.add_argument("--raw-bytes", type=int, default=RAW_BYTES)
    parser.add_argument("--tokens", type=int, default=32768,
                        help="numpy forward tokens (default: 539 MB at 16 x 128 bf16)")
    parser.add_argument("--seqlen", type=int, default=64)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--before", action="store_true",
                        help="measure only the raw sockets and the drop-in, with an older "
                             "attnserve package on PYTHONPATH (its Client takes no transport)")
    parser.add_argument("--skip-grpc", action="store_true",
                        help="leave out the gRPC rows (slow at these sizes)")
    parser.add_argument("--shared-memory", action="store_true",
                        help="add the numpy forward through system shared memory (the server "
                             "runs on this host with --allow_shared_memory)")
    args = parser.parse_args()

    rows = []
    raw = {}
    for connections in sorted({1, args.connections}):
        raw[connections] = raw_socket_gbps(connections, args.raw_bytes, args.repeats)
        rows.append((f"raw socket, {connections} connection(s), one way",
                     f"{args.raw_bytes / 1e6:.0f} MB", "", f"{raw[connections]:.2f}", ""))

    if args.before:
        # An older attnserve package on PYTHONPATH: its only path, for a before/after.
        fast = slow = attnserve.Client(args.target, timeout=600)
        transport = "before"
    else:
        # The drop-in's CUDA tensors would take CUDA shared memory on a server that allows it.
        fast = attnserve.Client(args.target, timeout=600, data_connections=args.connections,
                                shared_memory="off", cuda_shared_memory="off")
        slow = attnserve.Client(args.target, timeout=600, transport="grpc", shared_memory="off",
                                cuda_shared_memory="off")
        transport = fast.active_transport()
    clients = [("data channel", fast)] if transport == "data_channel" else []
    if not args.skip_grpc and not args.before:
        clients.append(("gRPC", slow))
    shared = None
    if args.shared_memory and not args.before:
        shared = attnserve.Client(args.target, timeout=600, shared_memory="auto")
        if shared.active_transport() != "shared_memory":
            print("no shared memory: is the server on this host, with --allow_shared_memory?",
                  file=sys.stderr)
            return 1
        clients.append(("shared memory", shared))
    rates = {}
    for name, client in clients:
        seconds, payload = numpy_forward(client, args.tokens, args.seqlen, args.heads, args.dim,
                                         args.repeats)
        gbps = rates[name] = payload / seconds / 1e9
        ratio = f"{gbps / raw[1]:.2f}x raw"
        if name == "shared memory" and "data channel" in rates:
            ratio += f", {gbps / rates['data channel']:.2f}x data channel"
        rows.append((f"numpy forward, {name}", f"{payload / 1e6:.0f} MB", f"{seconds:.3f}",
                     f"{gbps:.2f}", ratio))
    if shared is not None:
        shared.close()

    try:
        import torch
        cuda = torch.cuda.is_available()
    except ModuleNotFoundError:
        cuda = False
    if cuda:
        ideal = DROPIN_TARGET_BYTES / (raw[1] * 1e9)
        dropin = [(f"torch drop-in fwd+bwd, {transport.replace('_', ' ')}", fast)]
        if not args.skip_grpc and transport not in ("grpc", "before"):
            dropin.append(("torch drop-in fwd+bwd, gRPC", slow))
        for name, client in dropin:
            seconds = dropin_step(client, args.repeats)
            rows.append((name, "537 MB ideal", f"{seconds:.3f}",
                         f"{DROPIN_TARGET_BYTES / seconds / 1e9:.2f}",
                         f"{seconds / ideal:.2f}x (537 MB / raw = {ideal:.3f} s)"))
    fast.close()
    if slow is not fast:
        slow.close()

    print(f"server {args.target}, client transport {transport}, {args.repeats} repeats "
          "(medians)\n")
    print("| what | bytes | seconds | GB/s | ratio |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
