"""FlashAttention's flash_attn_varlen_func over attnserve: a drop-in torch autograd function.

    from attnserve import flash_attn_varlen_func     # instead of: from flash_attn import ...

The forward calls the server's Forward; the backward calls its Backward, as FlashAttention's own
backward uses the forward's out and lse. Tensors may live on the CPU or a GPU and results come
back on the input's device and dtype.

The bytes take the shortest way the client offers (attnserve.Client's data channel when the
server has one): CPU tensors are sent from their own memory and results are received straight
into the returned tensors; CUDA tensors are copied asynchronously into page-locked host buffers
(reused across calls), sent from there, and results come back through such buffers with
asynchronous copies to the device. When a backward can follow (grad enabled and an input
requiring it), the forward asks the server to keep its context, so the backward sends only
dout; if the server lost the context the backward resends everything, fetching q, k, v, out
and lse to the host only then, and a context no backward will use (its graph was dropped) is
released. Against a server without contexts or the data channel everything still works, over
gRPC and with full backwards.
Needs torch (pip install attnserve[torch]); the rest of the package does not.
"""
import threading
import weakref
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from ml_dtypes import bfloat16

from . import connections
from .client import Client
from .errors import UnsupportedOptionError

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Page-locked memory kept for reuse; beyond it buffers are freed after their call.
PINNED_CACHE_BYTES = 2 << 30
# Buffers are pinned in whole units of this, so shapes that differ slightly share them.
_PINNED_GRANULE = 1 << 20


