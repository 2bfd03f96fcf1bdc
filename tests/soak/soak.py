"""Fault-injecting soak of attnserve on loopback, bounded in time.

Starts the server (CPU backend), runs client processes that send small mixed forward and
backward requests (fp32/fp16/bf16, GQA, causal, windows), each answer checked against the
float64 reference, over raw gRPC and through the Python client (its data channel and its
gRPC transport), with saved contexts whose backwards find them, or find them released, expired
or unknown and resend in full, and with faults mixed in: client cancellations, deadlines that
expire, malformed and oversized requests, channels closed under a call, data channel
connections closed mid-payload, clients killed with SIGKILL mid-call, and one SIGTERM half way (with a burst of larger calls in flight, see
drain_burst.py) followed by a restart on the same ports. Then checks that
every call resolved exactly once and correctly, that the servers' counters agree with the
clients' (invariants.py says exactly how), that RSS and fds stayed flat, that at rest the
server holds no data channel buffers, sessions or connections and frees saved contexts within
their TTL, and that both servers exited 0. Writes soak.json and soak.md into --out; exit
status 0 only if every check passed.

    tests/soak/soak.py --duration 300 --workers 3 --out /tmp/soak
"""
import argparse
import collections
import multiprocessing
import os
import pathlib
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "python")]

import invariants  # noqa: E402
import report  # noqa: E402
import worker  # noqa: E402
import workload  # noqa: E402
from drain_burst import DrainBurst  # noqa: E402
from lifetime import Lifetime  # noqa: E402
from server_process import DEFAULT_BINARY  # noqa: E402

SAMPLE_INTERVAL_S = 2.0
VICTIM_READY_TIMEOUT_S = 60.0
# Victims pause this long before the SIGTERM, so none straddles the restart.
VICTIM_QUIET_S = 5.0
# At rest, the data channel's holdings must be gone within this, and saved contexts within
# their TTL plus this (the context store sweeps every 250 ms).
REST_MARGIN_S = 1.5


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.environ.get("ATTNSERVE_BIN", str(DEFAULT_BINARY)),
                        help="attnserve binary (default: $ATTNSERVE_BIN, else build/bin/attnserve)")
    parser.add_argument("--duration", type=float, default=300, help="seconds of load in all")
    parser.add_argument("--workers", type=int, default=3, help="client processes")
    parser.add_argument("--warmup", type=float, default=15,
                        help="seconds after each server start before the RSS/fd baseline")
    parser.add_argument("--restart-gap", type=float, default=1.0,
                        help="seconds between the first server's exit and the restart")
    parser.add_argument("--victim-interval", type=float, nargs=2, default=(3.0, 8.0),
                        metavar=("MIN", "MAX"), help="seconds between SIGKILLed clients")
    parser.add_argument("--max-rss-growth-mib", type=float, default=16,
                        help="allowed growth of the median RSS from just after warmup to just "
                             "before the load ends (medians over --rss-window seconds)")
    parser.add_argument("--rss-window", type=float, default=30)
    parser.add_argument("--max-fd-growth", type=int, default=8)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default=None, help="folder for soak.json and soak.md")
    args = parser.parse_args(argv)
    if args.duration < 4 * args.warmup:
        parser.error("--duration must be at least 4x --warmup (two lifetimes, each warmed up)")
    return args


