"""Fixtures that run the real server for the end-to-end tests."""
import numpy as np
import pytest

import attnserve
from server_process import CALL_TIMEOUT_S, MAIN_LIMITS, SMALL_LIMITS, run_server


@pytest.fixture(scope="session")
def server():
    yield from run_server(MAIN_LIMITS)


@pytest.fixture(scope="session")
def small_server():
    yield from run_server(SMALL_LIMITS)


@pytest.fixture(scope="session")
def client(server):
    with attnserve.Client(server.target, timeout=CALL_TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="session")
def small_client(small_server):
    with attnserve.Client(small_server.target, timeout=CALL_TIMEOUT_S) as client:
        yield client


@pytest.fixture
def rng(request):
    """Fresh random inputs each run; the seed appears in a failing test's report."""
    seed = np.random.SeedSequence()
    request.node.add_report_section("call", "seed", str(seed.entropy))
    return np.random.default_rng(seed)
