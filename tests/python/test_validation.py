"""Malformed and oversized requests are rejected with a code and a message naming the field,
and the server keeps serving. Raw protos, to send what the numpy API would not."""
import grpc
import numpy as np
import pytest
from ml_dtypes import bfloat16

import attnserve
from attnserve import attention_pb2 as pb2
from attnserve.tensors import to_tensor
from cases import Case, TOLERANCE, forward_errors, make_inputs

INVALID = {grpc.StatusCode.INVALID_ARGUMENT}
LIMIT = {grpc.StatusCode.RESOURCE_EXHAUSTED}

# Two sequences of 5 and 7 tokens, 2 heads of 16, float32: total_q = total_k = 12.
GOOD = Case("good", [5, 7], [5, 7], heads=2, heads_k=2, dim=16, options={"causal": True})


def _inputs(case=GOOD, dtype=np.float32):
    return make_inputs(case, dtype, np.random.default_rng())


def _forward_request(inputs):
    return attnserve.forward_request(inputs["q"], inputs["k"], inputs["v"],
                                     inputs["cu_seqlens_q"], inputs["cu_seqlens_k"])


def _backward_request(inputs):
    # Placeholder out and lse of the right shapes: these requests are about validation only.
    lse = np.zeros((inputs["q"].shape[1], inputs["q"].shape[0]), np.float32)
    return attnserve.backward_request(inputs["dout"], inputs["q"], inputs["k"], inputs["v"],
                                      inputs["dout"], lse, inputs["cu_seqlens_q"],
                                      inputs["cu_seqlens_k"])


def _tensor(shape, dtype=np.float32):
    return to_tensor(np.random.default_rng().standard_normal(shape).astype(dtype), "t")


def _set(field_name, tensor):
    def mutate(request):
        getattr(request, field_name).CopyFrom(tensor)
    return mutate


def _reshape_all(q_shape, kv_shape):
    """New q, k, v of these shapes, and dout, out, lse to match q in a backward request, so
    the only error is the one the case is about, whatever order the server checks in."""
    def mutate(request):
        for name, shape in (("q", q_shape), ("k", kv_shape), ("v", kv_shape)):
            getattr(request, name).CopyFrom(_tensor(shape))
        if isinstance(request, pb2.BackwardRequest):
            request.dout.CopyFrom(_tensor(q_shape))
            request.out.CopyFrom(_tensor(q_shape))
            request.lse.CopyFrom(_tensor((q_shape[1], q_shape[0])))
    return mutate


def _offsets(cu_q, cu_k):
    def mutate(request):
        request.cu_seqlens_q[:] = cu_q
        request.cu_seqlens_k[:] = cu_k
    return mutate


def _shape(field_name, shape):
    def mutate(request):
        getattr(request, field_name).shape[:] = shape
    return mutate


def _data(field_name, edit):
    def mutate(request):
        tensor = getattr(request, field_name)
        tensor.data = edit(tensor.data)
    return mutate


def _option(name, value):
    def mutate(request):
        setattr(request.options, name, value)
    return mutate


def _dtype(field_name, dtype):
    def mutate(request):
        getattr(request, field_name).dtype = dtype
    return mutate


