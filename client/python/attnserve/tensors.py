"""Conversion between numpy arrays and attnserve.v1.Tensor (row-major little-endian bytes)."""
from typing import Tuple

import numpy as np
from ml_dtypes import bfloat16

from ._proto.attnserve.v1 import attention_pb2 as pb2

# numpy dtype (native byte order) -> (wire enum, little-endian dtype the bytes are written in).
# bfloat16 goes through its uint16 bit pattern because ml_dtypes' dtype has no byte order of
# its own.
_TO_WIRE = {
    np.dtype(np.float16): (pb2.DTYPE_FLOAT16, np.dtype("<f2")),
    np.dtype(np.float32): (pb2.DTYPE_FLOAT32, np.dtype("<f4")),
    np.dtype(bfloat16): (pb2.DTYPE_BFLOAT16, np.dtype("<u2")),
}
_FROM_WIRE = {enum: (dtype, wire) for dtype, (enum, wire) in _TO_WIRE.items()}

SUPPORTED = tuple(_TO_WIRE)


def _native(dtype: np.dtype) -> np.dtype:
    # '>f4' and '<f4' are different numpy dtypes; both are float32 for the wire.
    return dtype.newbyteorder("=") if dtype.kind == "f" else dtype


def wire_array(array, name: str) -> Tuple[int, np.ndarray]:
    """(wire dtype enum, the array's values C-contiguous in the wire's byte order), for a
    float16, float32 or ml_dtypes.bfloat16 array of any layout or byte order. Copies only when
    the layout or byte order needs it."""
    array = np.asarray(array)
    dtype = _native(array.dtype)
    if dtype not in _TO_WIRE:
        raise TypeError(f"{name}: dtype {array.dtype} is not supported "
                        "(use float16, float32 or ml_dtypes.bfloat16)")
    enum, wire = _TO_WIRE[dtype]
    if dtype == bfloat16:
        bits = np.ascontiguousarray(array).view(np.uint16)
        return enum, np.ascontiguousarray(bits, dtype=wire)
    return enum, np.ascontiguousarray(array, dtype=wire)


def to_tensor(array, name: str) -> pb2.Tensor:
    """Packs a float16, float32 or ml_dtypes.bfloat16 array of any layout or byte order."""
    enum, data = wire_array(array, name)
    return pb2.Tensor(dtype=enum, shape=data.shape, data=data.tobytes())


def numpy_dtype(enum: int) -> np.dtype:
    """The numpy dtype a response tensor of wire dtype `enum` is returned in."""
    return _FROM_WIRE[enum][0]


def wire_enum(dtype) -> int:
    return _TO_WIRE[_native(np.dtype(dtype))][0]


def byte_view(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as a flat memoryview, without copying (numpy cannot
    export ml_dtypes' bfloat16 through the buffer protocol, hence the uint8 view)."""
    if not array.flags.c_contiguous:
        raise ValueError("byte_view needs a C-contiguous array")
    return memoryview(array.reshape(-1).view(np.uint8))


def from_tensor(tensor: pb2.Tensor, name: str) -> np.ndarray:
    """Unpacks a response tensor without copying: the array is a read-only view of its bytes."""
    if tensor.dtype not in _FROM_WIRE:
        raise ValueError(f"{name}: unsupported dtype {tensor.dtype} in the response")
    dtype, wire = _FROM_WIRE[tensor.dtype]
    shape = tuple(tensor.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if len(tensor.data) != count * wire.itemsize:
        raise ValueError(f"{name}: {len(tensor.data)} bytes in the response do not match "
                         f"shape {list(shape)}")
    array = np.frombuffer(tensor.data, dtype=wire)
    if dtype == bfloat16:
        array = array.astype(np.uint16, copy=False).view(bfloat16)
    return array.reshape(shape)
