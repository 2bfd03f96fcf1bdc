"""CUDA shared memory on the GPU machine: a client process registers device memory by its IPC
handle and names it in ModelInfer requests; the server's kernels read the inputs where they lie
and write the outputs back into the client's memory. Results must equal the same server's
answers over plain gRPC bitwise (the same kernels; deterministic backward). Bad placements are
refused with the field named. Needs a server started with --allow_shared_memory
(ATTNSERVE_GPU_SHM_TARGET; scripts/gpu_e2e.sh starts one)."""
import os
import uuid

import grpc
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import attnserve  # noqa: E402
from cuda_region import CudaRegion  # noqa: E402

TARGET = os.environ.get("ATTNSERVE_GPU_SHM_TARGET")
pytestmark = pytest.mark.skipif(not TARGET or not torch.cuda.is_available(),
                                reason="needs a GPU and a server with --allow_shared_memory")

SEQLENS = [300, 512, 77]
HEADS, DIM = 8, 128


@pytest.fixture
def region():
    r = CudaRegion(TARGET, f"gpu-{uuid.uuid4().hex[:8]}", 64 << 20)
    r.register()
    yield r
    r.close()


@pytest.fixture(scope="module")
def grpc_client():
    with attnserve.Client(TARGET, timeout=120, transport="grpc") as client:
        yield client


def _problem(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(SEQLENS)
    make = lambda: torch.randn(total, HEADS, DIM, device="cuda", generator=g,  # noqa: E731
                               dtype=torch.bfloat16)
    cu = [0]
    for n in SEQLENS:
        cu.append(cu[-1] + n)
    return make(), make(), make(), make(), cu


def _numpy(t):
    from ml_dtypes import bfloat16
    return t.cpu().view(torch.int16).numpy().view(bfloat16) if t.dtype == torch.bfloat16 \
        else t.cpu().numpy()


def _same_bits(got: torch.Tensor, want: np.ndarray):
    np.testing.assert_array_equal(_numpy(got).view(np.uint8), np.asarray(want).view(np.uint8))


def test_forward_and_backward_read_and_write_the_clients_device_memory(region, grpc_client):
    q, k, v, dout, cu = _problem()
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        region.place(name, t).copy_(t)
    out = region.place("out", q)
    lse = region.place("lse", torch.empty(HEADS, q.shape[0], device="cuda"))
    offsets = {"cu_seqlens_q": cu, "cu_seqlens_k": cu}
    region.infer("attention_forward", ["q", "k", "v"], ["out", "lse"], offsets, {"causal": True})
    torch.cuda.synchronize()
    want = grpc_client.forward(_numpy(q), _numpy(k), _numpy(v), np.array(cu, np.int32),
                               np.array(cu, np.int32), causal=True)
    _same_bits(out, want.out)
    _same_bits(lse, want.lse)

    grads = [region.place(n, q) for n in ("dq", "dk", "dv")]
    region.infer("attention_backward", ["dout", "q", "k", "v", "out", "lse"],
                 ["dq", "dk", "dv"], offsets, {"causal": True, "deterministic": True})
    torch.cuda.synchronize()
    want_b = grpc_client.backward(_numpy(dout), _numpy(q), _numpy(k), _numpy(v), want.out,
                                  want.lse, np.array(cu, np.int32), np.array(cu, np.int32),
                                  causal=True, deterministic=True)
    for got, name in zip(grads, ("dq", "dk", "dv")):
        _same_bits(got, getattr(want_b, name))


def test_outputs_may_come_back_in_the_answer(region, grpc_client):
    q, k, v, _, cu = _problem(1)
    for name, t in (("q", q), ("k", k), ("v", v)):
        region.place(name, t).copy_(t)
    response = region.infer("attention_forward", ["q", "k", "v"], [],
                            {"cu_seqlens_q": cu, "cu_seqlens_k": cu})
    want = grpc_client.forward(_numpy(q), _numpy(k), _numpy(v), np.array(cu, np.int32),
                               np.array(cu, np.int32))
    names = [o.name for o in response.outputs]
    out = np.frombuffer(response.raw_output_contents[names.index("out")], np.uint8)
    np.testing.assert_array_equal(out, np.asarray(want.out).view(np.uint8).ravel())


def test_bad_placements_are_refused_with_the_field_named(region):
    q, k, v, _, cu = _problem(2)
    for name, t in (("q", q), ("k", k), ("v", v)):
        region.place(name, t).copy_(t)
    region.place("cu_seqlens_q", torch.tensor(cu, dtype=torch.int32, device="cuda"))
    with pytest.raises(grpc.RpcError) as offsets_on_device:
        region.infer("attention_forward", ["q", "k", "v", "cu_seqlens_q"], [],
                     {"cu_seqlens_k": cu})
    assert offsets_on_device.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cu_seqlens_q" in offsets_on_device.value.details()
    small = CudaRegion(TARGET, f"{region.name}-small", 2 << 20)
    try:
        with pytest.raises(grpc.RpcError) as too_large:
            small.register_as(small.name, small.base + (64 << 20))
        assert too_large.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "exceed" in too_large.value.details()
    finally:
        small.close()


def _cuda_requests(server_metrics_url):
    import urllib.request
    text = urllib.request.urlopen(server_metrics_url).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("attnserve_inference_protocol_requests_total")
               and 'shared_memory="cuda"' in line and 'code="OK"' in line)


