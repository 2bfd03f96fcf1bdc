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

--lifetimes N restarts the server N-1 times. --features turns on the GPU soak's phases
(workload.py): GPU dtypes and tolerances, device memory exhausted by groups of large requests,
clients that stop reading, and device faults injected (--inject_device_fault) into some
lifetimes, where UNAVAILABLE naming the fault is an allowed answer and the device must come
back after a reset or say it is out of service; device memory in use is sampled as RSS is.
--gpu sets them all, --devices=auto and the GPU soak's duration (scripts/soak.sh --gpu).

    tests/soak/soak.py --duration 300 --workers 3 --out /tmp/soak
    tests/soak/soak.py --gpu --binary .gpu-bundle/bin/attnserve --out $OUT
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
import traceback

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


# --gpu: the GPU soak's defaults (each can still be given explicitly). 510 s of load, with the
# three starts, two drains and the rest at the end about 9 minutes: within the 10 minutes one
# command may run on the GPU machine, so that soak.json is written.
GPU_DEFAULTS = {"duration": 510, "devices": "auto", "features": ",".join(workload.KNOWN_FEATURES),
                "lifetimes": 3, "workers": 4, "warmup": 30}
CPU_DEFAULTS = {"duration": 300, "devices": "cpu", "features": "", "lifetimes": 2, "workers": 3,
                "warmup": 15}
