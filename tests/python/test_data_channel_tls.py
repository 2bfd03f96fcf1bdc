"""TLS on the data channel, end to end: the real server with throwaway certificates
(security_pki.py) and the Python client. Answers over TLS equal gRPC's; with mTLS a client
without a certificate of the server's CA is refused at the handshake while others are served; a
plaintext HELLO to a TLS data port is closed and counted; tokens are still required."""
import socket
import ssl
import time

import grpc
import numpy as np
import pytest

import attnserve
from attnserve import frames
from attnserve._proto.attnserve.v1 import data_channel_pb2 as dc_pb2
from attnserve.data_channel import DataChannel, Tls
from security_pki import https_context, make_pki, run_secure_server
from server_process import MAIN_LIMITS

TOKEN = "data-tls-token-31d9"
SMALL_CHUNK = 64 << 10  # several chunks per tensor, spread over the connections
PROTOCOL_ERRORS = "attnserve_data_protocol_errors_total"
HANDSHAKE = 'reason="tls_handshake"'


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def tls_server(pki, tokens_file):
    flags = {**MAIN_LIMITS, "tls_cert_file": pki.server_cert, "tls_key_file": pki.server_key,
             "auth_tokens_file": tokens_file}
    yield from run_secure_server(flags, https_context(pki.ca), TOKEN)


@pytest.fixture(scope="module")
def mtls_server(pki, tokens_file):
    flags = {**MAIN_LIMITS, "tls_cert_file": pki.server_cert, "tls_key_file": pki.server_key,
             "tls_client_ca_file": pki.ca, "auth_tokens_file": tokens_file}
    yield from run_secure_server(flags, https_context(pki.ca, pki.client_cert, pki.client_key),
                                 TOKEN)


def _client(server, pki, **kwargs):
    kwargs = {"tls_ca_file": pki.ca, "token": TOKEN, **kwargs}
    return attnserve.Client(server.target, 30, retries=0, chunk_bytes=SMALL_CHUNK,
                            data_connections=3, **kwargs)


def _inputs(rng, tokens=(300, 213, 500), heads=4, heads_k=2, dim=64):
    total = sum(tokens)
    q = rng.standard_normal((total, heads, dim)).astype(np.float32)
    k, v = (rng.standard_normal((total, heads_k, dim)).astype(np.float32) for _ in range(2))
    dout = rng.standard_normal((total, heads, dim)).astype(np.float32)
    cu = np.array([0, *np.cumsum(tokens)], np.int32)
    return q, k, v, dout, cu


def _channel(server, pki, *, cert=None, key=None, ca=None, token=TOKEN,
             server_name="localhost"):
    context = ssl.create_default_context(cafile=ca or pki.ca)
    if cert:
        context.load_cert_chain(cert, key)
    return DataChannel("127.0.0.1", server.data_port, token=token, connections=1,
                       tls=Tls(context, server_name))


def _forward_over(channel, rng):
    """A forward straight over `channel` (no gRPC); its output."""
    q, k, v, _, cu = _inputs(rng, tokens=(20,))
    message = attnserve.attention_pb2.ForwardRequest(cu_seqlens_q=cu.tolist(),
                                                     cu_seqlens_k=cu.tolist())
    for name, array in (("q", q), ("k", k), ("v", v)):
        tensor = getattr(message, name)
        tensor.dtype = attnserve.attention_pb2.DTYPE_FLOAT32
        tensor.shape.extend(array.shape)
    out = np.empty_like(q)
    lse = np.empty((q.shape[1], q.shape[0]), np.float32)
    channel.call("forward", message, [q, k, v], [out, lse], timeout=30)
    return out


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("server_kind", ["tls", "mtls"])
def test_answers_over_tls_equal_grpc_s(server_kind, tls_server, mtls_server, pki, rng):
    server = tls_server if server_kind == "tls" else mtls_server
    cert = {"tls_cert_file": pki.client_cert, "tls_key_file": pki.client_key} \
        if server_kind == "mtls" else {}
    mode = "mTLS" if server_kind == "mtls" else "TLS"
    assert f":{server.data_port} ({mode})" in server.log(), server.log()
    q, k, v, dout, cu = _inputs(rng)
    received = server.metric("attnserve_data_received_bytes_total")
    with _client(server, pki, **cert) as fast, \
            _client(server, pki, transport="grpc", **cert) as slow:
        info = fast.server_info()
        assert info.data_channel.tls and info.data_channel.port == server.data_port
        assert fast.active_transport() == "data_channel"
        want = slow.forward(q, k, v, cu, cu, causal=True)
        got = fast.forward(q, k, v, cu, cu, causal=True)
        _same(got.out, want.out)
        _same(got.lse, want.lse)
        grads = fast.backward(dout, q, k, v, got.out, got.lse, cu, cu, causal=True)
        want_grads = slow.backward(dout, q, k, v, want.out, want.lse, cu, cu, causal=True)
        for name in ("dq", "dk", "dv"):
            _same(getattr(grads, name), getattr(want_grads, name))
    moved = server.metric("attnserve_data_received_bytes_total") - received
    assert moved >= q.nbytes + k.nbytes + v.nbytes  # the tensors did take the data channel


