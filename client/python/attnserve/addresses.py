"""Host names and ports out of gRPC targets and advertised addresses."""
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
