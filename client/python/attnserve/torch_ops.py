"""The server's Forward and Backward as torch custom operators: `attnserve::varlen_forward` and
`attnserve::varlen_backward`, with fake (meta) implementations and registered autograd, so that
torch.compile(fullgraph=True) traces through them without graph breaks and autograd runs the
server's Backward. Every torch function of attnserve (attnserve.flash_attn's FlashAttention API,
the transformers integration) ends in varlen_attention here.

The bytes take the shortest way the client offers: CUDA tensors through CUDA shared memory when
the server is on this host and allows it (cuda_shared_memory.py: the server's kernels read the
client's GPU memory where it lies; no saved contexts there, so the backward sends everything as
device-to-device copies), else attnserve.Client's data channel when the server has one (see
torch_staging for host memory). When a backward can follow (grad enabled and
an input requiring it), the forward asks the server to keep its context, so the backward sends
only dout; if the server lost the context the backward resends everything, fetching q, k, v, out
and lse to the host only then, and a context no backward will use (its graph was dropped) is
released. Against a server without contexts or the data channel everything still works, over
gRPC and with full backwards.

Operators take only tensors and scalars, so the client and the saved context travel as numbers:
a client is a key into _clients (0: resolve the default client when the call runs, so compiled
graphs follow set_default_client), and a kept context is a one-element int64 tensor whose value
keys _contexts; when that tensor dies (the graph was dropped) the context is released.

Dropout: the forward's server-picked seed comes back as a one-element int64 tensor (the uint64's
bits), an output of varlen_forward that autograd hands to varlen_backward, so the backward draws
the forward's mask. ALiBi slopes (float32 [H] or [batch, H]) travel to the host as they are.
"""
import itertools
import threading
import weakref
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from . import connections
from .client import Client
from .messages import attention_options
from .torch_staging import OnDemand, Staging, numpy_view

_clients: "weakref.WeakValueDictionary[int, Client]" = weakref.WeakValueDictionary()


def client_key(client: Union[Client, str, None]) -> int:
    """The number an operator call names its client by (0: the default client)."""
    if client is None:
        return 0
    client = connections.resolve(client)
    _clients[id(client)] = client
    return id(client)


def _client(key: int) -> Client:
    return connections.default_client() if key == 0 else _clients[key]


class _Contexts:
    """Contexts kept on the server, by the number in their handle tensor."""

    def __init__(self):
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._entries: Dict[int, Tuple[Client, str, str, weakref.finalize]] = {}

    def keep(self, client: Client, context_id: str, context_address: str) -> Tensor:
        number = next(self._numbers)
        handle = torch.tensor([number], dtype=torch.int64)
        finalizer = weakref.finalize(handle, self._dropped, number)
        # At exit the server's TTL frees it; the client may be gone by then.
        finalizer.atexit = False
        with self._lock:
            self._entries[number] = (client, context_id, context_address, finalizer)
        return handle

    def take(self, handle: Tensor) -> Tuple[str, str]:
        """The context for a backward (which releases it on the server), or ("", "") if there is
        none (none kept, or an earlier backward of a retained graph used it)."""
        with self._lock:
            entry = self._entries.pop(int(handle.reshape(-1)[0]), None)
        if entry is None:
            return "", ""
        _, context_id, context_address, finalizer = entry
        finalizer.detach()
        return context_id, context_address

    def _dropped(self, number: int) -> None:
        with self._lock:
            entry = self._entries.pop(number, None)
        if entry is not None:
            client, context_id, context_address, _ = entry
            _release_context(client, context_id, context_address)


_contexts = _Contexts()
_NO_CONTEXT = 0


def _release_context(client: Client, context_id: str, context_address: str) -> None:
    """Frees a context whose graph was dropped, in the background (this runs inside garbage
    collection). Best effort: the server's TTL frees it anyway, so failures are ignored."""
    def release():
        try:
            client.release_context(context_id, context_address=context_address)
        except Exception:  # noqa: BLE001 - see above
            pass

    try:
        client._executor().submit(release)
    except RuntimeError:  # the client or the interpreter is shutting down
        pass


