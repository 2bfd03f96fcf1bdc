"""grpc.health.v1 calls for the tests. The health messages are tiny, so they are written and read
as raw protobuf bytes rather than pulling in more generated code."""
import grpc

SERVING, NOT_SERVING = 1, 2


def _request(service: str) -> bytes:
    return (b"\x0a" + bytes([len(service)]) + service.encode()) if service else b""


def _status(response: bytes) -> int:
    assert response[:1] == b"\x08", response  # field 1 (status), varint
    return response[1]


def health_status(target: str, service: str = "") -> int:
    """HealthCheckResponse.status for `service` ("" = the whole server)."""
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        return _status(check(_request(service), timeout=5))


def watch_statuses(channel: grpc.Channel, service: str = "", timeout: float = 30):
    """The statuses a Watch stream on `channel` sends, as they come."""
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
    return (_status(response) for response in watch(_request(service), timeout=timeout))