# (id, mutation of a good request, accepted substrings of the details: any one must appear).
COMMON = [
    ("q_dtype_unspecified", _dtype("q", pb2.DTYPE_UNSPECIFIED), ["q.dtype"]),
    ("q_missing", lambda r: r.ClearField("q"), ["q.", "q: missing"]),
    ("k_dtype_mismatch", _set("k", _tensor((12, 2, 16), np.float16)), ["k.dtype"]),
    ("v_dtype_mismatch", _set("v", _tensor((12, 2, 16), bfloat16)), ["v.dtype"]),
    ("q_rank_2", _shape("q", [12, 32]), ["q.shape"]),
    ("q_rank_4", _shape("q", [12, 2, 16, 1]), ["q.shape"]),
    ("q_negative_dims", _shape("q", [12, -2, -16]), ["q.shape"]),
    ("k_head_dim_mismatch", _reshape_all((12, 2, 16), (12, 2, 8)), ["k.shape"]),
    ("v_shape_mismatch", _set("v", _tensor((12, 1, 16))), ["v.shape"]),
    ("q_data_short", _data("q", lambda d: d[:-2]), ["q.data"]),
    ("k_data_long", _data("k", lambda d: d + b"\0\0\0\0"), ["k.data"]),
    ("cu_q_not_from_zero", _offsets([1, 5, 12], [0, 5, 12]), ["cu_seqlens_q"]),
    ("cu_q_decreasing", _offsets([0, 8, 5, 12], [0, 4, 8, 12]), ["cu_seqlens_q"]),
    ("cu_k_short_of_total", _offsets([0, 5, 12], [0, 5, 11]), ["cu_seqlens_k"]),
    ("cu_k_past_total", _offsets([0, 5, 12], [0, 5, 13]), ["cu_seqlens_k"]),
    ("cu_lengths_differ", _offsets([0, 5, 12], [0, 12]), ["cu_seqlens"]),
    ("cu_empty", _offsets([], []), ["cu_seqlens"]),
    ("heads_not_divisible", _reshape_all((12, 3, 16), (12, 2, 16)), ["num_heads"]),
    ("head_dim_zero", _reshape_all((12, 2, 0), (12, 2, 0)), ["head_dim"]),
    ("softcap_negative", _option("softcap", -1.0), ["options.softcap"]),
    ("softmax_scale_nan", _option("softmax_scale", float("nan")), ["options.softmax_scale"]),
    # Finite, but float32 scores overflow: the answer was NaN everywhere (issue 19 item 8).
    ("softmax_scale_huge", _option("softmax_scale", 3.4e38), ["options.softmax_scale"]),
    ("window_left_below_minus_one", _option("window_left", -2), ["options.window_left"]),
]

BACKWARD_ONLY = [
    ("lse_transposed", _shape("lse", [12, 2]), ["lse.shape"]),
    ("lse_float16", _set("lse", _tensor((2, 12), np.float16)), ["lse.dtype"]),
    ("lse_missing_head", _set("lse", _tensor((1, 12))), ["lse.shape"]),
    ("dout_shape", _set("dout", _tensor((12, 2, 8))), ["dout.shape"]),
    ("dout_data_short", _data("dout", lambda d: d[:-4]), ["dout.data"]),
    ("out_dtype_mismatch", _set("out", _tensor((12, 2, 16), np.float16)), ["out.dtype"]),
]


def assert_rejected(call, request, codes, names=()):
    """The call fails with one of codes, and details that contain one of names (if any)."""
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    code, details = caught.value.code(), caught.value.details() or ""
    assert code in codes, f"{code}: {details}"
    assert not names or any(name in details for name in names), \
        f"details {details!r} name none of {names}"


def assert_serves(client):
    """A good request still gets a correct answer."""
    inputs = _inputs()
    result = client.forward(inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens_q"],
                            inputs["cu_seqlens_k"], **GOOD.options)
    assert forward_errors(result, inputs, GOOD.options)["out"] <= TOLERANCE[np.dtype(np.float32)]


@pytest.mark.parametrize("mutate, names", [c[1:] for c in COMMON], ids=[c[0] for c in COMMON])
def test_forward_rejects(client, mutate, names):
    request = _forward_request(_inputs())
    mutate(request)
    assert_rejected(client.stub.Forward, request, INVALID, names)
    assert_serves(client)


@pytest.mark.parametrize("mutate, names", [c[1:] for c in COMMON + BACKWARD_ONLY],
                         ids=[c[0] for c in COMMON + BACKWARD_ONLY])
def test_backward_rejects(client, mutate, names):
    request = _backward_request(_inputs())
    mutate(request)
    assert_rejected(client.stub.Backward, request, INVALID, names)
    assert_serves(client)


def test_errors_quote_a_huge_field_shortly(client):
    # A shape of a million entries was echoed whole: a 3 MB message, which the client then saw
    # as a metadata-size error instead of INVALID_ARGUMENT.
    request = _forward_request(_inputs())
    request.q.shape[:] = [7] * 1_000_000
    assert_rejected(client.stub.Forward, request, INVALID, ["q.shape"])
    with pytest.raises(grpc.RpcError) as caught:
        client.stub.Forward(request, timeout=30)
    assert len(caught.value.details()) < 1024
    assert_serves(client)


