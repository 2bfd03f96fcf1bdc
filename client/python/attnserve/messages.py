"""The wire's Forward and Backward requests as the clients build them, the results they
answer, and the checks of arrays that answers are received into."""
from dataclasses import dataclass
from typing import Optional, Tuple

import grpc
import numpy as np

from ._proto.attnserve.v1 import attention_pb2 as pb2
from .errors import AttentionError
from .tensors import from_tensor, numpy_dtype, to_tensor


@dataclass(frozen=True)
class Execution:
    """Where and how the server ran a request."""
    device: str
    kernel: str
    queue_us: int
    compute_us: int
    batched_requests: int
    code_path: str = ""  # family and code path that ran it, e.g. "flash/sm90", "reference/cpu"

    @classmethod
    def from_proto(cls, message: pb2.Execution) -> "Execution":
        return cls(message.device, message.kernel, message.queue_us, message.compute_us,
                   message.batched_requests, message.code_path)


@dataclass(frozen=True)
class ForwardResult:
    out: np.ndarray  # [total_q, num_heads, head_dim], dtype of q
    lse: np.ndarray  # [num_heads, total_q] float32; +inf for rows that see no key
    execution: Execution
    context_id: str = ""       # the kept context (keep_context=True); empty when none was kept
    context_address: str = ""  # the replica holding it, when the server knows its address
    # The seed dropout used (the server's pick when the call sent 0): pass it to backward().
    # 0 without dropout.
    dropout_seed: int = 0


@dataclass(frozen=True)
class BackwardResult:
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    execution: Execution


def _offsets(values, name: str) -> list:
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(f"{name}: expected a 1-D sequence of integers, got {array.dtype} "
                        f"with shape {array.shape}")
    # Python ints: protobuf itself rejects values outside int32 rather than wrapping them.
    return array.astype(np.int64).tolist()


def attention_options(softmax_scale: Optional[float] = None, causal: bool = False,
                      window_size: Tuple[int, int] = (-1, -1),
                      softcap: float = 0.0, alibi_slopes=None,
                      dropout_p: float = 0.0) -> pb2.AttentionOptions:
    """flash_attn_varlen_func's keyword arguments as the wire's AttentionOptions.
    alibi_slopes ([num_heads] or [batch, num_heads], float32) go as they are: the server
    checks their dtype, shape and values."""
    options = pb2.AttentionOptions(softmax_scale=softmax_scale or 0.0, causal=causal,
                                   softcap=softcap, dropout_p=dropout_p)
    if alibi_slopes is not None:
        options.alibi_slopes.CopyFrom(to_tensor(alibi_slopes, "alibi_slopes"))
    left, right = window_size
    # -1 means unbounded, which the wire says by leaving the optional field out.
    if left != -1:
        options.window_left = left
    if right != -1:
        options.window_right = right
    return options


def forward_request(q, k, v, cu_seqlens_q, cu_seqlens_k, dropout_seed: int = 0,
                    **options) -> pb2.ForwardRequest:
    return pb2.ForwardRequest(
        q=to_tensor(q, "q"), k=to_tensor(k, "k"), v=to_tensor(v, "v"),
        cu_seqlens_q=_offsets(cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k=_offsets(cu_seqlens_k, "cu_seqlens_k"),
        options=attention_options(**options), dropout_seed=dropout_seed)


def backward_request(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                     deterministic: bool = False, dropout_seed: int = 0,
                     **options) -> pb2.BackwardRequest:
    return pb2.BackwardRequest(
        dout=to_tensor(dout, "dout"), q=to_tensor(q, "q"), k=to_tensor(k, "k"),
        v=to_tensor(v, "v"), out=to_tensor(out, "out"), lse=to_tensor(lse, "lse"),
        cu_seqlens_q=_offsets(cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k=_offsets(cu_seqlens_k, "cu_seqlens_k"),
        options=attention_options(**options), deterministic=deterministic,
        dropout_seed=dropout_seed)


def _output(array: Optional[np.ndarray], shape, dtype: np.dtype, name: str) -> np.ndarray:
    """The caller's array a result is received into, checked; a fresh one when none."""
    if array is None:
        return np.empty(shape, dtype)
    if array.shape != tuple(shape) or array.dtype != dtype:
        raise ValueError(f"{name}: expected an array of shape {list(shape)} and dtype {dtype}, "
                         f"got {list(array.shape)} {array.dtype}")
    if not (array.flags.writeable and array.flags.c_contiguous):
        raise ValueError(f"{name}: the array to receive into must be writable and C-contiguous")
    return array


def _check_answer(tensor: pb2.Tensor, expected: np.ndarray, name: str) -> None:
    """A data channel answer's shape and dtype against the array its bytes went into."""
    if tuple(tensor.shape) != expected.shape or numpy_dtype(tensor.dtype) != expected.dtype:
        raise AttentionError(grpc.StatusCode.INTERNAL,
                             f"{name}: the server answered shape {list(tensor.shape)} dtype "
                             f"{pb2.DType.Name(tensor.dtype)}; expected {list(expected.shape)} "
                             f"{expected.dtype}")


def _grpc_result(tensor: pb2.Tensor, into: Optional[np.ndarray], name: str) -> np.ndarray:
    array = from_tensor(tensor, name)
    if into is None:
        return array
    _output(into, array.shape, array.dtype, name)
    np.copyto(into, array)
    return into


def _shape_only(wire: np.ndarray, enum: int) -> pb2.Tensor:
    # A data channel request's tensors carry dtype and shape; their bytes travel as chunks.
    return pb2.Tensor(dtype=enum, shape=wire.shape)


def _with_data(wire: np.ndarray, enum: int) -> pb2.Tensor:
    return pb2.Tensor(dtype=enum, shape=wire.shape, data=wire.tobytes())