# With the memory phase, three requests of 12 MiB each (and their 16 MiB of working memory
# and answers) are in flight at once now and then, and the allocator keeps such peaks: a leak
# of even one buffer per memory group would still pass this bound within a minute.
MEMORY_RSS_GROWTH_MIB = 96
# The injected fault, in lifetimes that get one: the first at this launch, then every so many
# launches (where the binary's --inject_device_fault knows +EVERY; else only the first).
DEFAULT_FAULT = "1000+2000"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.environ.get("ATTNSERVE_BIN", str(DEFAULT_BINARY)),
                        help="attnserve binary (default: $ATTNSERVE_BIN, else build/bin/attnserve)")
    parser.add_argument("--gpu", action="store_true",
                        help="the GPU soak: defaults become " + ", ".join(
                            f"--{k} {v}" for k, v in GPU_DEFAULTS.items()))
    parser.add_argument("--devices", help="the server's --devices (cpu; --gpu: auto)")
    parser.add_argument("--features", help="comma-separated optional phases: "
                        + ", ".join(workload.KNOWN_FEATURES) + " (see workload.py; "
                        "default none, --gpu: all)")
    parser.add_argument("--lifetimes", type=int,
                        help="server lifetimes, each ended by SIGTERM and followed by a restart "
                             "on the same ports (2; --gpu: 3)")
    parser.add_argument("--fault", default=DEFAULT_FAULT, metavar="LAUNCH[+EVERY]",
                        help="with the faults phase: the --inject_device_fault launches of the "
                             "lifetimes that get one (default %(default)s)")
    parser.add_argument("--fault-device",
                        help="the device that faults (default: cpu, or cuda:0 unless "
                             "--devices=cpu)")
    parser.add_argument("--fault-lifetimes", type=int, nargs="+", default=None,
                        help="1-based lifetimes that get the fault (default: the even ones; a "
                             "trapped kernel may leave a GPU out of service until the process "
                             "restarts, so the next lifetime shows it back)")
    parser.add_argument("--out-of-service-restart", type=float, default=20, metavar="S",
                        help="a lifetime whose injected fault has left its device out of "
                             "service this long (a GPU whose trapped kernel's sticky error "
                             "survives cudaDeviceReset, README 'Device faults') ends early, as "
                             "the liveness probe would restart it (default %(default)s)")
    parser.add_argument("--max-device-memory-growth-mib", type=float, default=64,
                        help="allowed growth of the median device memory in use (the server's "
                             "attnserve_device_memory_used_bytes) over each lifetime's load")
    parser.add_argument("--duration", type=float,
                        help="seconds of load in all, shared evenly by the lifetimes (300; "
                             "--gpu: 510); restarts add their own time")
    parser.add_argument("--workers", type=int, help="client processes (3; --gpu: 4)")
    parser.add_argument("--warmup", type=float,
                        help="seconds after each server start before the RSS/fd baseline (15; "
                             "--gpu: 30)")
    parser.add_argument("--restart-gap", type=float, default=1.0,
                        help="seconds between the first server's exit and the restart")
    parser.add_argument("--victim-interval", type=float, nargs=2, default=(3.0, 8.0),
                        metavar=("MIN", "MAX"), help="seconds between SIGKILLed clients")
    parser.add_argument("--max-rss-growth-mib", type=float,
                        help="allowed growth of the median RSS from just after warmup to just "
                             "before the load ends (medians over --rss-window seconds): 16, or "
                             f"{MEMORY_RSS_GROWTH_MIB} with the memory phase")
    parser.add_argument("--rss-window", type=float, default=30)
    parser.add_argument("--max-fd-growth", type=int, default=8)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default=None, help="folder for soak.json and soak.md")
    args = parser.parse_args(argv)
    for name, value in (GPU_DEFAULTS if args.gpu else CPU_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.features = sorted(set(filter(None, args.features.split(","))))
    if set(args.features) - set(workload.KNOWN_FEATURES):
        parser.error(f"--features: known are {', '.join(workload.KNOWN_FEATURES)}")
    if not 2 <= args.lifetimes <= worker.MAX_RESTARTS + 1:
        parser.error(f"--lifetimes must be 2 to {worker.MAX_RESTARTS + 1}")
    if args.duration < 2 * args.lifetimes * args.warmup:
        parser.error("--duration must be at least 2x --warmup per lifetime")
    if args.max_rss_growth_mib is None:
        args.max_rss_growth_mib = MEMORY_RSS_GROWTH_MIB if "memory" in args.features else 16
    if args.fault_device is None:
        args.fault_device = "cpu" if args.devices == "cpu" else "cuda:0"
    if args.fault_lifetimes is None:
        args.fault_lifetimes = list(range(2, args.lifetimes + 1, 2))
    if "faults" not in args.features:
        args.fault_lifetimes = []
    return args


def fault_spec(binary, device, fault) -> str:
    """The --inject_device_fault value: DEVICE@LAUNCH+EVERY, or DEVICE@LAUNCH where the binary
    predates +EVERY (its --helpfull does not mention it)."""
    if "+" in fault:
        help_text = subprocess.run([str(binary), "--helpfull"], capture_output=True, text=True,
                                   timeout=30)
        if "+EVERY" not in help_text.stdout + help_text.stderr:
            fault = fault.split("+", 1)[0]
    return f"{device}@{fault}"


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
                if line.endswith(" device"):  # refused for a device fault: allowed
                    self.counts[f"device_refused|{phase}|{rpc}|victim"] += 1
                    continue
                # Victims never run across the restart, so every other error is unexpected.
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

    def wait_until(self, t, sample_label_at=None, may_cut_short=False):
        """Sleeps until monotonic time t, sampling RSS/fds and watching the server. With
        may_cut_short, returns early once the warmup sample is taken and a device faulted on
        purpose has stayed out of service for --out-of-service-restart seconds, as the liveness
        probe would restart such a server."""
        next_sample = time.monotonic()
        while time.monotonic() < t:
            if not self.current.alive():
                self.counts["server_died"] += 1
                self.fail(f"{self.current.name} exited on its own with "
                          f"{self.current.server.process.returncode}:\n"
                          f"{self.current.server.log()[-3000:]}")
                return False
            now = time.monotonic()
            sample = None
            if sample_label_at and now >= sample_label_at[1]:
                sample = self.current.sample(sample_label_at[0])
                sample_label_at = None
            elif now >= next_sample:
                sample = self.current.sample()
                next_sample = now + SAMPLE_INTERVAL_S
            if sample is not None and self.current.fault:
                if not sample.get("devices_unhealthy"):
                    self.current.out_of_service_since = None
                elif self.current.out_of_service_since is None:
                    self.current.out_of_service_since = now
                elif (may_cut_short and "warmup" in self.current.samples
                      and now - self.current.out_of_service_since
                      >= self.args.out_of_service_restart):
                    self.current.cut_short = True
                    return True
            time.sleep(min(0.2, max(0.0, t - time.monotonic())))
        return True

    def start_lifetime(self, ports=None):
        index = len(self.lifetimes) + 1
        flags = dict(workload.SERVER_LIMITS, devices=self.args.devices)
        fault = None
        if index in self.args.fault_lifetimes:
            fault = flags["inject_device_fault"] = fault_spec(
                self.binary, self.args.fault_device, self.args.fault)
            # Resets are tried again after 0.2 s rather than 1 s, so an injected fault on the
            # CPU device (whose resets succeed) costs the soak little time.
            flags["device_reset_interval_seconds"] = 0.2
        lifetime = Lifetime(f"L{index}", self.binary, flags, ports, fault=fault)
        self.lifetimes.append(lifetime)
        return lifetime.start()

    def run(self):
        args = self.args
        started = time.monotonic()
        first = self.start_lifetime()
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
        alive = True
        # Each lifetime gets its share of the load from when its server was ready: on a
        # loaded machine a drain and restart can take tens of seconds.
        share = args.duration / args.lifetimes
        for restart in range(args.lifetimes - 1):
            restart_at = self.current.ready_at + share
            alive = self.wait_until(restart_at - VICTIM_QUIET_S,
                                    ("warmup", self.current.ready_at + args.warmup),
                                    may_cut_short=True)
            self.victims_allowed.clear()
            if alive:
                with self.victim_running:
                    alive = self.wait_until(min(restart_at, time.monotonic() + VICTIM_QUIET_S))
            if not alive:
                break
            self.restart(restart)
            self.victims_allowed.set()
        if alive:
            alive = self.wait_until(self.current.ready_at + share,
                                    ("warmup", self.current.ready_at + args.warmup))
        self.victims_allowed.clear()
        if alive:
            self.current.sample("load_end")
        self.shared.stop.set()
        reports = self.collect(processes)
        victims.join(timeout=VICTIM_READY_TIMEOUT_S + 10)
        self.stop_last()
        return reports, len(processes), time.monotonic() - started

    def restart(self, index):
        """SIGTERM under load with work in flight, a gap, and a new server on the same ports;
        the shared times tell the clients which server answered and when refusals are due."""
        old = self.current
        old.sample("load_end")
        burst = DrainBurst(old.server.target, self.rng)
        burst.send(old)
        self.shared.mark(index, worker.WINDOW_START, time.monotonic())
        old.terminate_and_capture()
        burst.settle(self.counts, self.shared, self.fail)
        time.sleep(self.args.restart_gap)
        self.shared.mark(index, worker.BOUNDARY, time.monotonic())
        new = self.start_lifetime(old.ports)
        self.shared.mark(index, worker.WINDOW_END, time.monotonic())
        return new

    def stop_last(self):
        last = self.current
        if last.alive():
            # Quiet now: the counters are final once the last closed calls have left (an
            # unread call's close reaches the server a moment after its client exited), and
            # this sample is taken at rest.
            last.final_metrics = last.metrics()
            settle_by = time.monotonic() + REST_MARGIN_S
            while last.final_metrics["inflight"] and time.monotonic() < settle_by:
                time.sleep(0.1)
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
    # Client processes and victims import workload afresh: the environment tells them.
    os.environ[workload.FEATURES_ENV] = ",".join(args.features)
    workload.configure(args.features)
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="attnserve-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    soak = Soak(args)
    began = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = os.getloadavg()
    started = time.monotonic()
    stopped_early = None
    try:
        reports, expected, elapsed = soak.run()
    except Exception:  # soak.json still says what was seen, and why the soak stopped
        stopped_early = traceback.format_exc()
        reports, expected, elapsed = 0, args.workers, time.monotonic() - started
        soak.shared.stop.set()
    finally:
        for lifetime in soak.lifetimes:
            lifetime.server.kill()  # only if still running after an error
    limits = {"rss_growth_kib": int(args.max_rss_growth_mib * 1024),
              "rss_window_s": args.rss_window, "fd_growth": args.max_fd_growth,
              "device_memory_growth_bytes": int(args.max_device_memory_growth_mib * (1 << 20)),
              "features": args.features, "fault_lifetimes": args.fault_lifetimes,
              "lifetimes": args.lifetimes}
    lifetimes = [lifetime.summary() for lifetime in soak.lifetimes]
    if stopped_early is None:
        checks = invariants.check(soak.counts, lifetimes, expected, reports, limits)
    else:  # the invariants assume a soak that ran its course
        checks = invariants.Checks()
        checks.add("the soak ran to its end", False, stopped_early)
        print(stopped_early, file=sys.stderr)
    data = {"started": began, "command": " ".join([sys.executable] + sys.argv),
            "machine": machine(), "binary": str(soak.binary),
            "elapsed_s": elapsed, "workers": args.workers, "seed": soak.seed,
            "devices": args.devices, "features": args.features,
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
