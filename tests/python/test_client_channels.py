"""The client's channel: retries of UNAVAILABLE, deadlines, round-robin over several servers,
one cached channel per target, and the default target ($ATTNSERVE_TARGET)."""
import re
import time

import grpc
import numpy as np
import pytest

import attnserve
from attnserve import connections
from fake_server import FakeAttentionServer
from server_process import MAIN_LIMITS, ServerProcess, require_binary


def _inputs(rng, tokens=8, heads=2, dim=16):
    q, k, v = (rng.standard_normal((tokens, heads, dim)).astype(np.float32) for _ in range(3))
    return q, k, v, [0, tokens], [0, tokens]


def test_unavailable_is_retried_until_it_succeeds(rng):
    with FakeAttentionServer(failures=2) as fake, attnserve.Client(fake.target, 10) as client:
        client.forward(*_inputs(rng))
    assert fake.calls == 3


def test_retries_stop_after_the_policy_s_attempts(rng):
    with FakeAttentionServer(failures=100) as fake, \
            attnserve.Client(fake.target, 10, retries=2) as client:
        with pytest.raises(attnserve.AttentionError) as error:
            client.forward(*_inputs(rng))
    assert error.value.code == grpc.StatusCode.UNAVAILABLE
    assert fake.calls == 3


def test_other_codes_and_retries_0_are_not_retried(rng):
    with FakeAttentionServer(failures=1, code=grpc.StatusCode.INVALID_ARGUMENT) as fake, \
            attnserve.Client(fake.target, 10) as client:
        with pytest.raises(attnserve.AttentionError):
            client.forward(*_inputs(rng))
    assert fake.calls == 1
    with FakeAttentionServer(failures=1) as fake, \
            attnserve.Client(fake.target, 10, retries=0) as client:
        with pytest.raises(attnserve.AttentionError):
            client.forward(*_inputs(rng))
    assert fake.calls == 1


def test_requests_larger_than_grpc_s_default_retry_buffer_are_retried(rng):
    # 3 x 128 KiB of float32: over the 256 KiB gRPC would buffer for a retry by default.
    with FakeAttentionServer(failures=1) as fake, attnserve.Client(fake.target, 10) as client:
        client.forward(*_inputs(rng, tokens=256, heads=4, dim=32))
    assert fake.calls == 2


def test_deadline_fails_a_slow_call(rng):
    with FakeAttentionServer(delay_s=2.0) as fake, attnserve.Client(fake.target, 10) as client:
        start = time.monotonic()
        with pytest.raises(attnserve.AttentionError) as error:
            client.forward(*_inputs(rng), timeout=0.2)
        assert time.monotonic() - start < 1.5
    assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def _ok_calls(server, rpc):
    pattern = re.compile(r'^attnserve_requests_total\{(.*)\} (\S+)$')
    total = 0.0
    for line in server.http_get("/metrics").decode().splitlines():
        match = pattern.match(line)
        if match and f'rpc="{rpc}"' in match[1] and 'code="OK"' in match[1]:
            total += float(match[2])
    return total


def test_round_robin_spreads_calls_over_every_address():
    servers = [ServerProcess(require_binary(), MAIN_LIMITS).start() for _ in range(2)]
    try:
        target = "ipv4:" + ",".join(s.target for s in servers)
        with attnserve.Client(target, timeout=30) as client:
            for _ in range(20):
                client.server_info()
        counts = [_ok_calls(s, "GetServerInfo") for s in servers]
    finally:
        # Both at once: each takes a while to drain.
        for s in servers:
            s.terminate()
        codes = [s.wait() for s in servers]
    assert sum(counts) == 20 and min(counts) >= 5, counts
    assert codes == [0, 0]


def test_dns_target(server):
    with attnserve.Client(f"dns:///{server.target}", timeout=30) as client:
        assert client.server_info().version


@pytest.fixture
def no_default(monkeypatch):
    monkeypatch.delenv(connections.TARGET_ENV, raising=False)
    attnserve.set_default_client(None)
    yield monkeypatch
    attnserve.set_default_client(None)


def test_one_cached_client_per_target(server, no_default):
    first = attnserve.client_for(server.target)
    assert attnserve.client_for(server.target) is first
    assert attnserve.client_for(f"dns:///{server.target}") is not first


def test_default_client_comes_from_the_environment(server, no_default):
    with pytest.raises(RuntimeError, match=connections.TARGET_ENV):
        attnserve.default_client()
    no_default.setenv(connections.TARGET_ENV, server.target)
    assert attnserve.default_client() is attnserve.client_for(server.target)
    assert attnserve.default_client().server_info().version


def test_set_default_client_overrides_the_environment(server, no_default):
    no_default.setenv(connections.TARGET_ENV, "127.0.0.1:1")
    with attnserve.Client(server.target) as client:
        attnserve.set_default_client(client)
        assert attnserve.default_client() is client
    attnserve.set_default_client(server.target)
    assert attnserve.default_client() is attnserve.client_for(server.target)


def test_timeout_from_the_environment(no_default):
    no_default.setenv(connections.TIMEOUT_ENV, "12.5")
    assert connections.client_for("127.0.0.1:2").timeout == 12.5
    no_default.setenv(connections.TIMEOUT_ENV, "none")
    assert connections.client_for("127.0.0.1:3").timeout is None


def test_retries_beyond_grpc_s_cap_are_refused():
    with pytest.raises(ValueError):
        attnserve.Client("127.0.0.1:1", retries=5)