class Soak:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.rng = np.random.default_rng(self.seed)
        self.context = multiprocessing.get_context("spawn")  # no fork after grpc is loaded
        self.shared = worker.Shared(self.context)
        self.results = self.context.Queue()
        self.counts = collections.Counter()
        self.failures = []
        self.lifetimes = []
        self.victims = {"killed": 0, "failed_to_start": 0}
        self.victims_allowed = threading.Event()
        self.victim_running = threading.Lock()
        self.binary = pathlib.Path(args.binary)

    @property
    def current(self):
        return self.lifetimes[-1]

    # ---- victims: clients killed with SIGKILL mid-call ------------------------------------

    def victim_loop(self):
        low, high = self.args.victim_interval
        while not self.shared.stop.wait(float(self.rng.uniform(low, high))):
            if self.victims_allowed.is_set():
                with self.victim_running:
                    if self.victims_allowed.is_set():
                        self.run_victim()

    def run_victim(self):
        rpc = worker.RPCS[int(self.rng.random() < 0.4)]
        command = [sys.executable, str(HERE / "victim.py"), self.current.server.target,
                   str(int(self.rng.integers(1 << 31))), rpc]
        with tempfile.TemporaryFile() as stderr:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr)
            output = self._read_until(process, b"ready\n", VICTIM_READY_TIMEOUT_S)
            if b"ready\n" not in output:
                process.kill()
                process.stdout.close()
                process.wait()
                stderr.seek(0)
                self.victims["failed_to_start"] += 1
                self.fail(f"victim never got ready: {stderr.read()[-1000:]!r}")
                return
            time.sleep(float(self.rng.uniform(0.05, 1.0)))
            process.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            output += process.stdout.read()
            process.stdout.close()
            process.wait()
        self.victims["killed"] += 1
        self.count_victim(output.decode().split("\n"), rpc, self.shared.phase(killed_at))

    @staticmethod
    def _read_until(process, marker, timeout):
        output, deadline = b"", time.monotonic() + timeout
        while marker not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 0.5)
            if ready:
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    break
                output += chunk
        return output

    def count_victim(self, lines, rpc, phase):
        starts = lines.count("start")
        ended = collections.Counter()
        for line in lines:
            word = line.split(" ", 1)[0]
            if word in ("ok", "wrong"):
                ended["OK"] += 1
                if word == "wrong":
                    self.counts["wrong|victim"] += 1
                    self.fail(f"victim: {line}")
            elif word == "error":
                code = line.split()[1]
                ended[code] += 1
                # Victims never run across the restart, so every error is unexpected.
                self.counts[f"unexpected|victim|{code}"] += 1
                self.fail(f"victim {rpc} ended {code}")
        ended["KILLED"] = starts - sum(ended.values())
        self.counts["issued|victim"] += starts
        for code, n in ended.items():
            self.counts[f"outcome|{phase}|{rpc}|victim|{code}"] += n

    # ---- the timeline ---------------------------------------------------------------------

    def fail(self, what):
        self.counts["failures"] += 1
        self.failures.append(what)

    def wait_until(self, t, sample_label_at=None):
        """Sleeps until monotonic time t, sampling RSS/fds and watching the server."""
        next_sample = time.monotonic()
        while time.monotonic() < t:
            if not self.current.alive():
                self.counts["server_died"] += 1
                self.fail(f"{self.current.name} exited on its own with "
                          f"{self.current.server.process.returncode}:\n"
                          f"{self.current.server.log()[-3000:]}")
                return False
            now = time.monotonic()
            if sample_label_at and now >= sample_label_at[1]:
                self.current.sample(sample_label_at[0])
                sample_label_at = None
            elif now >= next_sample:
                self.current.sample()
                next_sample = now + SAMPLE_INTERVAL_S
            time.sleep(min(0.2, max(0.0, t - time.monotonic())))
        return True

    def start_lifetime(self, name, ports=None):
        flags = dict(workload.SERVER_LIMITS)
        lifetime = Lifetime(name, self.binary, flags, ports)
        self.lifetimes.append(lifetime)
        return lifetime.start()

    def run(self):
        args = self.args
        started = time.monotonic()
        first = self.start_lifetime("L1")
        processes = [self.context.Process(target=worker.run, daemon=True,
                                          args=(i, first.server.target, self.seed + 1 + i,
                                                self.shared, self.results,
                                                ("127.0.0.1", first.server.data_port)))
                     for i in range(args.workers)]
        for process in processes:
            process.start()
        victims = threading.Thread(target=self.victim_loop, daemon=True)
        victims.start()
        self.victims_allowed.set()
        restart_at = started + args.duration / 2
        alive = self.wait_until(restart_at - VICTIM_QUIET_S,
                                ("warmup", first.ready_at + args.warmup))
        self.victims_allowed.clear()
        if alive:
            with self.victim_running:
                alive = self.wait_until(restart_at)
        if alive:
            second = self.restart(first)
            self.victims_allowed.set()
            alive = self.wait_until(started + args.duration,
                                    ("warmup", second.ready_at + args.warmup))
        self.victims_allowed.clear()
        if alive:
            self.current.sample("load_end")
        self.shared.stop.set()
        reports = self.collect(processes)
        victims.join(timeout=VICTIM_READY_TIMEOUT_S + 10)
        self.stop_last()
        return reports, len(processes), time.monotonic() - started

    def restart(self, first):
        """SIGTERM under load with work in flight, a gap, and a new server on the same ports;
        the shared times tell the clients which server answered and when refusals are due."""
        first.sample("load_end")
        burst = DrainBurst(first.server.target, self.rng)
        burst.send(first)
        self.shared.window_start.value = time.monotonic()
        first.terminate_and_capture()
        burst.settle(self.counts, self.shared, self.fail)
        time.sleep(self.args.restart_gap)
        self.shared.boundary.value = time.monotonic()
        second = self.start_lifetime("L2", first.ports)
        self.shared.window_end.value = time.monotonic()
        return second

    def stop_last(self):
        last = self.current
        if last.alive():
            # Quiet now: the counters are final, and this sample is taken at rest.
            last.final_metrics = last.metrics()
            last.sample("rest")
            last.wait_for_rest(workload.CONTEXT_TTL_S, REST_MARGIN_S)
            last.terminate_and_capture()
        elif last.exit_code is None:
            last.exit_code = last.server.process.returncode

    def collect(self, processes):
        """Every worker's report; a worker that never reports is a hang."""
        reports = 0
        deadline = time.monotonic() + worker.CALL_TIMEOUT_S + worker.HANG_GRACE_S + 60
        for _ in processes:
            try:
                result = self.results.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:  # reported as a missing worker by the checks
                break
            reports += 1
            self.counts.update(result["counts"])
            self.failures += [f"worker {result['worker']}: {f}" for f in result["failures"]]
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                self.fail(f"client process {process.pid} did not exit")
                process.kill()
        return reports


