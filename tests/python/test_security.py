"""TLS, mTLS and bearer tokens end to end: the real server with throwaway certificates, the
Python client, HTTPS (with the /v2 REST API), health open or closed, token revocation by reload, and the torch drop-in
configured through the environment."""
import json
import os
import signal
import ssl
import time
import urllib.error

import grpc
import numpy as np
import pytest

import attnserve
from attnserve import connections, reference, security
from security_pki import SecureServerProcess, https_context, make_pki, run_secure_server
from server_process import MAIN_LIMITS

TOKENS = ["host-a-7f3c9e", "host-b-2d81aa", "to-be-revoked-55e0"]
GOOD, OTHER, REVOCABLE = TOKENS
SERVING = 1
CALL_TIMEOUT_S = 30
RELOAD_TIMEOUT_S = 10


def write_tokens(path, tokens):
    # Through a rename, as deployment tools do, so the server never reads a half-written file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# attnserve test tokens\n\n" + "".join(f"{t}\n" for t in tokens))
    os.replace(tmp, path)


def inputs(rng, tokens=12, heads=2, dim=16):
    q, k, v = (rng.standard_normal((tokens, heads, dim)).astype(np.float32) for _ in range(3))
    cu = np.array([0, 5, tokens], np.int32)
    return q, k, v, cu, cu


def assert_forward_correct(client, rng):
    q, k, v, cu_q, cu_k = inputs(rng)
    result = client.forward(q, k, v, cu_q, cu_k, causal=True)
    want, _ = reference.attention_forward(q, k, v, cu_q, cu_k, causal=True)
    assert np.linalg.norm(result.out - want) / np.linalg.norm(want) <= 1e-5


def code_of(call):
    with pytest.raises(attnserve.AttentionError) as error:
        call()
    return error.value.code, error.value.details


def health_check(target, credentials=None, metadata=None, server_name=None):
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    channel = (grpc.secure_channel(target, credentials, options) if credentials
               else grpc.insecure_channel(target))
    with channel:
        response = channel.unary_unary("/grpc.health.v1.Health/Check")(
            b"", timeout=5, metadata=metadata)
    assert response[:1] == b"\x08", response
    return response[1]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens"
    write_tokens(path, TOKENS)
    return path


@pytest.fixture(scope="module")
def tls_server(pki, tokens_file):
    """TLS without client certificates, bearer tokens, health and metrics open."""
    flags = {**MAIN_LIMITS, "tls_cert_file": pki.server_cert, "tls_key_file": pki.server_key,
             "auth_tokens_file": tokens_file}
    yield from run_secure_server(flags, https_context(pki.ca), GOOD)


@pytest.fixture(scope="module")
def mtls_server(pki, tokens_file):
    flags = {**MAIN_LIMITS, "tls_cert_file": pki.server_cert, "tls_key_file": pki.server_key,
             "tls_client_ca_file": pki.ca, "auth_tokens_file": tokens_file}
    yield from run_secure_server(flags, https_context(pki.ca, pki.client_cert, pki.client_key),
                                 GOOD)


def tls_client(server, pki, **kwargs):
    kwargs = {"tls_ca_file": pki.ca, "token": GOOD, **kwargs}
    return attnserve.Client(server.target, CALL_TIMEOUT_S, retries=0, **kwargs)


# --- bearer tokens over TLS ---------------------------------------------------------------

def test_the_right_token_works(tls_server, pki, rng):
    with tls_client(tls_server, pki) as client:
        assert_forward_correct(client, rng)
        assert client.server_info().version


@pytest.mark.parametrize("token", [None, "not-a-token", GOOD + "x"])
def test_missing_or_wrong_token_is_unauthenticated(tls_server, pki, rng, token):
    before = {reason: tls_server.metric("attnserve_auth_failures_total", f'reason="{reason}"')
              for reason in ("missing", "invalid")}
    with tls_client(tls_server, pki, token=token) as client:
        for call in (lambda: client.forward(*inputs(rng)),
                     lambda: client.backward(*inputs(rng)[:3], *inputs(rng)[:2],
                                             np.zeros((2, 12), np.float32), *inputs(rng)[3:]),
                     client.server_info):
            code, details = code_of(call)
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in details or "not accepted" in details, details
            if token:
                assert token not in details  # never echoed back
    reason = "invalid" if token else "missing"
    after = tls_server.metric("attnserve_auth_failures_total", f'reason="{reason}"')
    assert after == before[reason] + 3


