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


# Gauges of what the data channel and the context store hold, summed over their labels.
HELD = {"attnserve_data_buffered_bytes": "data_buffered_bytes",
        "attnserve_data_sessions": "data_sessions",
        "attnserve_data_connections": "data_connections",
        "attnserve_contexts": "contexts", "attnserve_context_bytes": "context_bytes"}


# Per-device series, summed over the devices: short name -> metric.
DEVICE = {"device_memory_used": "attnserve_device_memory_used_bytes",
          "device_memory_reserved": "attnserve_device_memory_reserved_bytes",
          "memory_waits": "attnserve_memory_waits_total",
          "device_faults": "attnserve_device_faults_total",
          "devices_unhealthy": None}  # devices whose attnserve_device_healthy is 0


def parse_metrics(text: str) -> dict:
    """{"requests": {"Forward|OK": n, ...}, "rejections": {reason: n}, "inflight": n,
    "held": {HELD's short names: n}, "context_lookups": {"hit"|"miss": n},
    "device": {DEVICE's short names: n}, "device_resets": {"ok"|"failed": n}}."""
    parsed = {"requests": {}, "rejections": {}, "inflight": None,
              "held": dict.fromkeys(HELD.values(), 0), "context_lookups": {},
              "device": dict.fromkeys(DEVICE, 0), "device_resets": {}}
    by_metric = {metric: short for short, metric in DEVICE.items() if metric}
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
        elif name in HELD:
            parsed["held"][HELD[name]] += int(value)
        elif name == "attnserve_context_lookups_total":
            parsed["context_lookups"][labels["result"]] = int(value)
        elif name in by_metric:
            parsed["device"][by_metric[name]] += int(value)
        elif name == "attnserve_device_healthy":
            parsed["device"]["devices_unhealthy"] += int(value == 0)
        elif name == "attnserve_device_resets_total":
            resets = parsed["device_resets"]
            resets[labels["result"]] = resets.get(labels["result"], 0) + int(value)
    return parsed


class Lifetime:
    def __init__(self, name, binary, flags, ports=None, fault=None):
        self.name = name
        self.fault = fault  # its --inject_device_fault, or None
        # When its devices were last seen going out of service (None: all in service), and
        # whether it ended early for that (soak.py --out-of-service-restart).
        self.out_of_service_since = None
        self.cut_short = False
        self.server = ServerProcess(binary, flags)
        if ports is not None:  # a restart: the clients keep their target and data channel
            self.server.grpc_port, self.server.http_port, self.server.data_port = ports
            self.server.target = f"127.0.0.1:{ports[0]}"
            self.server.http_url = f"http://127.0.0.1:{ports[1]}"
        # "warmup", "load_end" (the last sample under load), "rest" (the last server, after
        # the clients stopped) -> {"t": seconds since start, "rss_kib", "fds"}
        self.samples = {}
        self.series = []       # periodic samples, to show the curve, not just two points
        self.final_metrics = None
        # At rest, once the clients are gone: what the server still held, and seconds until
        # the data channel's and the contexts' holdings reached zero (None: they never did).
        self.rest = None
        self.exit_code = None
        self.inflight_at_sigterm = None
        self.started_at = self.ready_at = None

    @property
    def ports(self):
        return self.server.grpc_port, self.server.http_port, self.server.data_port

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
        # What the devices hold, as the server reports it (on a GPU, cudaMemGetInfo's used
        # memory of the whole device); None when the scrape failed.
        try:
            device = self.metrics(timeout=2.0)["device"]
            sample.update(device_memory_used=device["device_memory_used"],
                          devices_unhealthy=device["devices_unhealthy"])
        except OSError:
            sample.update(device_memory_used=None, devices_unhealthy=None)
        self.series.append(sample)
        if label:
            self.samples[label] = sample
        return sample

    def metrics(self, timeout=5.0) -> dict:
        with urllib.request.urlopen(self.server.http_url + "/metrics", timeout=timeout) as reply:
            return parse_metrics(reply.read().decode())

    def wait_for_rest(self, ttl_s: float, margin_s: float) -> dict:
        """Scrapes until the server holds no data channel session, connection or buffer, and
        no saved context: the first must go as soon as the clients have; contexts may stay
        for their TTL (plus the store's sweep), never longer."""
        start = time.monotonic()
        held = self.metrics()["held"]
        first = dict(held)
        drained = {"data": None, "contexts": None}
        while time.monotonic() - start <= ttl_s + margin_s:
            elapsed = round(time.monotonic() - start, 2)
            if drained["data"] is None and not (held["data_buffered_bytes"]
                                                or held["data_sessions"]
                                                or held["data_connections"]):
                drained["data"] = elapsed
            if drained["contexts"] is None and not (held["contexts"] or held["context_bytes"]):
                drained["contexts"] = elapsed
            if None not in drained.values():
                break
            time.sleep(0.2)
            held = self.metrics()["held"]
        self.rest = {"held_at_rest": first, "held_last": held, "drained_after_s": drained,
                     "ttl_s": ttl_s, "margin_s": margin_s}
        return self.rest

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
        return {"name": self.name, "fault": self.fault, "cut_short": self.cut_short,
                "ports": list(self.ports),
                "exit_code": self.exit_code,
                "inflight_at_sigterm": self.inflight_at_sigterm,
                "samples": self.samples, "series": self.series,
                "final_metrics": self.final_metrics, "rest": self.rest, "log_tail": self.server.log()[-2000:]}