def test_numpy_api_raises_attention_error(client):
    inputs = _inputs()
    with pytest.raises(attnserve.AttentionError) as caught:
        client.forward(inputs["q"], inputs["k"][:, :1], inputs["v"], inputs["cu_seqlens_q"],
                       inputs["cu_seqlens_k"])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "v.shape" in caught.value.details or "k.shape" in caught.value.details


OVER_LIMITS = [
    ("total_q", Case("q", [65], [10], heads=1, heads_k=1, dim=8),
     ["q.shape"]),
    ("total_k", Case("k", [10], [65], heads=1, heads_k=1, dim=8),
     ["k.shape"]),
    ("head_dim", Case("d", [4], [4], dim=64), ["head_dim"]),
    ("batch", Case("b", [1] * 5, [1] * 5, dim=8), ["batch", "cu_seqlens_q"]),
]


@pytest.mark.parametrize("case, names", [c[1:] for c in OVER_LIMITS],
                         ids=[c[0] for c in OVER_LIMITS])
def test_limits(small_client, case, names):
    inputs = _inputs(case)
    assert_rejected(small_client.stub.Forward, _forward_request(inputs), LIMIT, names)
    assert_rejected(small_client.stub.Backward, _backward_request(inputs), LIMIT, names)
    assert_serves(small_client)


def test_message_size_limit(small_client):
    # 60 tokens x 8 heads x 32 floats is 60 KiB per tensor: within every limit but the 64 KiB
    # message limit, which gRPC itself enforces.
    inputs = _inputs(Case("big", [60], [60], heads=8, heads_k=8, dim=32))
    assert_rejected(small_client.stub.Forward, _forward_request(inputs),
                    {grpc.StatusCode.RESOURCE_EXHAUSTED})
    assert_serves(small_client)


def test_an_answer_over_the_message_limit_is_refused_before_compute(small_server, small_client):
    # 64 tokens x 256 heads x head_dim 1 in float16: a 32 KiB request whose answer (out 32 KiB
    # + float32 lse 64 KiB) exceeds the 64 KiB message limit. It used to be computed and then
    # fail in gRPC's send.
    inputs = _inputs(Case("wide", [64], [1], heads=256, heads_k=1, dim=1), np.float16)
    computed = small_server.metric("attnserve_compute_duration_seconds_count",
                                   'rpc="Forward",kernel="reference",device="cpu"')
    assert_rejected(small_client.stub.Forward, _forward_request(inputs), LIMIT,
                    ["max_message_bytes"])
    assert small_server.metric("attnserve_compute_duration_seconds_count",
                               'rpc="Forward",kernel="reference",device="cpu"') == computed
    assert_serves(small_client)


def test_requests_at_the_limits_are_served(small_client):
    case = Case("edge", [16] * 4, [16] * 4, heads=2, heads_k=2, dim=32)
    inputs = _inputs(case)
    result = small_client.forward(inputs["q"], inputs["k"], inputs["v"], inputs["cu_seqlens_q"],
                                  inputs["cu_seqlens_k"])
    assert forward_errors(result, inputs, {})["out"] <= TOLERANCE[np.dtype(np.float32)]


# Bodies that are not the method's protobuf at all: a truncated tensor field, a field with an
# unknown wire type, random bytes. The server parses them itself and names the message type.
NOT_PROTOBUF = [
    ("truncated", bytes([0x0A, 0x40, 0x08, 0x01])),
    ("bad_wire_type", bytes([0x0F, 0x01, 0x02])),
    ("random", bytes(np.random.default_rng(7).integers(0, 256, 64, dtype=np.uint8))),
]


@pytest.mark.parametrize("rpc, message", [("Forward", "attnserve.v1.ForwardRequest"),
                                          ("Backward", "attnserve.v1.BackwardRequest")])
@pytest.mark.parametrize("body", [c[1] for c in NOT_PROTOBUF], ids=[c[0] for c in NOT_PROTOBUF])
def test_bodies_that_are_not_protobuf_are_invalid_argument(server, client, rpc, message, body):
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_unary(f"/attnserve.v1.AttentionService/{rpc}",
                                   request_serializer=None, response_deserializer=None)
        assert_rejected(call, body, INVALID, [message])
    assert_serves(client)
