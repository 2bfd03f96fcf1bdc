"""Host names and ports out of gRPC targets and advertised addresses."""
import ipaddress
import socket
from typing import Optional, Tuple


def split_host_port(address: str) -> Optional[Tuple[str, int]]:
    """("host", port) of "host:port" or "[v6 address]:port"; None if it is neither."""
    if address.startswith("["):
        host, separator, port = address[1:].partition("]:")
    else:
        host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit():
        return None
    return host, int(port)


def target_host(target: str) -> Optional[str]:
    """The one host a gRPC target names ("host:port", "dns:///host:port", "ipv4:a:port"), or
    None when it names several addresses or none (unix sockets, other resolvers)."""
    for prefix in ("dns:///", "ipv4:", "ipv6:", "dns:"):
        if target.startswith(prefix):
            target = target[len(prefix):]
            break
    else:
        if ":/" in target or target.startswith("unix:"):
            return None
    if "," in target or "/" in target:
        return None
    parsed = split_host_port(target)
    if parsed is not None:
        return parsed[0]
    return target if target and ":" not in target else None  # a bare host name


def is_this_host(host: str) -> bool:
    """Whether `host` (a target's host) names this machine: a loopback address or "localhost",
    this machine's own name, or an address that name resolves to. Names are not resolved
    through DNS here, so a remote name never costs a lookup; what this says is only a hint:
    the server proves it by mapping the client's shared memory (a server in another container
    behind a forwarded port cannot, and the client then uses the network)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    own_name = socket.gethostname().lower()
    if host in (own_name, socket.getfqdn().lower()):
        return True
    try:
        _, aliases, addresses = socket.gethostbyname_ex(own_name)
    except OSError:
        return False
    return host in addresses or host in (alias.lower() for alias in aliases)
