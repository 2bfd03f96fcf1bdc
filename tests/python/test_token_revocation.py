"""Revocation fails closed (issue 19 item 10): deleting the tokens file, or rewriting it with
a UTF-8 byte-order mark, used to keep the old tokens in force even after SIGHUP."""
import os
import signal
import time

import grpc
import pytest

import attnserve
from server_process import MAIN_LIMITS, run_server

KEPT, REVOKED = "kept-4b1d", "revoked-93ac"
CALL_TIMEOUT_S = 30
RELOAD_TIMEOUT_S = 10


def write(path, text):
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(text)
    os.replace(tmp, path)


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens"
    write(path, f"{KEPT}\n{REVOKED}\n".encode())
    return path


@pytest.fixture
def server(tokens_file):
    yield from run_server({**MAIN_LIMITS, "auth_tokens_file": tokens_file})


def accepted(server, token):
    with attnserve.Client(server.target, CALL_TIMEOUT_S, token=token) as client:
        try:
            client.server_info()
            return True
        except attnserve.AttentionError as error:
            assert error.code == grpc.StatusCode.UNAUTHENTICATED, error
            return False


def wait_until(server, token, want):
    """SIGHUP, then waits until `token` is accepted (or refused) as `want` says."""
    server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    while accepted(server, token) != want:
        assert time.monotonic() < deadline, f"{token} accepted != {want}:\n{server.log()}"
        time.sleep(0.05)


def test_a_rewrite_with_a_byte_order_mark_takes_effect(server, tokens_file):
    assert accepted(server, REVOKED)
    write(tokens_file, b"\xef\xbb\xbf" + f"{KEPT}\n".encode())
    wait_until(server, REVOKED, False)
    assert accepted(server, KEPT)


def test_a_deleted_tokens_file_revokes_every_token(server, tokens_file):
    assert accepted(server, KEPT)
    tokens_file.unlink()
    wait_until(server, KEPT, False)
    assert not accepted(server, REVOKED)
    # Restored: the tokens in it work again.
    write(tokens_file, f"{KEPT}\n".encode())
    wait_until(server, KEPT, True)