def _check(tensor: torch.Tensor, name: str) -> None:
    if tensor.dtype not in _DTYPES:
        raise TypeError(f"{name}: dtype {tensor.dtype} is not supported "
                        "(use float16, bfloat16 or float32)")
    if tensor.dim() != 3:
        raise ValueError(f"{name}: expected 3 dimensions [tokens, heads, head_dim], got shape "
                         f"{list(tensor.shape)}")


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy)."""
    if tensor.dtype == torch.bfloat16:
        # numpy has no bfloat16; ml_dtypes' has the same bits. int16 because older torch
        # cannot hand uint16 to numpy.
        return tensor.view(torch.int16).numpy().view(bfloat16)
    return tensor.numpy()


class _PinnedPool:
    """Page-locked host buffers kept across calls: pinning costs a cudaHostAlloc per buffer,
    and only pinned memory copies to and from a GPU asynchronously at full speed."""

    def __init__(self, max_cached_bytes: int):
        self.max_cached_bytes = max_cached_bytes
        self._lock = threading.Lock()
        self._free: Dict[int, List[Tuple[torch.Tensor, Optional[torch.cuda.Event]]]] = {}
        self._cached_bytes = 0

    def take(self, nbytes: int) -> torch.Tensor:
        size = max(_PINNED_GRANULE, -(-nbytes // _PINNED_GRANULE) * _PINNED_GRANULE)
        with self._lock:
            free = self._free.get(size)
            entry = free.pop() if free else None
            if entry is not None:
                self._cached_bytes -= size
        if entry is None:
            return torch.empty(size, dtype=torch.uint8, pin_memory=True)
        buffer, last_use = entry
        if last_use is not None:
            last_use.synchronize()  # the device copy that last read it has finished
        return buffer

    def give(self, buffer: torch.Tensor, last_use: Optional[torch.cuda.Event]) -> None:
        with self._lock:
            if self._cached_bytes + buffer.numel() <= self.max_cached_bytes:
                self._free.setdefault(buffer.numel(), []).append((buffer, last_use))
                self._cached_bytes += buffer.numel()


_pool = _PinnedPool(PINNED_CACHE_BYTES)


class _Staging:
    """The host side of one call: pinned buffers for CUDA tensors, plain CPU memory (sent from
    and received into directly) for CPU ones."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._buffers: List[torch.Tensor] = []

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        if not self.cuda:
            return torch.empty(shape, dtype=dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buffer = _pool.take(nbytes)
        self._buffers.append(buffer)
        return buffer[:nbytes].view(dtype).view(shape)

    def host(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor's values in host memory; for CUDA ones valid after ready()."""
        tensor = tensor.detach()
        if not self.cuda:
            return tensor.contiguous()
        pinned = self.empty(tensor.shape, tensor.dtype)
        pinned.copy_(tensor, non_blocking=True)
        return pinned

    def ready(self) -> None:
        """Waits for the device-to-host copies issued so far."""
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.cuda:
            return tensor
        return tensor.to(self.device, non_blocking=True)

    def done(self) -> None:
        """Returns the buffers to the pool once the copies queued on them have run. Only after
        a call succeeded: a failed call's receive threads may still write into them."""
        if not self._buffers:
            return
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        for buffer in self._buffers:
            _pool.give(buffer, event)
        self._buffers = []


class _OnDemand:
    """A saved tensor the client reads for its shape, copied to the host only if it is sent
    (a context backward whose context the server lost)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.shape = tensor, tuple(tensor.shape)

    def __array__(self, dtype=None, copy=None):
        return _numpy(self.tensor.detach().cpu().contiguous())


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


def _offsets(cu_seqlens) -> np.ndarray:
    if isinstance(cu_seqlens, torch.Tensor):
        return cu_seqlens.detach().cpu().numpy()
    return np.asarray(cu_seqlens)


class FlashAttnVarlenFunc(torch.autograd.Function):
    """out, lse = Forward(q, k, v); dq, dk, dv = Backward(dout, context or q, k, v, out, lse)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, options, deterministic, client,
                timeout, keep_context):
        offsets_q, offsets_k = _offsets(cu_seqlens_q), _offsets(cu_seqlens_k)
        staging = _Staging(q.device)
        inputs = [staging.host(t) for t in (q, k, v)]
        out_host = staging.empty(q.shape, q.dtype)
        lse_host = staging.empty((q.shape[1], q.shape[0]), torch.float32)
        staging.ready()
        result = client.forward(*map(_numpy, inputs), offsets_q, offsets_k,
                                keep_context=keep_context, timeout=timeout,
                                out=_numpy(out_host), lse=_numpy(lse_host), **options)
        out, lse = staging.to_device(out_host), staging.to_device(lse_host)
        staging.done()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.offsets = (offsets_q, offsets_k)
        ctx.call = (options, deterministic, client, timeout)
        ctx.context = (result.context_id, result.context_address)
        ctx.unused_context = None
        if result.context_id:
            ctx.unused_context = weakref.finalize(ctx, _release_context, client,
                                                  result.context_id, result.context_address)
            # At exit the server's TTL frees it; the client may be gone by then.
            ctx.unused_context.atexit = False
        # FlashAttention's backward ignores lse's gradient too.
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        options, deterministic, client, timeout = ctx.call
        context_id, context_address = ctx.context
        if ctx.unused_context is not None:
            ctx.unused_context.detach()  # this backward uses the context (and releases it)
        staging = _Staging(q.device)
        dout_host = staging.host(dout.to(q.dtype))
        if context_id:
            inputs = [_OnDemand(t) for t in (q, k, v, out, lse)]
        else:
            inputs = [_numpy(staging.host(t)) for t in (q, k, v, out, lse)]
        grads = [staging.empty(t.shape, t.dtype) for t in (q, k, v)]
        staging.ready()
        dq, dk, dv = (_numpy(g) for g in grads)
        client.backward(_numpy(dout_host), *inputs, *ctx.offsets, deterministic=deterministic,
                        context_id=context_id, context_address=context_address,
                        timeout=timeout, dq=dq, dk=dk, dv=dv, **options)
        grads = [staging.to_device(g) for g in grads]
        staging.done()
        return (*grads, None, None, None, None, None, None, None)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *,
                           client: Union[Client, str, None] = None,
                           timeout: Optional[float] = None):
    """FlashAttention 2's flash_attn_varlen_func, computed by an attnserve server.

    q [total_q, num_heads, head_dim], k and v [total_k, num_heads_k, head_dim] (float16,
    bfloat16 or float32, on any device); cu_seqlens_q/k int32 offsets [batch + 1]. Returns out
    [total_q, num_heads, head_dim] on q's device and dtype, differentiable in q, k and v. With
    return_attn_probs=True returns (out, softmax_lse, None): softmax_lse [num_heads, total_q]
    float32 as FlashAttention's, but the attention probabilities are never materialised (the
    server does not return them), so the third value is None.

    max_seqlen_q/k are accepted for compatibility; the server reads lengths from cu_seqlens.
    dropout_p > 0, alibi_slopes and block_table raise UnsupportedOptionError.

    Keyword-only extras: client (a Client, a target string, or None for
    attnserve.set_default_client's or $ATTNSERVE_TARGET's) and timeout (seconds, overriding the
    client's deadline for each call).
    """
    del max_seqlen_q, max_seqlen_k
    if dropout_p:
        raise UnsupportedOptionError(f"dropout_p={dropout_p}: attnserve has no attention "
                                     "dropout; pass dropout_p=0.0")
    if alibi_slopes is not None:
        raise UnsupportedOptionError("alibi_slopes: attnserve does not support ALiBi yet")
    if block_table is not None:
        raise UnsupportedOptionError("block_table: attnserve has no paged KV cache")
    for tensor, name in ((q, "q"), (k, "k"), (v, "v")):
        _check(tensor, name)
    options = {"softmax_scale": softmax_scale, "causal": bool(causal),
               "window_size": tuple(int(w) for w in window_size), "softcap": float(softcap)}
    # Only a backward uses a context; the server would hold one for nothing otherwise.
    keep_context = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    out, lse = FlashAttnVarlenFunc.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, options,
                                         bool(deterministic), connections.resolve(client),
                                         timeout, keep_context)
    return (out, lse, None) if return_attn_probs else out
