"""Triton's system shared memory extension over REST (/v2/systemsharedmemory) through
tritonclient's HTTP client: registration, status, inputs read from and outputs written to
regions (checked against the float64 reference), bad region names, offsets and sizes,
unregistering, regions owned by their token, and the extension off by default."""
import base64
import json

import numpy as np
import pytest

tritonclient_http = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from oip_helpers import (DATATYPES, FORWARD_INPUTS, forward_through_region,  # noqa: E402,F401
                         make_problem, oip_server, post, region, triton_http)
from server_process import MAIN_LIMITS, run_server  # noqa: E402


def test_inputs_and_outputs_through_shared_memory(triton_http, region, rng):
    key, handle = region
    arrays = make_problem(rng, np.float16)
    triton_http.register_system_shared_memory("attn_in", key, 1 << 16)
    try:
        status = triton_http.get_system_shared_memory_status()
        assert [(r["name"], r["key"], r["byte_size"]) for r in status] == \
            [("attn_in", key, 1 << 16)]
        assert [r["name"] for r in triton_http.get_system_shared_memory_status("attn_in")] == \
            ["attn_in"]
        result = forward_through_region(tritonclient_http, triton_http, "attn_in", handle,
                                        arrays)
        assert result.get_output("out")["parameters"]["shared_memory_region"] == "attn_in"
    finally:
        triton_http.unregister_system_shared_memory("attn_in")
    assert triton_http.get_system_shared_memory_status() == []


def refused(call, *args, **kwargs):
    with pytest.raises(InferenceServerException) as raised:
        call(*args, **kwargs)
    return raised.value


def test_bad_regions_are_refused(triton_http, oip_server, region, rng):
    key, _ = region
    register = triton_http.register_system_shared_memory
    error = refused(register, "nowhere", "/attnserve_no_such_region", 64)
    assert error.status() == "400" and "key: cannot open shared memory" in error.message()
    assert "key: must be a POSIX" in refused(register, "path", "/etc/passwd", 64).message()
    assert "exceed the 65536 bytes" in refused(register, "too_big", key, 1 << 17).message()
    assert "exceed the 65536 bytes" in refused(register, "too_far", key, 1 << 15,
                                               offset=(1 << 15) + 1).message()
    # Registration bodies that are not what the extension defines.
    for body, message in [(b"{", "not valid JSON"), (b"{}", "key: missing"),
                          (b'{"key": 3, "byte_size": 4}', "key: must be a string"),
                          (b'{"key": "/k", "byte_size": -4}', "byte_size: must be an integer"),
                          (b'{"key": "/k"}', "byte_size: missing")]:
        status, _, answer = post(oip_server, "/v2/systemsharedmemory/region/r/register", body)
        assert status == 400 and message in json.loads(answer)["error"], answer
    register("small", key, 4096, offset=1024)
    try:
        error = refused(register, "small", key, 64)
        assert error.status() == "409" and "already registered" in error.message()
        arrays = make_problem(rng, np.float16)
        q = arrays["q"]
        rest = [tritonclient_http.InferInput(n, list(arrays[n].shape), DATATYPES[arrays[n].dtype])
                for n in FORWARD_INPUTS[1:]]
        for tensor, name in zip(rest, FORWARD_INPUTS[1:]):
            tensor.set_data_from_numpy(arrays[name])

        def shm_q(region_name, byte_size, offset=0):
            tensor = tritonclient_http.InferInput("q", list(q.shape), "FP16")
            tensor.set_shared_memory(region_name, byte_size, offset)
            return tensor

        cases = [
            (shm_q("unknown", q.nbytes),
             'inputs[q].parameters.shared_memory_region: no shared memory region "unknown"'),
            (shm_q("small", q.nbytes, offset=4000),
             "inputs[q].parameters.shared_memory_byte_size: shared_memory_offset 4000"),
            (shm_q("small", 8192), "inputs[q].parameters.shared_memory_byte_size"),
            (shm_q("small", q.nbytes - 2), "q"),
        ]
        for tensor, message in cases:
            error = refused(triton_http.infer, "attention_forward", [tensor] + rest)
            assert error.status() == "400", error
            assert message in error.message(), error.message()
        error = refused(triton_http.get_system_shared_memory_status, "unknown")
        assert error.status() == "404"
        error = refused(triton_http.unregister_system_shared_memory, "unknown")
        assert error.status() == "404" and "no shared memory region" in error.message()
    finally:
        triton_http.unregister_system_shared_memory()
    assert triton_http.get_system_shared_memory_status() == []


