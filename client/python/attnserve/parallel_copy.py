"""Large memory copies on several threads.

One thread copies about 12 GB/s (numpy's copy loop, bound by one core's memory traffic); a
tensor copied into or out of shared memory by one thread is the slowest step of a co-located
call. numpy releases the GIL in its copy loop, so slices copied on a few threads run in
parallel (41 GB/s with 8 threads on the H100 host; 12 did best in the shared memory pipeline
there, 16 worse: bench/RESULTS.md "Co-located clients").
"""
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, List, Optional, Tuple

import numpy as np

# Below this a copy stays on the caller's thread: handing it over costs more than it saves.
PARALLEL_MIN_BYTES = 8 << 20
# Each thread's slice is at least this, so small copies use fewer threads.
SLICE_MIN_BYTES = 4 << 20
MAX_THREADS = 12

_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: a pool inherited from it would queue
    work that nothing runs."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def threads() -> int:
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


def submit(function: Callable, *args) -> Future:
    """Runs function(*args) on the copy threads (shared by every call of the process: their
    tasks never wait for each other, so they cannot deadlock)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(threads(), thread_name_prefix="attnserve-copy")
        pool = _pool
    return pool.submit(function, *args)


def byte_slices(size: int) -> List[Tuple[int, int]]:
    """[start, stop) slices of a copy of `size` bytes, one per thread that should copy it."""
    parts = min(threads(), size // SLICE_MIN_BYTES) if size >= PARALLEL_MIN_BYTES else 1
    step = -(-size // max(1, parts))
    return [(start, min(size, start + step)) for start in range(0, size, step)] or [(0, 0)]


def copy_bytes(destination: np.ndarray, source: np.ndarray) -> None:
    """destination[:] = source for two 1-D uint8 arrays of one length, on several threads when
    large."""
    if destination.nbytes != source.nbytes:
        raise ValueError(f"copy of {source.nbytes} bytes into {destination.nbytes}")
    (first, *rest) = byte_slices(destination.nbytes)
    futures = [submit(np.copyto, destination[a:b], source[a:b]) for a, b in rest]
    try:  # the caller's thread copies the first slice itself instead of waiting idle
        np.copyto(destination[first[0]:first[1]], source[first[0]:first[1]])
    finally:
        for future in futures:
            future.result()