def _offsets(cu_seqlens: Tensor) -> np.ndarray:
    return cu_seqlens.detach().cpu().numpy()


def _contiguous(**tensors: Tensor):
    return [(name, t.detach().contiguous()) for name, t in tensors.items()]


def _inline_offsets(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor):
    return [("cu_seqlens_q", _offsets(cu_seqlens_q)), ("cu_seqlens_k", _offsets(cu_seqlens_k))]


def _slopes(alibi_slopes: Optional[Tensor]) -> Optional[np.ndarray]:
    return None if alibi_slopes is None else alibi_slopes.detach().cpu().contiguous().numpy()


def _wire_options(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                  dropout_p):
    return attention_options(softmax_scale=softmax_scale, causal=causal,
                             window_size=(window_left, window_right), softcap=softcap,
                             alibi_slopes=_slopes(alibi_slopes), dropout_p=dropout_p)


def _options(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p):
    return {"softmax_scale": softmax_scale, "causal": causal,
            "window_size": (window_left, window_right), "softcap": softcap,
            "alibi_slopes": _slopes(alibi_slopes), "dropout_p": dropout_p}


def _seed_tensor(seed: int) -> Tensor:
    """A uint64 seed as a one-element int64 tensor (its bits), and back with _seed."""
    return torch.tensor([seed - (1 << 64) if seed >= 1 << 63 else seed], dtype=torch.int64)


def _seed(tensor: Tensor) -> int:
    return int(tensor.reshape(-1)[0]) & ((1 << 64) - 1)


@torch.library.custom_op("attnserve::varlen_forward", mutates_args=())
def varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                   softmax_scale: Optional[float], causal: bool, window_left: int,
                   window_right: int, softcap: float, deterministic: bool, keep_context: bool,
                   client: int, timeout: Optional[float], alibi_slopes: Optional[Tensor],
                   dropout_p: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """out [total_q, H, D], lse [H, total_q] float32, the kept context's handle and the dropout
    seed used (0 without dropout). `deterministic` is for the backward (autograd reads it from
    here)."""
    del deterministic
    caller = _client(client)
    options = (softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p)
    if q.is_cuda:
        lse_shape = (q.shape[1], q.shape[0])
        through_gpu = caller.cuda_call(
            "attention_forward", _contiguous(q=q, k=k, v=v), _inline_offsets(cu_seqlens_q,
                                                                             cu_seqlens_k),
            [("out", tuple(q.shape), q.dtype), ("lse", lse_shape, torch.float32)],
            _wire_options(*options), None, timeout)
        if through_gpu is not None:  # never with dropout: that path needs a seed of the caller's
            out, lse = through_gpu
            return out, lse, torch.tensor([_NO_CONTEXT], dtype=torch.int64), _seed_tensor(0)
    staging = Staging(q.device)
    inputs = [staging.host(t) for t in (q, k, v)]
    out_host = staging.empty(q.shape, q.dtype)
    lse_host = staging.empty((q.shape[1], q.shape[0]), torch.float32)
    staging.ready()
    result = caller.forward(*map(numpy_view, inputs), _offsets(cu_seqlens_q),
                            _offsets(cu_seqlens_k), keep_context=keep_context, timeout=timeout,
                            out=numpy_view(out_host), lse=numpy_view(lse_host),
                            **_options(*options))
    out, lse = staging.to_device(out_host), staging.to_device(lse_host)
    staging.done()
    if result.context_id:
        handle = _contexts.keep(caller, result.context_id, result.context_address)
    else:
        handle = torch.tensor([_NO_CONTEXT], dtype=torch.int64)
    return out, lse, handle, _seed_tensor(result.dropout_seed)


@varlen_forward.register_fake
def _varlen_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left,
                         window_right, softcap, deterministic, keep_context, client, timeout,
                         alibi_slopes, dropout_p):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32),
            torch.empty(1, dtype=torch.int64), torch.empty(1, dtype=torch.int64))