def machine() -> str:
    """CPUs, CPU model and memory, for the record (the soak's rates depend on them)."""
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), "unknown CPU")
    memory = next(line.split(":", 1)[1].strip() for line in open("/proc/meminfo")
                  if line.startswith("MemTotal"))
    return f"{os.cpu_count()} CPUs ({model}), {memory} memory"


def main(argv=None):
    args = parse_args(argv)
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="attnserve-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    soak = Soak(args)
    began = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = os.getloadavg()
    try:
        reports, expected, elapsed = soak.run()
    finally:
        for lifetime in soak.lifetimes:
            lifetime.server.kill()  # only if still running after an error
    limits = {"rss_growth_kib": int(args.max_rss_growth_mib * 1024),
              "rss_window_s": args.rss_window, "fd_growth": args.max_fd_growth}
    lifetimes = [lifetime.summary() for lifetime in soak.lifetimes]
    checks = invariants.check(soak.counts, lifetimes, expected, reports, limits)
    data = {"started": began, "command": " ".join([sys.executable] + sys.argv),
            "machine": machine(), "binary": str(soak.binary),
            "elapsed_s": elapsed, "workers": args.workers, "seed": soak.seed,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "limits": limits, "counts": dict(soak.counts), "victims": soak.victims,
            "lifetimes": lifetimes, "failures": soak.failures, "checks": checks.results,
            "passed": checks.passed}
    report.write_json(out / "soak.json", data)
    summary = report.markdown(data)
    (out / "soak.md").write_text(summary)
    print(summary)
    print(f"written: {out / 'soak.json'}, {out / 'soak.md'}")
    return 0 if checks.passed else 1


if __name__ == "__main__":
    sys.exit(main())
