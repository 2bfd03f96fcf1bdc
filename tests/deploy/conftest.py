"""Fixtures for the deployment tests: the real server (as tests/python starts it) and tools."""
import pathlib
import sys

import pytest

# tests/python/server_process.py starts build/bin/attnserve on free loopback ports.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from server_process import ServerProcess, require_binary  # noqa: E402

from deploy_traffic import LIMITS  # noqa: E402


@pytest.fixture(scope="session")
def attnserve_binary() -> pathlib.Path:
    return require_binary()


@pytest.fixture(scope="session")
def live_server(attnserve_binary):
    """One CPU server for the session; it must exit 0 on SIGTERM at the end."""
    server = ServerProcess(attnserve_binary, LIMITS).start()
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"server exit code {code} after SIGTERM:\n{server.log()}"