@torch.library.custom_op("attnserve::varlen_backward", mutates_args=())
def varlen_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, context: Tensor,
                    softmax_scale: Optional[float], causal: bool, window_left: int,
                    window_right: int, softcap: float, deterministic: bool, client: int,
                    timeout: Optional[float], alibi_slopes: Optional[Tensor], dropout_p: float,
                    dropout_seed: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of a varlen_forward, by its kept context when the server still has it;
    dropout_seed is the forward's seed output."""
    context_id, context_address = _contexts.take(context)
    caller = _client(client)
    options = (softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p)
    seed = _seed(dropout_seed)
    if q.is_cuda and not context_id:
        through_gpu = caller.cuda_call(
            "attention_backward",
            _contiguous(dout=dout.to(q.dtype), q=q, k=k, v=v, out=out, lse=lse),
            _inline_offsets(cu_seqlens_q, cu_seqlens_k),
            [(name, tuple(t.shape), t.dtype) for name, t in (("dq", q), ("dk", k), ("dv", v))],
            _wire_options(*options), deterministic, timeout, dropout_seed=seed)
        if through_gpu is not None:
            return tuple(through_gpu)
    staging = Staging(q.device)
    dout_host = staging.host(dout.to(q.dtype))
    if context_id:
        inputs = [OnDemand(t) for t in (q, k, v, out, lse)]
    else:
        inputs = [numpy_view(staging.host(t)) for t in (q, k, v, out, lse)]
    grads = [staging.empty(t.shape, t.dtype) for t in (q, k, v)]
    staging.ready()
    dq, dk, dv = (numpy_view(g) for g in grads)
    caller.backward(numpy_view(dout_host), *inputs, _offsets(cu_seqlens_q), _offsets(cu_seqlens_k),
                    deterministic=deterministic, context_id=context_id,
                    context_address=context_address, timeout=timeout, dq=dq, dk=dk, dv=dv,
                    dropout_seed=seed, **_options(*options))
    grads = [staging.to_device(g) for g in grads]
    staging.done()
    return tuple(grads)


@varlen_backward.register_fake
def _varlen_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, context,
                          softmax_scale, causal, window_left, window_right, softcap,
                          deterministic, client, timeout, alibi_slopes, dropout_p, dropout_seed):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, *options, alibi_slopes, dropout_p = inputs
    out, lse, context, seed = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, context, alibi_slopes,
                          seed)
    ctx.options = options + [dropout_p]
    # FlashAttention's backward ignores lse's gradient too (and alibi_slopes get none, as there).
    ctx.mark_non_differentiable(lse, context, seed)


def _backward(ctx, dout, _dlse, _dcontext, _dseed):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, context, alibi_slopes, seed = ctx.saved_tensors
    (softmax_scale, causal, window_left, window_right, softcap, deterministic, _keep_context,
     client, timeout, dropout_p) = ctx.options
    dq, dk, dv = varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, context,
                                 softmax_scale, causal, window_left, window_right, softcap,
                                 deterministic, client, timeout, alibi_slopes, dropout_p, seed)
    return (dq, dk, dv) + (None,) * 13


varlen_forward.register_autograd(_backward, setup_context=_setup_context)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     softmax_scale: Optional[float], causal: bool, window_size: Tuple[int, int],
                     softcap: float, deterministic: bool, client: Union[Client, str, None],
                     timeout: Optional[float], alibi_slopes: Optional[Tensor] = None,
                     dropout_p: float = 0.0) -> Tuple[Tensor, Tensor]:
    """out [total_q, H, D] (differentiable in q, k, v) and lse [H, total_q] of packed
    sequences, computed by the server. alibi_slopes: float32 [H] or [batch, H]."""
    if alibi_slopes is not None and alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes: must be float32 (as FlashAttention requires), got "
                        f"{alibi_slopes.dtype}")
    # Only a backward uses a context; the server would hold one for nothing otherwise.
    keep_context = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                or v.requires_grad)
    out, lse, _, _ = varlen_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k,
        None if softmax_scale is None else float(softmax_scale), bool(causal),
        int(window_size[0]), int(window_size[1]), float(softcap), bool(deterministic),
        keep_context, client_key(client), None if timeout is None else float(timeout),
        alibi_slopes, float(dropout_p))
    return out, lse
