"""A short soak in CI: the full fault mix and the SIGTERM/restart, bounded to about a minute.
soak.py does the checking; this asserts that every one of its checks ran and passed."""
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from server_process import require_binary  # noqa: E402

SOAK = pathlib.Path(__file__).resolve().parent / "soak.py"
# Two server lifetimes of ~20 s each: long enough for every fault kind to occur several times.
ARGS = ["--duration", "40", "--warmup", "6", "--workers", "2", "--victim-interval", "2", "5"]


def test_short_soak(tmp_path):
    binary = require_binary()
    completed = subprocess.run([sys.executable, str(SOAK), "--binary", str(binary),
                                "--out", str(tmp_path), *ARGS],
                               capture_output=True, text=True, timeout=240)
    summary = completed.stdout[-20000:] + completed.stderr[-5000:]
    data = json.loads((tmp_path / "soak.json").read_text())
    failed = [c for c in data["checks"] if not c["ok"]]
    assert not failed, f"{failed}\n{summary}"
    assert completed.returncode == 0, summary
    # Both lifetimes were checked against the servers' own counters, not skipped.
    names = {c["check"].split(" ", 1)[0] for c in data["checks"] if "server OK" in c["check"]}
    assert names == {"L1", "L2"}, data["checks"]