def test_shared_memory_is_off_by_default(server, region):
    key, _ = region
    with tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.http_port}") as client:
        error = refused(client.register_system_shared_memory, "r", key, 64)
        assert error.status() == "400" and "--allow_shared_memory" in error.message()


def test_regions_belong_to_the_token_that_registered_them(tmp_path, region):
    key, _ = region
    tokens = tmp_path / "tokens"
    tokens.write_text("token-alice\ntoken-bob\n")
    for server in run_server(dict(MAIN_LIMITS, allow_shared_memory="true",
                                  auth_tokens_file=str(tokens))):
        alice = {"Authorization": "Bearer token-alice"}
        bob = {"Authorization": "Bearer token-bob"}
        with tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.http_port}") as client:
            assert refused(client.register_system_shared_memory, "mine", key, 4096).status() \
                == "401"
            client.register_system_shared_memory("mine", key, 4096, headers=alice)
            assert [r["name"] for r in client.get_system_shared_memory_status(headers=alice)] \
                == ["mine"]
            assert client.get_system_shared_memory_status(headers=bob) == []
            error = refused(client.unregister_system_shared_memory, "mine", headers=bob)
            assert error.status() == "404"
            client.unregister_system_shared_memory(headers=alice)
            assert client.get_system_shared_memory_status(headers=alice) == []


def test_cuda_regions_over_rest_need_the_cuda_device_they_name(triton_http, oip_server,
                                                               region):
    # As over gRPC: a server without that CUDA device (CI's runs on the CPU) refuses the handle
    # by name; the name stays free and nothing is listed. The GPU end-to-end script registers
    # real handles over both protocols.
    key, _ = region
    fake_handle = base64.b64encode(bytes(64)).decode()
    error = refused(triton_http.register_cuda_shared_memory, "gpu_in", fake_handle, 0, 4096)
    assert error.status() == "400"
    assert "device_id: this server serves no CUDA device 0 (it serves cpu)" in error.message()
    assert triton_http.get_cuda_shared_memory_status() == []
    error = refused(triton_http.unregister_cuda_shared_memory, "gpu_in")
    assert error.status() == "404" and 'no shared memory region "gpu_in"' in error.message()
    # One namespace for both kinds: a system region is neither listed nor unregistered as CUDA.
    triton_http.register_system_shared_memory("both", key, 64)
    try:
        assert refused(triton_http.unregister_cuda_shared_memory, "both").status() == "404"
        assert triton_http.get_cuda_shared_memory_status() == []
        assert [r["name"] for r in triton_http.get_system_shared_memory_status()] == ["both"]
    finally:
        triton_http.unregister_system_shared_memory("both")


@pytest.mark.parametrize("body, message", [
    ({"device_id": 0, "byte_size": 64}, "raw_handle: missing"),
    ({"raw_handle": "AAAA", "device_id": 0, "byte_size": 64}, "raw_handle: must be an object"),
    ({"raw_handle": {}, "device_id": 0, "byte_size": 64}, "raw_handle.b64: missing"),
    ({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 64},
     "raw_handle.b64: not base64"),
    ({"raw_handle": {"b64": "AAAA"}, "byte_size": 64}, "device_id: missing"),
    ({"raw_handle": {"b64": "AAAA"}, "device_id": -1, "byte_size": 64},
     "device_id: must be an integer"),
    ({"raw_handle": {"b64": "AAAA"}, "device_id": 1 << 40, "byte_size": 64},
     "device_id: not a CUDA ordinal"),
    ({"raw_handle": {"b64": "AAAA"}, "device_id": 0}, "byte_size: missing"),
])
def test_bad_cuda_registrations_name_the_field(oip_server, body, message):
    status, _, answer = post(oip_server, "/v2/cudasharedmemory/region/r/register",
                             json.dumps(body))
    assert status == 400 and message in json.loads(answer)["error"]
