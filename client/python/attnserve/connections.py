"""Which server a call goes to when the caller names none, and one cached Client per target.

FlashAttention's signature has no place for a server, so flash_attn_varlen_func finds it here:
its `client=` keyword, else the default set with set_default_client, else $ATTNSERVE_TARGET.
Clients made here take TLS and token settings from the environment (attnserve.security:
$ATTNSERVE_TLS_CA_FILE, $ATTNSERVE_TOKEN, ...). They are cached per target and settings and never
closed, so every call to a target with the same credentials shares one channel (and its
connections) for the life of the process, and changed credentials (a rotated token) get a new
one.
"""
import os
import threading
from typing import Dict, Optional, Tuple, Union

from .client import Client
from .security import Security, security_from_env

TARGET_ENV = "ATTNSERVE_TARGET"
# Seconds; a deadline for every call of the clients made here, unless $ATTNSERVE_TIMEOUT says
# otherwise ("none" or "0": no deadline). Generous: a CPU-backed server is slow on large inputs.
TIMEOUT_ENV = "ATTNSERVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0

_lock = threading.Lock()
_clients: Dict[Tuple[str, Security], Client] = {}
_default: Optional[Client] = None


def _timeout_from_env() -> Optional[float]:
    value = os.environ.get(TIMEOUT_ENV, "").strip().lower()
    if not value:
        return DEFAULT_TIMEOUT_S
    if value == "none":
        return None
    return float(value) or None


def client_for(target: str) -> Client:
    """The cached Client for `target` with the environment's security settings, made on first
    use."""
    security = security_from_env()
    with _lock:
        client = _clients.get((target, security))
        if client is None:
            client = _clients[(target, security)] = Client(
                target, timeout=_timeout_from_env(), security=security)
        return client


def set_default_client(client: Union[Client, str, None]) -> None:
    """Sends calls that name no client to `client` (a Client or a target; None: back to
    $ATTNSERVE_TARGET). A Client passed here stays owned by the caller."""
    global _default
    if isinstance(client, str):
        client = client_for(client)
    with _lock:
        _default = client


def default_client() -> Client:
    """The client set with set_default_client, else the cached one for $ATTNSERVE_TARGET."""
    with _lock:
        client = _default
    if client is not None:
        return client
    target = os.environ.get(TARGET_ENV)
    if not target:
        raise RuntimeError(f"no attnserve server: set {TARGET_ENV}=host:port, call "
                           "attnserve.set_default_client(...), or pass client=")
    return client_for(target)


def resolve(client: Union[Client, str, None]) -> Client:
    """A call's `client=` argument (a Client, a target or None) as a Client."""
    if client is None:
        return default_client()
    if isinstance(client, str):
        return client_for(client)
    return client
