"""What the GPU benchmarks (bench_flash.py, bench_fallback.py, bench_cublas.py) share: how a row's
callables are timed, and the anchor rows' names and FLOPs."""

import statistics

import torch

# GPU cycles of busy-wait queued before each timed call (~100 us), so the host's launch overhead
# (Python, ctypes, the dispatcher) hides behind it and the events time the GPU work alone.
HOST_SLACK_CYCLES = 200_000


def time_columns(fns, warmup, repeats):
    """Median milliseconds of each named callable. The callables take turns, one call each per
    round with the order rotated, so a slow stretch of the GPU (clocks, power, a neighbour's
    work) weighs on every column of a row alike; timed one after another, such a stretch lowered
    whichever column it fell on by 10-30% in some runs (bench/RESULTS.md, 2026-11-23)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(HOST_SLACK_CYCLES)
            start.record()
            fns[name]()
            stop.record()
            stop.synchronize()
            times[name].append(start.elapsed_time(stop))
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