def test_the_torch_drop_in_goes_through_cuda_shared_memory():
    metrics = os.environ.get("ATTNSERVE_GPU_SHM_HTTP")
    if not metrics:
        pytest.skip("needs ATTNSERVE_GPU_SHM_HTTP")
    q, k, v, dout, cu = _problem(3)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
    before = _cuda_requests(metrics + "/metrics")
    with attnserve.Client(TARGET, timeout=120) as client:
        out = attnserve.flash_attn_varlen_func(q, k, v, cu_t, cu_t, max(SEQLENS), max(SEQLENS),
                                               causal=True, client=client)
        out.backward(dout)
    assert _cuda_requests(metrics + "/metrics") - before == 2  # a forward and a backward
    # Against PyTorch's own attention, sequence by sequence (bf16 tolerance).
    for b in range(len(SEQLENS)):
        s, e = cu[b], cu[b + 1]
        qs, ks, vs = (t.detach()[s:e].transpose(0, 1).unsqueeze(0).requires_grad_()
                      for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        ref.backward(dout[s:e].transpose(0, 1).unsqueeze(0))
        for got, want in ((out[s:e], ref), (q.grad[s:e], qs.grad), (k.grad[s:e], ks.grad),
                          (v.grad[s:e], vs.grad)):
            want = want.squeeze(0).transpose(0, 1).float()
            err = ((got.float() - want).norm() / want.norm()).item()
            assert err < 2e-2, err


def test_a_region_registered_over_rest_serves_grpc_calls(grpc_client):
    """Triton's CUDA shared memory REST endpoints: register by the base64 IPC handle, status,
    unregister; one namespace with gRPC's."""
    import base64
    import json
    import urllib.request

    http = os.environ.get("ATTNSERVE_GPU_SHM_HTTP")
    if not http:
        pytest.skip("needs ATTNSERVE_GPU_SHM_HTTP")

    def rest(method, path, body=None):
        request = urllib.request.Request(http + path, method=method,
                                         data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
            return json.loads(text) if text else None

    region = CudaRegion(TARGET, f"rest-{uuid.uuid4().hex[:8]}", 64 << 20)
    try:
        rest("POST", f"/v2/cudasharedmemory/region/{region.name}/register",
             {"raw_handle": {"b64": base64.b64encode(region.handle).decode()},
              "device_id": region.device, "byte_size": region.base + region.buffer.numel()})
        status = rest("GET", f"/v2/cudasharedmemory/region/{region.name}/status")
        assert status == [{"name": region.name, "device_id": region.device,
                           "byte_size": region.base + region.buffer.numel()}]
        q, k, v, _, cu = _problem(seed=3)
        for name, t in (("q", q), ("k", k), ("v", v)):
            region.place(name, t).copy_(t)
        out = region.place("out", q)
        lse = region.place("lse", torch.empty(HEADS, q.shape[0], device="cuda"))
        offsets = {"cu_seqlens_q": cu, "cu_seqlens_k": cu}
        region.infer("attention_forward", ["q", "k", "v"], ["out", "lse"], offsets, {})
        torch.cuda.synchronize()
        want = grpc_client.forward(_numpy(q), _numpy(k), _numpy(v), np.array(cu, np.int32),
                                   np.array(cu, np.int32))
        _same_bits(out, want.out)
        _same_bits(lse, want.lse)
        rest("POST", f"/v2/cudasharedmemory/region/{region.name}/unregister")
        assert region.name not in [r["name"] for r in rest("GET", "/v2/cudasharedmemory/status")]
    finally:
        region.close()
