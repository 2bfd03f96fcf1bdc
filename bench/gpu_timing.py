"""What the GPU benchmarks (bench_flash.py, bench_fallback.py, bench_cublas.py) share: how a row's
callables are timed, and the anchor rows' names and FLOPs."""

import functools
import statistics
import sys
import time

import torch

# GPU cycles of busy-wait queued before each timed call (about 2 ms), so the host's launch work
# (Python, ctypes, the dispatcher, cuDNN's graph lookup) hides behind it and the events time the
# GPU work alone. On the H100 machine that work measured 0.1-0.4 ms per call for our kernels,
# FA2 and cuDNN's forward and 0.7-0.8 ms for cuDNN's backward (2026-11-28, bench/RESULTS.md
# "Host time in the timed interval"); with the 0.1 ms of before, it landed in the short rows'
# timings (cuDNN's 32x512 backward read 15-58% low).
HOST_SLACK_CYCLES = 4_000_000


@functools.cache
def slack_ms():
    """GPU milliseconds of the slack busy-wait, measured once."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(HOST_SLACK_CYCLES)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def time_columns(fns, warmup, repeats):
    """Median milliseconds of each named callable. The callables take turns, one call each per
    round with the order rotated, so a slow stretch of the GPU (clocks, power, a neighbour's
    work) weighs on every column of a row alike; timed one after another, such a stretch lowered
    whichever column it fell on by 10-30% in some runs (bench/RESULTS.md, 2026-11-23). Warns
    when a column's host work outlasts the slack (its timing then holds host time)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times = {name: [] for name in names}
    host = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(HOST_SLACK_CYCLES)
            host_start = time.perf_counter()
            start.record()
            fns[name]()
            stop.record()
            host[name].append((time.perf_counter() - host_start) * 1e3)
            stop.synchronize()
            times[name].append(start.elapsed_time(stop))
    for name in names:
        host_ms = statistics.median(host[name])
        if host_ms > 0.8 * slack_ms():
            print(f"warning: {name}: host work {host_ms:.2f} ms per call against a slack of "
                  f"{slack_ms():.2f} ms; its GPU timing may include host time", file=sys.stderr)
    return {name: statistics.median(t) for name, t in times.items()}


def add_throughputs(row, fns, work, warmup, repeats):
    """row[name] = TFLOP/s of each callable doing `work` FLOPs, timed together (time_columns)."""
    for name, ms in time_columns(fns, warmup, repeats).items():
        row[name] = work / ms / 1e9


def seq_name(lens):
    if all(x == lens[0] for x in lens):
        return f"{len(lens)}x{lens[0]}"
    return "x".join(str(x) for x in lens)


def flops(lens, head_dim, heads, causal):
    """Forward FLOPs, 4 * sum(s^2) * d * heads, halved if causal (x2.5 for a backward)."""
    total = 4 * sum(x * x for x in lens) * head_dim * heads
    return total / 2 if causal else total