def test_a_malformed_authorization_header_is_unauthenticated(tls_server, pki):
    credentials = grpc.ssl_channel_credentials(open(pki.ca, "rb").read())
    with grpc.secure_channel(tls_server.target, credentials) as channel:
        info = channel.unary_unary("/attnserve.v1.AttentionService/GetServerInfo")
        with pytest.raises(grpc.RpcError) as error:
            info(b"", timeout=5, metadata=[("authorization", f"Basic {GOOD}")])
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_revoked_token_stops_working_after_the_reload(tls_server, pki, tokens_file, rng):
    with tls_client(tls_server, pki, token=REVOCABLE) as revoked, \
            tls_client(tls_server, pki) as kept:
        assert_forward_correct(revoked, rng)
        write_tokens(tokens_file, [GOOD, OTHER])
        try:
            deadline = time.monotonic() + RELOAD_TIMEOUT_S
            while True:
                try:
                    revoked.server_info()
                except attnserve.AttentionError as error:
                    assert error.code == grpc.StatusCode.UNAUTHENTICATED
                    break
                assert time.monotonic() < deadline, "the revoked token still works"
                time.sleep(0.1)
            assert_forward_correct(kept, rng)
        finally:
            write_tokens(tokens_file, TOKENS)
    # And it comes back when re-added (the reload works both ways).
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    with tls_client(tls_server, pki, token=REVOCABLE) as restored:
        while True:
            try:
                restored.server_info()
                break
            except attnserve.AttentionError:
                assert time.monotonic() < deadline, "the re-added token never worked"
                time.sleep(0.1)


def test_sighup_reloads_the_tokens_file(tls_server):
    reloads = tls_server.log().count("reloaded")
    tls_server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while tls_server.log().count("reloaded") == reloads:
        assert time.monotonic() < deadline, tls_server.log()
        time.sleep(0.05)
    assert tls_server.process.poll() is None
    assert GOOD not in tls_server.log()  # tokens are never logged


# --- TLS handshakes -----------------------------------------------------------------------

def test_a_client_trusting_another_ca_fails_the_handshake(tls_server, pki):
    with tls_client(tls_server, pki, tls_ca_file=pki.other_ca) as client:
        code, _ = code_of(client.server_info)
    assert code == grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_client_cannot_talk_to_a_tls_server(tls_server):
    with attnserve.Client(tls_server.target, 5, retries=0, token=GOOD) as client:
        code, _ = code_of(client.server_info)
    assert code == grpc.StatusCode.UNAVAILABLE


def test_server_name_override_must_match_the_certificate(tls_server, pki):
    with tls_client(tls_server, pki, server_name="attnserve.test") as client:
        assert client.server_info().version
    with tls_client(tls_server, pki, server_name="elsewhere.test") as client:
        code, _ = code_of(client.server_info)
    assert code == grpc.StatusCode.UNAVAILABLE


def test_https_metrics_open_and_info_needs_the_token(tls_server, pki):
    assert tls_server.request("/metrics", token="")[0] == 200
    assert tls_server.request("/healthz", token="")[0] == 200
    assert tls_server.request("/readyz", token="")[0] == 200
    status, body = tls_server.request("/v1/info", token="")
    assert status == 401 and b"Bearer" in body
    assert tls_server.request("/v1/info", token="wrong")[0] == 401
    status, body = tls_server.request("/v1/info")
    assert status == 200 and b'"version"' in body
    with pytest.raises(OSError):  # urllib wraps the certificate failure in URLError
        tls_server.request("/metrics", context=https_context(pki.other_ca))


