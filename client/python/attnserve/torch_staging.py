"""Host memory for the torch functions' transfers: CPU tensors are sent from and received into
their own memory; CUDA tensors cross through page-locked host buffers, pooled across calls, with
asynchronous copies."""
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from ml_dtypes import bfloat16

# Page-locked memory kept for reuse; beyond it buffers are freed after their call.
PINNED_CACHE_BYTES = 2 << 30
# Buffers are pinned in whole units of this, so shapes that differ slightly share them.
_PINNED_GRANULE = 1 << 20


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
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


class Staging:
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


class OnDemand:
    """A saved tensor the client reads for its shape, copied to the host only if it is sent
    (a context backward whose context the server lost)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.shape = tensor, tuple(tensor.shape)

    def __array__(self, dtype=None, copy=None):
        return numpy_view(self.tensor.detach().cpu().contiguous())
