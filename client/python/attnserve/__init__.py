"""Python client for attnserve, the remote attention compute service.

    with attnserve.Client("localhost:8001") as client:
        result = client.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)

attnserve.flash_attn holds FlashAttention 2's Python API (flash_attn_func, flash_attn_varlen_func,
the packed variants, the 1.x names) computed by the server as differentiable torch custom
operators (needs torch: pip install attnserve[torch]); it finds the server through
set_default_client or $ATTNSERVE_TARGET. attnserve.flash_attn_varlen_func is the one re-exported
here. install_flash_attn_shim() makes `import flash_attn` resolve to attnserve;
register_with_transformers() adds attn_implementation="attnserve" to Hugging Face transformers.
attnserve.reference holds a float64 numpy reference of the same semantics; attention_pb2 /
attention_pb2_grpc are the raw generated stubs.
"""
from . import reference
from ._proto.attnserve.v1 import attention_pb2, attention_pb2_grpc
from .client import (BackwardResult, Client, Execution, ForwardResult, attention_options,
                     backward_request, forward_request)
from .connections import client_for, default_client, set_default_client
from .errors import AttentionError, UnsupportedOptionError
from .flash_attn_shim import install_flash_attn_shim
from .security import Security

__version__ = "0.1.0"

__all__ = [
    "AttentionError", "BackwardResult", "Client", "Execution", "ForwardResult", "Security",
    "UnsupportedOptionError", "attention_options", "attention_pb2", "attention_pb2_grpc",
    "backward_request", "client_for", "default_client", "flash_attn_varlen_func",
    "forward_request", "install_flash_attn_shim", "reference", "register_with_transformers",
    "set_default_client",
]

# Names imported on first use, so that `import attnserve` works without torch (or transformers).
_LAZY = {"flash_attn_varlen_func": ".flash_attn",
         "register_with_transformers": ".transformers_attention"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'attnserve' has no attribute {name!r}")
    import importlib
    try:
        module = importlib.import_module(_LAZY[name], __name__)
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        raise ModuleNotFoundError(f"attnserve.{name} needs torch: pip install 'attnserve[torch]'",
                                  name="torch") from error
    return getattr(module, name)