def test_https_inference_protocol_rest_needs_the_token(tls_server, rng):
    """/v2 is served over HTTPS with the same tokens; its probes stay open like /healthz."""
    q, k, v, cu_q, cu_k = inputs(rng)
    body = json.dumps({"inputs": [
        {"name": name, "shape": list(array.shape),
         "datatype": "INT32" if array.dtype == np.int32 else "FP32", "data": array.tolist()}
        for name, array in [("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_q),
                            ("cu_seqlens_k", cu_k)]]}).encode()
    infer = "/v2/models/attention_forward/infer"
    assert tls_server.request("/v2/health/ready", token="")[0] == 200
    status, answer = tls_server.request(infer, token="", body=body)
    assert status == 401 and b"Bearer" in answer
    assert tls_server.request(infer, token="wrong", body=body)[0] == 401
    status, answer = tls_server.request(infer, body=body)
    assert status == 200, answer
    out = {o["name"]: o for o in json.loads(answer)["outputs"]}["out"]
    want, _ = reference.attention_forward(q, k, v, cu_q, cu_k)
    got = np.array(out["data"], np.float32).reshape(out["shape"])
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-5


def test_grpc_health_is_open_without_a_token(tls_server, pki):
    credentials = grpc.ssl_channel_credentials(open(pki.ca, "rb").read())
    assert health_check(tls_server.target, credentials) == SERVING


# --- mTLS -----------------------------------------------------------------------------------

def test_mtls_with_the_client_certificate_works(mtls_server, pki, rng):
    with tls_client(mtls_server, pki, tls_cert_file=pki.client_cert,
                    tls_key_file=pki.client_key) as client:
        assert_forward_correct(client, rng)


@pytest.mark.parametrize("certificate", ["none", "other_ca"])
def test_mtls_refuses_clients_without_a_certificate_from_its_ca(mtls_server, pki, certificate):
    kwargs = {} if certificate == "none" else {"tls_cert_file": pki.other_client_cert,
                                               "tls_key_file": pki.other_client_key}
    with tls_client(mtls_server, pki, **kwargs) as client:
        code, _ = code_of(client.server_info)
    assert code == grpc.StatusCode.UNAVAILABLE


def test_mtls_over_https(mtls_server, pki):
    assert mtls_server.request("/v1/info")[0] == 200
    with pytest.raises(OSError):
        mtls_server.request("/metrics", context=https_context(pki.ca))
    with pytest.raises(OSError):
        mtls_server.request("/metrics", context=https_context(pki.ca, pki.other_client_cert,
                                                              pki.other_client_key))


def test_mtls_still_needs_the_token(mtls_server, pki):
    with tls_client(mtls_server, pki, token=None, tls_cert_file=pki.client_cert,
                    tls_key_file=pki.client_key) as client:
        code, _ = code_of(client.server_info)
    assert code == grpc.StatusCode.UNAUTHENTICATED


# --- health and metrics closed --------------------------------------------------------------

def test_closed_health_and_metrics_need_the_token(tokens_file):
    flags = {**MAIN_LIMITS, "auth_tokens_file": tokens_file,
             "auth_open_health_and_metrics": "false"}
    for server in run_secure_server(flags, token=GOOD):
        for path in ("/healthz", "/readyz", "/metrics", "/v1/info"):
            assert server.request(path, token="")[0] == 401, path
            assert server.request(path)[0] == 200, path
        with pytest.raises(grpc.RpcError) as error:
            health_check(server.target)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        metadata = [("authorization", f"Bearer {GOOD}")]
        assert health_check(server.target, metadata=metadata) == SERVING
        with grpc.insecure_channel(server.target) as channel:
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
            with pytest.raises(grpc.RpcError) as error:
                next(watch(b"", timeout=5))
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert next(watch(b"", timeout=5, metadata=metadata)) == b"\x08\x01"
        # Plain HTTP and gRPC with tokens also work (e.g. behind a TLS-terminating proxy).
        with attnserve.Client(server.target, CALL_TIMEOUT_S, token=GOOD) as client:
            assert client.server_info().version


def test_health_watch_streams_the_status_until_shutdown(tls_server, pki):
    credentials = grpc.ssl_channel_credentials(open(pki.ca, "rb").read())
    with grpc.secure_channel(tls_server.target, credentials) as channel:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=5)
        assert next(watch) == b"\x08\x01"
        watch.cancel()
    # A fresh server: SIGTERM turns a watched status NOT_SERVING, and the open stream does not
    # keep the server from exiting.
    server = SecureServerProcess(MAIN_LIMITS).start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=20)
            assert next(watch) == b"\x08\x01"
            server.terminate()
            assert next(watch) == b"\x08\x02"
            assert server.wait() == 0, server.log()
    finally:
        server.kill()


