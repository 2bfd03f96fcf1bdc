"""Triton's system shared memory extension through tritonclient: registration, status,
inputs read from and outputs written to regions (checked against the float64 reference), bad
region names, offsets and sizes, unregistering, and the extension off by default."""
import base64
import time
import uuid

import numpy as np
import pytest

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

from oip_helpers import (forward_through_region, make_problem, oip_server,  # noqa: E402,F401
                         region, triton)
from server_process import MAIN_LIMITS, run_server  # noqa: E402

NAMES = ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"]



def test_inputs_and_outputs_through_shared_memory(triton, region, rng):
    key, handle = region
    arrays = make_problem(rng, np.float16)
    triton.register_system_shared_memory("attn_in", key, 1 << 16)
    try:
        status = triton.get_system_shared_memory_status()
        assert [r.name for r in status.regions.values()] == ["attn_in"]
        result = forward_through_region(tritonclient_grpc, triton, "attn_in", handle, arrays)
        assert result.get_output("out").parameters["shared_memory_region"].string_param == \
            "attn_in"
    finally:
        triton.unregister_system_shared_memory("attn_in")
    assert len(triton.get_system_shared_memory_status().regions) == 0


def _shm_input(name, array, region, byte_size, offset=0):
    tensor = tritonclient_grpc.InferInput(name, list(array.shape), "FP16")
    tensor.set_shared_memory(region, byte_size, offset)
    return tensor


def test_bad_regions_are_refused(triton, region, rng):
    key, _ = region
    with pytest.raises(InferenceServerException, match="key: cannot open shared memory"):
        triton.register_system_shared_memory("nowhere", "/attnserve_no_such_region", 64)
    with pytest.raises(InferenceServerException, match="key: must be a POSIX"):
        triton.register_system_shared_memory("path", "/etc/passwd", 64)
    with pytest.raises(InferenceServerException, match="exceed the 65536 bytes"):
        triton.register_system_shared_memory("too_big", key, 1 << 17)
    with pytest.raises(InferenceServerException, match="exceed the 65536 bytes"):
        triton.register_system_shared_memory("too_far", key, 1 << 15, offset=(1 << 15) + 1)
    triton.register_system_shared_memory("small", key, 4096, offset=1024)
    try:
        with pytest.raises(InferenceServerException, match="already registered"):
            triton.register_system_shared_memory("small", key, 64)
        arrays = make_problem(rng, np.float16)
        q = arrays["q"]
        rest = [tritonclient_grpc.InferInput(n, list(arrays[n].shape), d)
                for n, d in [("k", "FP16"), ("v", "FP16"), ("cu_seqlens_q", "INT32"),
                             ("cu_seqlens_k", "INT32")]]
        for tensor, name in zip(rest, NAMES[1:]):
            tensor.set_data_from_numpy(arrays[name])
        cases = [
            (_shm_input("q", q, "unknown", q.nbytes),
             'inputs[q].parameters.shared_memory_region: no shared memory region "unknown"'),
            (_shm_input("q", q, "small", q.nbytes, offset=4000),
             "inputs[q].parameters.shared_memory_byte_size: shared_memory_offset 4000"),
            (_shm_input("q", q, "small", 8192),
             "inputs[q].parameters.shared_memory_byte_size"),
            # Inside the region, but not the byte count q's shape needs.
            (_shm_input("q", q, "small", q.nbytes - 2), "q"),
        ]
        for tensor, message in cases:
            with pytest.raises(InferenceServerException) as raised:
                triton.infer("attention_forward", [tensor] + rest)
            assert "INVALID_ARGUMENT" in raised.value.status(), raised.value
            assert message in raised.value.message(), raised.value.message()
        with pytest.raises(InferenceServerException, match="not registered|no shared memory"):
            triton.unregister_system_shared_memory("unknown")
    finally:
        triton.unregister_system_shared_memory()
    assert len(triton.get_system_shared_memory_status().regions) == 0


def test_shared_memory_is_off_by_default(server, region):
    key, _ = region
    with tritonclient_grpc.InferenceServerClient(server.target) as client:
        with pytest.raises(InferenceServerException, match="--allow_shared_memory"):
            client.register_system_shared_memory("r", key, 64)


