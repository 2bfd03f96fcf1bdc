"""Throwaway certificates and a TLS-aware ServerProcess for the security end-to-end tests.

The certificates are made with the openssl command line (scripts/setup.sh installs it) into a
temporary directory: a CA, a server certificate for localhost / 127.0.0.1 and a client
certificate signed by it, and a second, unrelated CA with its own client certificate.
"""
import pathlib
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Dict, Optional

from server_process import ServerProcess, require_binary


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _make_ca(directory: pathlib.Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN=attnserve test {name}",
             "-keyout", str(directory / f"{name}.key"), "-out", str(directory / f"{name}.crt"))


def _make_leaf(directory: pathlib.Path, name: str, ca: str, extensions: str) -> None:
    key, csr = directory / f"{name}.key", directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
             "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-days", "2", "-CA", str(directory / f"{ca}.crt"),
             "-CAkey", str(directory / f"{ca}.key"), "-CAcreateserial",
             "-extfile", str(ext), "-out", str(directory / f"{name}.crt"))


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str            # unrelated to everything above
    other_client_cert: str   # signed by other_ca
    other_client_key: str


def make_pki(directory: pathlib.Path) -> Pki:
    _make_ca(directory, "ca")
    _make_ca(directory, "other_ca")
    _make_leaf(directory, "server", "ca",
               "subjectAltName=DNS:localhost,DNS:attnserve.test,IP:127.0.0.1\n"
               "extendedKeyUsage=serverAuth\n")
    _make_leaf(directory, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _make_leaf(directory, "other_client", "other_ca", "extendedKeyUsage=clientAuth\n")
    path = lambda name: str(directory / name)  # noqa: E731
    return Pki(ca=path("ca.crt"), server_cert=path("server.crt"), server_key=path("server.key"),
               client_cert=path("client.crt"), client_key=path("client.key"),
               other_ca=path("other_ca.crt"), other_client_cert=path("other_client.crt"),
               other_client_key=path("other_client.key"))


def https_context(ca: str, cert: Optional[str] = None,
                  key: Optional[str] = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


class SecureServerProcess(ServerProcess):
    """A ServerProcess whose own HTTP checks (readiness, metrics) speak HTTPS when TLS is on and
    carry `token` when given, so it starts whatever the security flags."""

    def __init__(self, flags: Dict[str, object], context: Optional[ssl.SSLContext] = None,
                 token: Optional[str] = None):
        super().__init__(require_binary(), flags)
        self.context = context
        self.token = token
        if context is not None:
            self.http_url = f"https://127.0.0.1:{self.http_port}"

    def request(self, path: str, token: Optional[str] = None,
                context: Optional[ssl.SSLContext] = None, body: Optional[bytes] = None):
        """(status, body) of GET `path` (POST when `body` is given) with `token` (default: the
        server's) and `context` (default: the server's); raises OSError when no HTTP answer
        comes back."""
        token = self.token if token is None else token
        request = urllib.request.Request(self.http_url + path, data=body)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=5,
                                        context=context or self.context) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def http_status(self, path: str) -> Optional[int]:
        try:
            return self.request(path)[0]
        except OSError:
            return None

    def http_get(self, path: str) -> bytes:
        status, body = self.request(path)
        assert status == 200, (path, status, body)
        return body


def run_secure_server(flags, context=None, token=None):
    """Yields a started SecureServerProcess; at teardown it must exit 0 on SIGTERM."""
    server = SecureServerProcess(flags, context, token).start()
    try:
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"server exit code {code} after SIGTERM:\n{server.log()}"