# --- startup checks -----------------------------------------------------------------------

@pytest.mark.parametrize("case", ["missing_cert", "key_of_another_cert", "cert_not_pem",
                                  "key_without_cert", "missing_tokens_file", "empty_tokens_file",
                                  "missing_client_ca"])
def test_bad_security_files_fail_at_startup_with_a_clear_message(case, pki, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("# no tokens yet\n")
    tls = {"tls_cert_file": pki.server_cert, "tls_key_file": pki.server_key}
    flags, expected = {
        "missing_cert": ({**tls, "tls_cert_file": tmp_path / "nope.crt"}, "nope.crt"),
        "key_of_another_cert": ({**tls, "tls_key_file": pki.client_key},
                                "does not hold the private key"),
        "cert_not_pem": ({**tls, "tls_cert_file": empty}, "no valid PEM certificate"),
        "key_without_cert": ({"tls_key_file": pki.server_key}, "go together"),
        "missing_tokens_file": ({"auth_tokens_file": tmp_path / "nope.tokens"}, "nope.tokens"),
        "empty_tokens_file": ({"auth_tokens_file": empty}, "holds no token"),
        "missing_client_ca": ({**tls, "tls_client_ca_file": tmp_path / "nope-ca.crt"},
                              "nope-ca.crt"),
    }[case]
    server = SecureServerProcess(flags)
    with pytest.raises(RuntimeError, match="exited") as error:
        server.start()
    assert expected in str(error.value)


# --- the torch drop-in and cached clients, configured by the environment ----------------------

@pytest.fixture
def clean_env(monkeypatch):
    for name in (connections.TARGET_ENV, security.TLS_ENV, security.TLS_CA_FILE_ENV,
                 security.TLS_CERT_FILE_ENV, security.TLS_KEY_FILE_ENV,
                 security.TLS_SERVER_NAME_ENV, security.TOKEN_ENV, security.TOKEN_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    attnserve.set_default_client(None)
    yield monkeypatch
    attnserve.set_default_client(None)


def test_cached_clients_are_keyed_by_credentials(tls_server, pki, clean_env, tmp_path):
    clean_env.setenv(security.TLS_CA_FILE_ENV, pki.ca)
    clean_env.setenv(security.TOKEN_ENV, GOOD)
    first = attnserve.client_for(tls_server.target)
    assert attnserve.client_for(tls_server.target) is first
    assert first.server_info().version
    clean_env.setenv(security.TOKEN_ENV, OTHER)
    second = attnserve.client_for(tls_server.target)
    assert second is not first and second.server_info().version
    # A token file (the server's format: comments skipped) when $ATTNSERVE_TOKEN is unset.
    clean_env.delenv(security.TOKEN_ENV)
    token_file = tmp_path / "token"
    token_file.write_text(f"# mine\n{GOOD}\n")
    clean_env.setenv(security.TOKEN_FILE_ENV, str(token_file))
    assert attnserve.client_for(tls_server.target).security == first.security


def test_flash_attn_drop_in_through_the_environment(tls_server, pki, clean_env, tmp_path):
    torch = pytest.importorskip("torch")
    token_file = tmp_path / "token"
    token_file.write_text(GOOD + "\n")
    clean_env.setenv(connections.TARGET_ENV, tls_server.target)
    clean_env.setenv(security.TLS_CA_FILE_ENV, pki.ca)
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(12, 2, 16, generator=generator, requires_grad=True)
               for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    with pytest.raises(attnserve.AttentionError) as error:
        attnserve.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True)
    assert error.value.code == grpc.StatusCode.UNAUTHENTICATED
    clean_env.setenv(security.TOKEN_FILE_ENV, str(token_file))
    out = attnserve.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True)
    out.sum().backward()
    want, _ = reference.attention_forward(*(t.detach().numpy() for t in (q, k, v)),
                                          cu.numpy(), cu.numpy(), causal=True)
    assert np.linalg.norm(out.detach().numpy() - want) / np.linalg.norm(want) <= 1e-5
    assert q.grad is not None and torch.isfinite(q.grad).all()