@pytest.mark.parametrize("certificate", ["none", "other_ca"])
def test_mtls_refuses_a_client_without_a_certificate_of_its_ca(certificate, mtls_server, pki,
                                                               rng):
    before = mtls_server.metric(PROTOCOL_ERRORS, HANDSHAKE)
    cert = {"none": {}, "other_ca": {"cert": pki.other_client_cert,
                                     "key": pki.other_client_key}}[certificate]
    refused = _channel(mtls_server, pki, **cert)
    with pytest.raises(attnserve.AttentionError) as error:
        _forward_over(refused, rng)
    refused.close()
    assert error.value.code == grpc.StatusCode.UNAVAILABLE
    # TLS 1.3: the server's alert ("certificate required", "unknown ca") ends the first read.
    assert "alert" in error.value.details, error.value.details
    mtls_server.wait_for_metric(PROTOCOL_ERRORS, before + 1, HANDSHAKE)
    # The server keeps serving clients that have one.
    good = _channel(mtls_server, pki, cert=pki.client_cert, key=pki.client_key)
    try:
        assert _forward_over(good, rng).shape == (20, 4, 64)
    finally:
        good.close()
    assert "TLS handshake failed" in mtls_server.log()


def test_the_server_certificate_is_checked_for_the_name(tls_server, pki, rng):
    channel = _channel(tls_server, pki, server_name="elsewhere.test")
    with pytest.raises(attnserve.AttentionError) as error:
        _forward_over(channel, rng)
    channel.close()
    assert error.value.code == grpc.StatusCode.UNAVAILABLE
    assert "certificate verify failed" in error.value.details, error.value.details


def test_a_plaintext_hello_to_a_tls_data_port_is_closed_and_counted(tls_server, pki, rng):
    before = tls_server.metric(PROTOCOL_ERRORS, HANDSHAKE)
    hello = dc_pb2.DataHello(protocol_version=frames.PROTOCOL_VERSION, session_id=bytes(16),
                             token=TOKEN)
    with socket.create_connection(("127.0.0.1", tls_server.data_port), timeout=10) as sock:
        sock.sendall(frames.message_frame(frames.HELLO, hello))
        answer = b""
        start = time.monotonic()
        try:
            while chunk := sock.recv(4096):  # ends when the server closes
                answer += chunk
        except ConnectionResetError:
            pass  # closed with the rest of the HELLO unread
        assert time.monotonic() - start < 8
    assert not answer.startswith(b"ADP1")  # at most a TLS alert, never a frame
    tls_server.wait_for_metric(PROTOCOL_ERRORS, before + 1, HANDSHAKE)
    assert tls_server.process.poll() is None
    with _client(tls_server, pki) as client:
        assert client.active_transport() == "data_channel"
        q, k, v, _, cu = _inputs(rng, tokens=(33,))
        assert client.forward(q, k, v, cu, cu).out.shape == q.shape


@pytest.mark.parametrize("token", ["", "not-" + TOKEN])
def test_tokens_are_still_required_over_tls(token, tls_server, pki, rng):
    channel = _channel(tls_server, pki, token=token)
    with pytest.raises(attnserve.AttentionError) as error:
        _forward_over(channel, rng)
    channel.close()
    assert error.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_a_tls_client_with_its_own_credentials_stays_on_grpc(tls_server, pki):
    credentials = grpc.ssl_channel_credentials(open(pki.ca, "rb").read())
    with attnserve.Client(tls_server.target, 30, retries=0, token=TOKEN,
                          credentials=credentials) as client:
        assert client.active_transport() == "grpc"
