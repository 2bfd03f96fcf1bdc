"""Summarizes one bench/multi_gpu_bench.sh configuration's host side: the server's mean CPU use
(cores busy, from /proc/<pid>/stat CPU ticks over the load run) and each GPU's mean utilization
(from `nvidia-smi --query-gpu=index,utilization.gpu -lms 500` samples).

usage: host_load_summary.py GPU_UTIL_CSV CPU_TICKS_BEFORE CPU_TICKS_AFTER WALL_BEFORE WALL_AFTER CLK_TCK
                            [MEASURED_SECONDS]

With MEASURED_SECONDS (attnload's --duration), each GPU's mean over the last that many seconds
of samples, i.e. the measured load alone: the mean over all samples also counts the seconds
before it (attnload drawing its random pool, the warm-up ramp), and a GPU's first nonzero
sample may be a blip at the server's start.
"""
import collections
import sys


def main(argv):
    path, cpu_before, cpu_after, wall_before, wall_after, ticks_per_second = argv[1:7]
    try:
        measured = float(argv[7]) if len(argv) > 7 else 0.0
    except ValueError:  # a --duration not in plain seconds: no window
        measured = 0.0
    seconds = float(wall_after) - float(wall_before)
    cpu_seconds = (float(cpu_after) - float(cpu_before)) / float(ticks_per_second)
    print(f"server CPU: {cpu_seconds / seconds:.1f} cores busy on average over {seconds:.0f} s")
    samples = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            fields = [field.strip() for field in line.split(",")]
            if len(fields) == 2 and fields[1].isdigit():
                samples[fields[0]].append(int(fields[1]))
    for gpu, values in sorted(samples.items()):
        line = (f"GPU {gpu} utilization: mean {sum(values) / len(values):.0f}% "
                f"over {len(values)} samples")
        window = values[-int(measured / 0.5):] if measured else []
        if window:
            line += f"; {sum(window) / len(window):.1f}% over the measured {measured:.0f} s"
        print(line)


if __name__ == "__main__":
    main(sys.argv)
