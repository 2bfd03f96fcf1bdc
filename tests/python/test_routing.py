"""Routing flags on the CPU server: --kernel forces one family, --emulate_compute_capability
needs a GPU, and ServerInfo lists what each device's families serve."""
import contextlib
import subprocess

import grpc
import numpy as np
import pytest

import attnserve
from attnserve._proto.attnserve.v1 import attention_pb2 as pb2
from server_process import require_binary, run_server


@pytest.fixture
def forced(request):
    yield from run_server({"kernel": request.param})


def startup_error(*flags):
    result = subprocess.run([str(require_binary()), "--devices=cpu", *flags],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    return result.stderr


def test_unknown_kernel_family_fails_at_startup_naming_the_built_ones():
    stderr = startup_error("--kernel=warp-drive")
    assert "--kernel=warp-drive: not a kernel family of this build" in stderr
    assert "reference" in stderr


@pytest.mark.parametrize("spec,message", [("7.5", "the server has no GPU device"),
                                          ("75", "expected major.minor"),
                                          ("6.1", "below 7.0")])
def test_emulating_a_capability_needs_a_gpu_and_a_valid_value(spec, message):
    assert message in startup_error(f"--emulate_compute_capability={spec}")


@pytest.mark.parametrize("forced", ["reference"], indirect=True)
def test_forcing_the_reference_family_runs_everything_on_it(forced):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((10, 2, 24)).astype(np.float32)
    cu = np.array([0, 10], dtype=np.int32)
    with attnserve.Client(forced.target) as client:
        result = client.forward(q, q, q, cu, cu)
    assert (result.execution.device, result.execution.kernel) == ("cpu", "reference")


def test_a_forced_gpu_family_refuses_cpu_requests_with_the_reason():
    families = startup_error("--kernel=warp-drive").split("built: ")[1]
    gpu_family = next((f for f in ("fallback", "flash", "cublas") if f in families), None)
    if gpu_family is None:
        pytest.skip("no GPU kernel family in this build")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((10, 2, 64)).astype(np.float16)
    cu = np.array([0, 10], dtype=np.int32)
    with contextlib.contextmanager(run_server)({"kernel": gpu_family}) as server:
        with attnserve.Client(server.target) as client:
            with pytest.raises(attnserve.AttentionError) as error:
                client.forward(q, q, q, cu, cu)
    assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"no kernel family of [{gpu_family}] runs a forward of float16 with head_dim 64" in \
        error.value.details


@pytest.mark.parametrize("forced", [""], indirect=True)
def test_server_info_lists_each_devices_routes(forced):
    with attnserve.Client(forced.target) as client:
        device = client.server_info().devices[0]
    assert list(device.kernel_families) == ["reference"]
    assert device.native_compute_capability == ""
    assert device.shared_memory_per_block == 0
    assert [(r.family, r.direction) for r in device.routes] == [("reference", "forward"),
                                                                ("reference", "backward")]
    route = device.routes[0]
    assert list(route.dtypes) == [pb2.DTYPE_FLOAT16, pb2.DTYPE_BFLOAT16, pb2.DTYPE_FLOAT32]
    assert (route.min_head_dim, route.max_head_dim, route.head_dim_multiple) == (1, 0, 1)
    assert "exact CPU kernels" in route.reason


@pytest.mark.parametrize("forced", [""], indirect=True)
def test_execution_and_metrics_name_the_code_path_that_ran(forced):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((12, 2, 16)).astype(np.float32)
    cu = np.array([0, 5, 12], dtype=np.int32)
    with attnserve.Client(forced.target) as client:
        fwd = client.forward(q, q, q, cu, cu)
        bwd = client.backward(q, q, q, q, fwd.out, fwd.lse, cu, cu)
    assert fwd.execution.code_path == "reference/cpu"
    assert bwd.execution.code_path == "reference/cpu"
    assert forced.metric("attnserve_code_path_compute_duration_seconds_count",
                         'code_path="reference/cpu",device="cpu",rpc="Forward"') == 1
