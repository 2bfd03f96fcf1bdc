"""Grouped data channel calls on the GPU (issue 24 item 3), against a running server: checks
that a large multi-sequence forward and its backward, plain and by a kept context (each grouped
on the server; chunks in group order or not; even groups, and uneven ones with a group of keys
only), equal the gRPC path bitwise or within bf16 tolerance, then
prints the torch drop-in step time (transport_bench.dropin_step) and a large numpy forward's
time with the clients' group_chunks on and off. Run by bench/overlap_gpu.sh."""
import argparse
import sys

import numpy as np
from ml_dtypes import bfloat16

import attnserve
from transport_bench import _median_time, dropin_step

SEQLENS = [2048] * 8  # 8 x 2048 tokens, 16 heads, head_dim 128, bf16: 192 MiB of payload
HEADS, DIM = 16, 128
BF16_TOLERANCE = 2e-2  # relative norm error between two runs of bf16 kernels


def _error(actual, expected) -> float:
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


# Uneven groups (cross-attention lengths): the server's split makes each sequence a group, and
# group 1 has keys but no queries, so its dk and dv are zeros without a launch.
UNEVEN_Q = [3000, 0, 1500, 1500]
UNEVEN_K = [3000, 6000, 1500, 1500]


def check(fast, slow, rng, seqlens_q=SEQLENS, seqlens_k=SEQLENS, causal=True) -> bool:
    cu_q = np.array([0, *np.cumsum(seqlens_q)], np.int32)
    cu_k = np.array([0, *np.cumsum(seqlens_k)], np.int32)
    q, dout = (rng.standard_normal((int(cu_q[-1]), HEADS, DIM)).astype(bfloat16)
               for _ in range(2))
    k, v = (rng.standard_normal((int(cu_k[-1]), HEADS, DIM)).astype(bfloat16) for _ in range(2))
    ok = True

    def report(name, actual, expected):
        nonlocal ok
        bitwise = np.array_equal(np.asarray(actual).view(np.uint8),
                                 np.asarray(expected).view(np.uint8))
        error = _error(actual, expected)
        ok = ok and (bitwise or error <= BF16_TOLERANCE)
        print(f"  {name}: {'bitwise equal' if bitwise else f'rel. error {error:.2e}'}")

    forward = fast.forward(q, k, v, cu_q, cu_k, causal=causal, keep_context=True)
    expected = slow.forward(q, k, v, cu_q, cu_k, causal=causal)
    report("forward out", forward.out, expected.out)
    report("forward lse", forward.lse, expected.lse)
    args = (dout, q, k, v, expected.out, expected.lse, cu_q, cu_k)
    want = slow.backward(*args, causal=causal, deterministic=True)
    got = fast.backward(*args, causal=causal, deterministic=True)
    for name in ("dq", "dk", "dv"):
        report(f"backward {name}", getattr(got, name), getattr(want, name))
    if forward.context_id:
        got = fast.backward(*args, causal=causal, deterministic=True,
                            context_id=forward.context_id)
        for name in ("dq", "dk", "dv"):
            report(f"context backward {name}", getattr(got, name), getattr(want, name))
    else:
        print("  (the server kept no context: context backward not checked)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ok = True
    slow = attnserve.Client(args.target, timeout=600, transport="grpc")
    cu = np.array([0, *np.cumsum(SEQLENS)], np.int32)
    q, k, v = (rng.standard_normal((int(cu[-1]), HEADS, DIM)).astype(bfloat16) for _ in range(3))
    times = {}
    for group_chunks in (True, False):
        label = f"group_chunks={group_chunks}"
        with attnserve.Client(args.target, timeout=600, group_chunks=group_chunks) as fast:
            print(f"{label} ({fast.active_transport()}):")
            ok = check(fast, slow, rng) and ok
            print(f"{label}, uneven groups, one with keys only:")
            ok = check(fast, slow, rng, UNEVEN_Q, UNEVEN_K, causal=False) and ok
            times[label] = (dropin_step(fast, args.repeats),
                            _median_time(lambda: fast.forward(q, k, v, cu, cu, causal=True),
                                         args.repeats))
    slow.close()
    print("| client | drop-in step (8x2048, 16 heads, 128, bf16, causal) | numpy forward "
          "(same shape) |")
    print("|---|---|---|")
    for label, (step, forward) in times.items():
        print(f"| {label} | {step * 1e3:.1f} ms | {forward * 1e3:.1f} ms |")
    print("checks:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
