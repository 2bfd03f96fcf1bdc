"""One server lifetime under the soak: start (optionally on the ports of the previous one),
RSS and fd samples from /proc, /metrics counters, and a SIGTERM that captures the last
counters the server exported before it exited."""
import os
import re
import time
import urllib.request

from server_process import ServerProcess

_SERIES = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
SCRAPE_INTERVAL_S = 0.02
# What the server logs on SIGTERM: how many accepted requests it still has to finish.
_DRAINING = re.compile(r"received, draining (\d+) in-flight requests")


def parse_metrics(text: str) -> dict:
    """{"requests": {"Forward|OK": n, ...}, "rejections": {reason: n}, "inflight": n}."""
    parsed = {"requests": {}, "rejections": {}, "inflight": None}
    for line in text.splitlines():
        match = _SERIES.match(line)
        if not match:
            continue
        name, labels, value = match.group(1), dict(_LABEL.findall(match.group(2) or "")), \
            float(match.group(3))
        if name == "attnserve_requests_total":
            parsed["requests"][f"{labels['rpc']}|{labels['code']}"] = int(value)
        elif name == "attnserve_rejections_total":
            parsed["rejections"][labels["reason"]] = int(value)
        elif name == "attnserve_inflight_requests":
            parsed["inflight"] = int(value)
    return parsed


class Lifetime:
    def __init__(self, name, binary, flags, ports=None):
        self.name = name
        self.server = ServerProcess(binary, flags)
        if ports is not None:  # a restart: the clients keep their target
            self.server.grpc_port, self.server.http_port = ports
            self.server.target = f"127.0.0.1:{ports[0]}"
            self.server.http_url = f"http://127.0.0.1:{ports[1]}"
        # "warmup", "load_end" (the last sample under load), "rest" (the last server, after
        # the clients stopped) -> {"t": seconds since start, "rss_kib", "fds"}
        self.samples = {}
        self.series = []       # periodic samples, to show the curve, not just two points
        self.final_metrics = None
        self.exit_code = None
        self.inflight_at_sigterm = None
        self.started_at = self.ready_at = None

    @property
    def ports(self):
        return self.server.grpc_port, self.server.http_port

    def start(self):
        self.started_at = time.monotonic()
        self.server.start()
        self.ready_at = time.monotonic()
        return self

    def alive(self) -> bool:
        return self.server.process.poll() is None

    def proc_sample(self) -> dict:
        pid = self.server.process.pid
        with open(f"/proc/{pid}/status") as status:
            rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return {"t": round(time.monotonic() - self.started_at, 1), "rss_kib": rss,
                "fds": len(os.listdir(f"/proc/{pid}/fd"))}

    def sample(self, label=None):
        sample = self.proc_sample()
        self.series.append(sample)
        if label:
            self.samples[label] = sample
        return sample

    def metrics(self, timeout=5.0) -> dict:
        with urllib.request.urlopen(self.server.http_url + "/metrics", timeout=timeout) as reply:
            return parse_metrics(reply.read().decode())

    def terminate_and_capture(self, timeout=60.0):
        """SIGTERM, then scrape /metrics until the server is gone. The HTTP frontend stops
        last (after the drain and gRPC's shutdown), so the last scrape that succeeds holds
        every Forward/Backward the server answered, provided it shows nothing in flight."""
        self.server.terminate()
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            try:
                self.final_metrics = self.metrics(timeout=1.0)
            except OSError:
                pass
            time.sleep(SCRAPE_INTERVAL_S)
        self.exit_code = self.server.wait(max(1.0, deadline - time.monotonic()))
        draining = _DRAINING.search(self.server.log())
        self.inflight_at_sigterm = int(draining.group(1)) if draining else None
        return self.exit_code

    def summary(self) -> dict:
        return {"name": self.name, "ports": list(self.ports), "exit_code": self.exit_code,
                "inflight_at_sigterm": self.inflight_at_sigterm,
                "samples": self.samples, "series": self.series,
                "final_metrics": self.final_metrics, "log_tail": self.server.log()[-2000:]}