def test_idle_regions_are_unmapped():
    """A region nobody uses is dropped after --shared_memory_idle_seconds."""
    key = f"/attnserve_test_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key[1:], key, 4096)
    try:
        for server in run_server({"allow_shared_memory": "true",
                                  "shared_memory_idle_seconds": 1}):
            with tritonclient_grpc.InferenceServerClient(server.target) as client:
                client.register_system_shared_memory("idle", key, 4096)
                assert len(client.get_system_shared_memory_status().regions) == 1
                deadline = time.monotonic() + 10
                while client.get_system_shared_memory_status().regions and \
                        time.monotonic() < deadline:
                    time.sleep(0.1)
                assert len(client.get_system_shared_memory_status().regions) == 0
    finally:
        shm.destroy_shared_memory_region(handle)


def test_regions_belong_to_the_token_that_registered_them(tmp_path, region, rng):
    """Another client can neither see, use nor unregister a region, and may use its name."""
    key, handle = region
    tokens = tmp_path / "tokens"
    tokens.write_text("token-alice\ntoken-bob\n")
    arrays = make_problem(rng, np.float16)
    shm.set_shared_memory_region(handle, [arrays["q"]])
    for server in run_server(dict(MAIN_LIMITS, allow_shared_memory="true",
                                  auth_tokens_file=str(tokens))):
        alice = {"authorization": "Bearer token-alice"}
        bob = {"authorization": "Bearer token-bob"}
        with tritonclient_grpc.InferenceServerClient(server.target) as client:
            client.register_system_shared_memory("mine", key, 4096, headers=alice)
            assert list(client.get_system_shared_memory_status(headers=alice).regions) == ["mine"]
            assert len(client.get_system_shared_memory_status(headers=bob).regions) == 0
            with pytest.raises(InferenceServerException, match="no shared memory region"):
                client.unregister_system_shared_memory("mine", headers=bob)
            q = tritonclient_grpc.InferInput("q", list(arrays["q"].shape), "FP16")
            q.set_shared_memory("mine", arrays["q"].nbytes)
            rest = [tritonclient_grpc.InferInput(n, list(arrays[n].shape),
                                                 "INT32" if arrays[n].dtype == np.int32 else "FP16")
                    for n in NAMES[1:]]
            for tensor, name in zip(rest, NAMES[1:]):
                tensor.set_data_from_numpy(arrays[name])
            with pytest.raises(InferenceServerException, match="no shared memory region \"mine\""):
                client.infer("attention_forward", [q, *rest], headers=bob)
            # Bob's own "mine" is another region; Alice's stays registered.
            client.register_system_shared_memory("mine", key, 4096, headers=bob)
            client.unregister_system_shared_memory(headers=bob)
            assert list(client.get_system_shared_memory_status(headers=alice).regions) == ["mine"]
            client.unregister_system_shared_memory(headers=alice)


def test_cuda_regions_need_the_cuda_device_they_name(triton, region):
    # A server without that CUDA device (CI's runs on the CPU) refuses the handle by name; the
    # name stays free and nothing is listed. The GPU end-to-end script opens real handles.
    key, _ = region
    fake_handle = base64.b64encode(bytes(64))
    no_device = r"device_id: this server serves no CUDA device 0 \(it serves cpu\)"
    with pytest.raises(InferenceServerException, match=no_device) as refused:
        triton.register_cuda_shared_memory("gpu_in", fake_handle, 0, 4096)
    assert refused.value.status() == "StatusCode.FAILED_PRECONDITION"
    assert len(triton.get_cuda_shared_memory_status().regions) == 0
    with pytest.raises(InferenceServerException, match="no shared memory region \"gpu_in\""):
        triton.unregister_cuda_shared_memory("gpu_in")
    # One namespace for both kinds: a system region's name is not a CUDA region's.
    triton.register_system_shared_memory("both", key, 64)
    try:
        with pytest.raises(InferenceServerException, match="no shared memory region \"both\""):
            triton.unregister_cuda_shared_memory("both")
        assert len(triton.get_cuda_shared_memory_status().regions) == 0
    finally:
        triton.unregister_system_shared_memory("both")


def test_cuda_shared_memory_is_off_by_default(server):
    with tritonclient_grpc.InferenceServerClient(server.target) as client:
        with pytest.raises(InferenceServerException, match="--allow_shared_memory"):
            client.register_cuda_shared_memory("r", base64.b64encode(bytes(64)), 0, 64)
