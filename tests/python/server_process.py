"""Runs build/bin/attnserve on free loopback ports for the end-to-end tests."""
import os
import pathlib
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Callable, Dict, Optional, Sequence, Union

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_BINARY = REPO_ROOT / "build" / "bin" / "attnserve"
READY_TIMEOUT_S = 30.0
# A deadline for the tests' calls: generous for a 2-core CI machine.
CALL_TIMEOUT_S = 30
STOP_TIMEOUT_S = 20.0

# Explicit limits, so test_info can check that the server reports what it was given; large
# enough for every case the tests send.
MAIN_LIMITS = {"max_total_tokens": 4096, "max_head_dim": 256, "max_batch": 64,
               "max_message_bytes": 64 << 20}
# Small limits for the rejection tests; a request of 64 tokens, 2 heads, head_dim 32 in float32
# (three 16 KiB tensors) still fits the message limit.
SMALL_LIMITS = {"max_total_tokens": 64, "max_head_dim": 32, "max_batch": 4,
                "max_message_bytes": 64 << 10}


def binary_path() -> Optional[pathlib.Path]:
    """The server binary: $ATTNSERVE_BIN, else the build's; None if the build has none yet."""
    explicit = os.environ.get("ATTNSERVE_BIN")
    if explicit:
        return pathlib.Path(explicit)
    return DEFAULT_BINARY if DEFAULT_BINARY.exists() else None


def require_binary() -> pathlib.Path:
    """The binary, or skip the test while the build has none; a wrong ATTNSERVE_BIN fails."""
    path = binary_path()
    if path is None:
        pytest.skip("build/bin/attnserve is not built (or set ATTNSERVE_BIN)")
    if not path.exists():
        pytest.fail(f"ATTNSERVE_BIN={path} does not exist")
    return path


def _free_ports(count: int):
    # Held open together so the ports differ; another process could still take one before the
    # server binds it, which start() reports with the server's own error.
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class ServerProcess:
    """One attnserve process on the CPU backend; flags are extra --name=value pairs."""

    def __init__(self, binary: pathlib.Path, flags: Optional[Dict[str, object]] = None,
                 preexec_fn: Optional[Callable[[], None]] = None):
        self.binary = binary
        self.flags = dict(flags or {})
        self.preexec_fn = preexec_fn  # run in the child before exec, e.g. to set rlimits
        # Each server its own data channel port: tests run servers side by side.
        self.grpc_port, self.http_port, self.data_port = _free_ports(3)
        self.target = f"127.0.0.1:{self.grpc_port}"
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        # A file, not a pipe: nobody drains a pipe while tests run, and a full one blocks the
        # server's logging.
        self._log = tempfile.TemporaryFile()
        self.process: Optional[subprocess.Popen] = None

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def start(self) -> "ServerProcess":
        command = [str(self.binary), f"--grpc_port={self.grpc_port}",
                   f"--http_port={self.http_port}", f"--data_port={self.data_port}",
                   "--devices=cpu", "--host=127.0.0.1"]
        command += [f"--{name}={value}" for name, value in self.flags.items()]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=self.preexec_fn)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{' '.join(command)} exited with {self.process.returncode} "
                                   f"before it was ready:\n{self.log()}")
            if self.http_status("/readyz") == 200:
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{' '.join(command)} not ready after {READY_TIMEOUT_S} s:\n"
                           f"{self.log()}")

    def http_status(self, path: str) -> Optional[int]:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except OSError:
            return None

    def http_get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.http_url + path, timeout=10) as response:
            return response.read()

    def metric(self, name: str, labels: str = "") -> float:
        """One series of /metrics (labels as written there, e.g. 'device="cpu"'); 0 if absent."""
        braces = r"\{" + re.escape(labels) + r"\}" if labels else ""
        match = re.search(r"^" + re.escape(name) + braces + r" (\S+)$",
                          self.http_get("/metrics").decode(), re.M)
        return float(match.group(1)) if match else 0.0

    def wait_for_metric(self, name: str, value: float, labels: Union[str, Sequence[str]] = "",
                        timeout: float = 30) -> float:
        """Waits until the series (or the sum of the series, given several label sets) reaches
        at least `value` and returns it; fails the test after `timeout`."""
        label_sets = [labels] if isinstance(labels, str) else list(labels)
        deadline = time.monotonic() + timeout
        while (total := sum(self.metric(name, l) for l in label_sets)) < value:
            if time.monotonic() > deadline:
                pytest.fail(f"{name}{label_sets} never reached {value}")
            time.sleep(0.01)
        return total

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> Optional[int]:
        """The exit code, or None (after killing it) if it did not exit in time."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def stop(self) -> Optional[int]:
        """SIGTERM, then the exit code; None if it had to be killed."""
        if self.process.poll() is None:
            self.terminate()
        return self.wait()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def run_server(flags, preexec_fn=None):
    """Yields a started server; at teardown it must exit 0 on SIGTERM."""
    server = ServerProcess(require_binary(), flags, preexec_fn).start()
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"server exit code {code} after SIGTERM:\n{server.log()}"
