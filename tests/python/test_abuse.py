"""Attacks on the gRPC port by clients without a token (issue 19): what each used to cost the
server, scaled down to what CI runs, must now be refused or bounded."""
import grpc
import pytest

from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from attnserve._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc

CHANNEL_OPTIONS = [("grpc.max_send_message_length", 1 << 30)]


def rss_bytes(server):
    with open(f"/proc/{server.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_compressed_message_is_refused_without_inflating_it(server):
    # 32 MiB of zeros gzip to about 32 KiB. gRPC 1.51 inflated such a message before the size
    # limit and before the handler (so before authentication): 261 KB became 256 MiB.
    zeros = pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=[8 << 20], data=bytes(32 << 20))
    before = rss_bytes(server)
    with grpc.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
        attention = pb2_grpc.AttentionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            attention.Forward(pb2.ForwardRequest(q=zeros), timeout=30,
                              compression=grpc.Compression.Gzip)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, refused.value.details()
        assert "gzip" in refused.value.details()
        # Uncompressed calls on the same channel still work.
        assert attention.GetServerInfo(pb2.GetServerInfoRequest(), timeout=30).version
    assert rss_bytes(server) - before < 16 << 20
