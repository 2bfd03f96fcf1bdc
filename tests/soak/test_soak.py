"""Short soaks in CI: the full fault mix and the SIGTERM/restart, bounded to about a minute,
and the GPU soak's phases on the CPU device. soak.py does the checking; this asserts that
every one of its checks ran and passed."""
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from server_process import require_binary  # noqa: E402

SOAK = pathlib.Path(__file__).resolve().parent / "soak.py"
# Two server lifetimes of ~20 s each: long enough for every fault kind to occur several times.
ARGS = ["--duration", "40", "--warmup", "6", "--workers", "2", "--victim-interval", "2", "5"]


# The GPU soak's phases on the CPU device (scripts/soak.sh --gpu runs them on a GPU): three
# lifetimes of ~15 s, the second with a device fault every 60 launches (the CPU device's resets
# succeed), device memory exhausted by groups of large requests, clients that stop reading.
# RSS is not judged here: lifetimes this short end before the allocator's high-water mark
# under 12 MiB requests settles (the 10-minute soak judges it).
PHASE_ARGS = ["--duration", "45", "--warmup", "5", "--workers", "2", "--victim-interval", "2",
              "5", "--features", "faults,memory,unread", "--lifetimes", "3", "--fault", "20+60",
              "--max-rss-growth-mib", "512"]


def _soak(tmp_path, args, timeout):
    binary = require_binary()
    completed = subprocess.run([sys.executable, str(SOAK), "--binary", str(binary),
                                "--out", str(tmp_path), *args],
                               capture_output=True, text=True, timeout=timeout)
    summary = completed.stdout[-20000:] + completed.stderr[-5000:]
    written = tmp_path / "soak.json"
    assert written.exists(), f"soak.py exited {completed.returncode} without soak.json:\n{summary}"
    data = json.loads(written.read_text())
    failed = [c for c in data["checks"] if not c["ok"]]
    assert not failed, f"{failed}\n{summary}"
    assert completed.returncode == 0, summary
    return data


def test_short_soak(tmp_path):
    data = _soak(tmp_path, ARGS, 240)
    # Both lifetimes were checked against the servers' own counters, not skipped.
    names = {c["check"].split(" ", 1)[0] for c in data["checks"] if "server OK" in c["check"]}
    assert names == {"L1", "L2"}, data["checks"]


def test_short_soak_with_the_gpu_phases_on_the_cpu(tmp_path):
    data = _soak(tmp_path, PHASE_ARGS, 300)
    names = {c["check"].split(" ", 1)[0] for c in data["checks"] if "server OK" in c["check"]}
    assert names == {"L1", "L2", "L3"}, data["checks"]
    checks = " ".join(c["check"] for c in data["checks"])
    for phase in ("injected device fault (cpu@20+60) took effect", "waited for device memory",
                  "unread ended CANCELLED", "memory:oversized ended RESOURCE_EXHAUSTED"):
        assert phase in checks, data["checks"]
    # The fault came back again after each reset, and calls were refused for it.
    faulted = data["lifetimes"][1]["final_metrics"]
    assert faulted["device"]["device_faults"] >= 2, faulted
    assert faulted["device_resets"].get("ok", 0) >= 2, faulted
    assert any(name.startswith("device_refused|") for name in data["counts"])
