#!/usr/bin/env python3
"""Summarizes multi_gpu_bench.sh's queue samples (the server's /metrics every 0.25 s): per
device, the share of samples with no job running (reserved device memory 0), the mean queue
depth, and the share of samples where it ran nothing while another device had jobs waiting,
from the first sample with any job running to the last.

    python3 bench/queue_timeline.py queues_compute_bound_devices_auto.txt
"""
import re
import sys
from collections import defaultdict

SAMPLE = re.compile(r'^attnserve_(\w+)\{.*device="([^"]+)".*\} (\S+)$')


def samples(path):
    current = None
    for line in open(path):
        line = line.strip()
        if line.startswith("t "):
            if current:
                yield current
            current = defaultdict(dict)
        elif current is not None:
            match = SAMPLE.match(line)
            if match:
                metric, device, value = match.groups()
                current[device][metric] = float(value)
    if current:
        yield current


def main() -> int:
    rows = [s for s in samples(sys.argv[1]) if s]
    busy = [i for i, s in enumerate(rows)
            if any(d.get("device_memory_reserved_bytes", 0) > 0 for d in s.values())]
    if not busy:
        print("queue timeline: no job seen running")
        return 0
    rows = rows[busy[0]:busy[-1] + 1]
    devices = sorted({d for s in rows for d in s if d != "cpu"})
    print(f"queue timeline over {len(rows)} samples (0.25 s apart):")
    print("| device | no job running | mean queue depth | idle while another has jobs waiting |")
    print("|---|---|---|---|")
    for device in devices:
        idle = starved = 0
        depth = 0.0
        for s in rows:
            mine = s.get(device, {})
            running = mine.get("device_memory_reserved_bytes", 0) > 0
            depth += mine.get("queue_depth", 0)
            if not running:
                idle += 1
                if any(s.get(o, {}).get("queue_depth", 0) > 0 for o in devices if o != device):
                    starved += 1
        n = len(rows)
        print(f"| {device} | {100 * idle / n:.1f}% | {depth / n:.2f} | {100 * starved / n:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
