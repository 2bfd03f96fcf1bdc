"""TLS and bearer-token settings of a Client, from arguments or from the environment.

A server started with --tls_cert_file wants TLS (tls_ca_file: the CA that signed its
certificate; none: the system's roots); with --tls_client_ca_file also a client certificate
(tls_cert_file + tls_key_file); with --auth_tokens_file a bearer token on every call.
"""
import os
import pathlib
import ssl
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import grpc

TLS_ENV = "ATTNSERVE_TLS"  # "1": TLS with the system's roots, when no CA file is named
TLS_CA_FILE_ENV = "ATTNSERVE_TLS_CA_FILE"
TLS_CERT_FILE_ENV = "ATTNSERVE_TLS_CERT_FILE"
TLS_KEY_FILE_ENV = "ATTNSERVE_TLS_KEY_FILE"
TLS_SERVER_NAME_ENV = "ATTNSERVE_TLS_SERVER_NAME"
TOKEN_ENV = "ATTNSERVE_TOKEN"
TOKEN_FILE_ENV = "ATTNSERVE_TOKEN_FILE"


def _read(path: str, what: str) -> bytes:
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read the {what} {path}: {error.strerror}") from error


def read_token_file(path: str) -> str:
    """The token in `path`: its first line that is neither blank nor a '#' comment (the server's
    tokens-file format, so one file can serve both)."""
    for line in _read(path, "token file").decode().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    raise ValueError(f"the token file {path} holds no token")


@dataclass(frozen=True)
class Security:
    """How a Client authenticates. Hashable: the cached clients of connections.py are keyed by
    it, so clients with different credentials never share a channel."""
    tls: bool = False
    tls_ca_file: Optional[str] = None
    tls_cert_file: Optional[str] = None
    tls_key_file: Optional[str] = None
    server_name: Optional[str] = None
    token: Optional[str] = field(default=None, repr=False)  # never printed

    def __post_init__(self):
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together (mTLS)")

    @property
    def uses_tls(self) -> bool:
        return self.tls or bool(self.tls_ca_file or self.tls_cert_file)

    def channel_credentials(self) -> Optional[grpc.ChannelCredentials]:
        """SSL credentials, or None for a plaintext channel."""
        if not self.uses_tls:
            return None
        root = _read(self.tls_ca_file, "TLS CA file") if self.tls_ca_file else None
        key = _read(self.tls_key_file, "TLS key file") if self.tls_key_file else None
        chain = _read(self.tls_cert_file, "TLS certificate file") if self.tls_cert_file else None
        return grpc.ssl_channel_credentials(root_certificates=root, private_key=key,
                                            certificate_chain=chain)

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        """What the data channel's TLS connections check and present, as the gRPC channel's
        credentials do: the CA (else the system's roots), the client certificate, TLS 1.2 or
        newer; None without TLS."""
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.tls_cert_file:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context

    def channel_options(self) -> Sequence[Tuple[str, object]]:
        # The name the server's certificate must carry, when it differs from the target's host
        # (plaintext channels ignore it).
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []

    def call_metadata(self) -> Optional[Tuple[Tuple[str, str], ...]]:
        # Sent as plain metadata rather than gRPC call credentials, which gRPC refuses on
        # plaintext channels (a server behind a TLS-terminating proxy still wants the token).
        if not self.token:
            return None
        return (("authorization", f"Bearer {self.token}"),)


def security_from_env() -> Security:
    """The Security the environment asks for ($ATTNSERVE_TLS*, $ATTNSERVE_TOKEN, else the first
    token of $ATTNSERVE_TOKEN_FILE), read anew at each call so rotated tokens are picked up."""
    env = os.environ
    token = env.get(TOKEN_ENV) or None
    if token is None and env.get(TOKEN_FILE_ENV):
        token = read_token_file(env[TOKEN_FILE_ENV])
    return Security(tls=env.get(TLS_ENV, "").strip().lower() in ("1", "true", "yes"),
                    tls_ca_file=env.get(TLS_CA_FILE_ENV) or None,
                    tls_cert_file=env.get(TLS_CERT_FILE_ENV) or None,
                    tls_key_file=env.get(TLS_KEY_FILE_ENV) or None,
                    server_name=env.get(TLS_SERVER_NAME_ENV) or None,
                    token=token)
