"""Client-side packing: dtypes, byte order, layout, options and errors (no server needed)."""
import grpc
import numpy as np
import pytest
from ml_dtypes import bfloat16

import attnserve
from attnserve import attention_pb2 as pb2
from attnserve.tensors import from_tensor, to_tensor


@pytest.mark.parametrize("dtype, enum", [(np.float16, pb2.DTYPE_FLOAT16),
                                         (np.float32, pb2.DTYPE_FLOAT32),
                                         (bfloat16, pb2.DTYPE_BFLOAT16)])
def test_round_trip_is_exact_and_little_endian(dtype, enum, rng):
    array = rng.standard_normal((5, 3, 4)).astype(dtype)
    tensor = to_tensor(array, "q")
    assert tensor.dtype == enum and list(tensor.shape) == [5, 3, 4]
    expected = array.view(np.uint16 if array.itemsize == 2 else np.uint32).astype(
        "<u2" if array.itemsize == 2 else "<u4").tobytes()
    assert tensor.data == expected
    back = from_tensor(tensor, "out")
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back.view(np.uint8), array.view(np.uint8))


def test_non_contiguous_and_big_endian_inputs_are_packed_by_value(rng):
    base = rng.standard_normal((4, 6, 8)).astype(np.float32)
    strided = base.transpose(1, 0, 2)[::2]
    assert to_tensor(strided, "q").data == np.ascontiguousarray(strided).tobytes()
    big = base.astype(">f4")
    assert to_tensor(big, "q").data == base.tobytes()
    assert to_tensor(big, "q").dtype == pb2.DTYPE_FLOAT32
    bf = base.astype(bfloat16)[:, ::-1]
    np.testing.assert_array_equal(from_tensor(to_tensor(bf, "q"), "q"), bf)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64])
def test_unsupported_dtype_is_rejected_by_name(dtype):
    with pytest.raises(TypeError, match="k: dtype"):
        to_tensor(np.zeros((1, 1, 1), dtype), "k")


def test_response_byte_count_is_checked():
    with pytest.raises(ValueError, match="out"):
        from_tensor(pb2.Tensor(dtype=pb2.DTYPE_FLOAT32, shape=[2, 2], data=b"\0" * 12), "out")


@pytest.mark.parametrize("window, left, right", [((-1, -1), None, None), ((4, -1), 4, None),
                                                 ((-1, 0), None, 0), ((0, 3), 0, 3)])
def test_window_maps_to_optional_fields(window, left, right):
    options = attnserve.attention_options(window_size=window)
    assert (options.window_left if options.HasField("window_left") else None) == left
    assert (options.window_right if options.HasField("window_right") else None) == right


def test_requests_carry_every_field():
    x = np.ones((3, 2, 4), np.float16)
    lse = np.zeros((2, 3), np.float32)
    request = attnserve.backward_request(x, x, x, x, x, lse, [0, 3], np.array([0, 3]),
                                         deterministic=True, softmax_scale=0.5, causal=True,
                                         softcap=2.0)
    assert request.deterministic and request.options.causal
    assert request.options.softmax_scale == 0.5 and request.options.softcap == 2.0
    assert list(request.cu_seqlens_q) == [0, 3] and list(request.cu_seqlens_k) == [0, 3]
    assert request.lse.dtype == pb2.DTYPE_FLOAT32 and list(request.lse.shape) == [2, 3]
    assert attnserve.forward_request(x, x, x, [0, 3], [0, 3]).options.softmax_scale == 0.0
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        attnserve.forward_request(x, x, x, [0.0, 3.0], [0, 3])


def test_rpc_errors_become_attention_errors():
    # Nothing listens on port 1: the channel fails fast with UNAVAILABLE.
    with attnserve.Client("127.0.0.1:1", timeout=5) as client:
        with pytest.raises(attnserve.AttentionError) as caught:
            client.server_info()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert isinstance(caught.value.details, str)
    assert not isinstance(caught.value, grpc.RpcError)
