"""Python client for attnserve, the remote attention compute service.

    with attnserve.Client("localhost:8001") as client:
        result = client.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)

attnserve.reference holds a float64 numpy reference of the same semantics;
attention_pb2 / attention_pb2_grpc are the raw generated stubs.
"""
from . import reference
from ._proto.attnserve.v1 import attention_pb2, attention_pb2_grpc
from .client import (BackwardResult, Client, Execution, ForwardResult, attention_options,
                     backward_request, forward_request)
from .errors import AttentionError

__version__ = "0.1.0"

__all__ = [
    "AttentionError", "BackwardResult", "Client", "Execution", "ForwardResult",
    "attention_options", "attention_pb2", "attention_pb2_grpc", "backward_request",
    "forward_request", "reference",
]
