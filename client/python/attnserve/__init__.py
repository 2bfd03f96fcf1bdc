"""Python client for attnserve, the remote attention compute service.

    with attnserve.Client("localhost:8001") as client:
        result = client.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)

attnserve.flash_attn_varlen_func is FlashAttention's function of that name as a torch autograd
function computed by the server (needs torch: pip install attnserve[torch]); it finds the server
through set_default_client or $ATTNSERVE_TARGET. attnserve.reference holds a float64 numpy
reference of the same semantics; attention_pb2 / attention_pb2_grpc are the raw generated stubs.
"""
from . import reference
from ._proto.attnserve.v1 import attention_pb2, attention_pb2_grpc
from .client import (BackwardResult, Client, Execution, ForwardResult, attention_options,
                     backward_request, forward_request)
from .connections import client_for, default_client, set_default_client
from .errors import AttentionError, UnsupportedOptionError
from .security import Security

__version__ = "0.1.0"

__all__ = [
    "AttentionError", "BackwardResult", "Client", "Execution", "ForwardResult", "Security",
    "UnsupportedOptionError", "attention_options", "attention_pb2", "attention_pb2_grpc",
    "backward_request", "client_for", "default_client", "flash_attn_varlen_func",
    "forward_request", "reference", "set_default_client",
]


def __getattr__(name):
    # Imported on first use, so that `import attnserve` works without torch installed.
    if name == "flash_attn_varlen_func":
        try:
            from .flash_attn import flash_attn_varlen_func
        except ModuleNotFoundError as error:
            if error.name != "torch":
                raise
            raise ModuleNotFoundError("attnserve.flash_attn_varlen_func needs torch: "
                                      "pip install 'attnserve[torch]'",
                                      name="torch") from error
        return flash_attn_varlen_func
    raise AttributeError(f"module 'attnserve' has no attribute {name!r}")
