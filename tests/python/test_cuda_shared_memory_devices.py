"""Which device_id a co-located client registers its CUDA buffer under: the server's ordinal of
the same GPU, found by UUID in GetServerInfo (processes with different CUDA_VISIBLE_DEVICES
number GPUs differently), and the client's own ordinal where UUIDs are unknown. No GPU needed:
torch's device properties and the server's answer are stand-ins."""
import types

import grpc
import pytest

torch = pytest.importorskip("torch")
from attnserve import cuda_shared_memory  # noqa: E402
from attnserve._proto.attnserve.v1 import attention_pb2 as pb2  # noqa: E402
from attnserve.shared_memory_call import SharedMemoryUnavailable  # noqa: E402

A = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
B = "GPU-ffeeddcc-0000-1111-2222-333344445555"


class _Server:
    def __init__(self, devices):
        self.info = pb2.ServerInfo(devices=[pb2.DeviceInfo(name=n, uuid=u) for n, u in devices])
        self.calls = 0

    def GetServerInfo(self, request, **_):
        self.calls += 1
        return self.info


def _path(monkeypatch, server, uuids):
    """A CudaSharedMemoryPath whose server answers `server` and whose GPUs have `uuids`."""
    path = cuda_shared_memory.CudaSharedMemoryPath(grpc.insecure_channel("127.0.0.1:9"), ())
    path._attention = server
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(uuid=uuids[device.index]))
    return path


@pytest.mark.parametrize("torch_spelling", [lambda u: u, lambda u: u[4:], lambda u: u[4:].upper()],
                         ids=["nvidia-smi", "bare", "upper"])
def test_the_server_s_ordinal_of_the_same_gpu(monkeypatch, torch_spelling):
    # The client sees B as cuda:0 and A as cuda:1; the server the other way round.
    server = _Server([("cpu", ""), ("cuda:0", A), ("cuda:1", B)])
    path = _path(monkeypatch, server, {0: torch_spelling(B), 1: torch_spelling(A)})
    assert path._server_ordinal(torch.device("cuda:0")) == 1
    assert path._server_ordinal(torch.device("cuda:1")) == 0
    assert server.calls == 1  # asked once


def test_a_gpu_the_server_does_not_serve_is_refused_by_name(monkeypatch):
    path = _path(monkeypatch, _Server([("cuda:0", A)]), {0: B})
    with pytest.raises(SharedMemoryUnavailable, match="is not a GPU the server serves") as refused:
        path._server_ordinal(torch.device("cuda:0"))
    assert not refused.value.permanent


@pytest.mark.parametrize("server_uuid, client_uuid", [("", A), (A, ""), (A, "not a uuid")],
                         ids=["older-server", "no-torch-uuid", "unknown-spelling"])
def test_without_uuids_on_both_sides_the_ordinal_is_the_client_s(monkeypatch, server_uuid,
                                                                 client_uuid):
    path = _path(monkeypatch, _Server([("cuda:0", server_uuid), ("cuda:1", "")]),
                 {2: client_uuid})
    assert path._server_ordinal(torch.device("cuda:2")) == 2
