"""One large Forward or Backward through shared memory as a pipeline of calls of whole sequences.

A call through a region has three steps, each bound by a different resource: the client copies
the inputs in (host memory, client threads), the server moves them to its GPU, computes and
writes the outputs back (PCIe, GPU), and the client copies the outputs out. Run as one call,
they take turns. Cut into chunks of whole sequences, each a ModelInfer of its own over the same
region, the client copies the next chunk in while the server works on the last one, and copies
a finished chunk out while the server works on the next.

Sequences are independent in attention, so a chunk's answer is exactly the same as the rows it
would have had in the whole call. Token-major tensors ([tokens, heads, dim]) keep their place in
the region: a chunk's rows are a contiguous slice of it. lse ([heads, total_q]) is head-major, so
each chunk has an area of its own for its [heads, chunk_q] part, copied to or from the caller's
lse columns.
"""
from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np

# Tensors whose rows are the query tokens (cu_seqlens_q), the key tokens (cu_seqlens_k), and
# the one that is head-major over query tokens.
QUERY_ROWS = frozenset(("q", "out", "dout", "dq"))
KEY_ROWS = frozenset(("k", "v", "dk", "dv"))
HEAD_MAJOR = frozenset(("lse",))

# Calls smaller than this go as one: their copies take too little time to overlap.
PIPELINE_MIN_BYTES = 64 << 20
# A chunk carries about this much: small enough that the first is in flight early and the
# last leaves little behind, large enough that per-request costs stay small (64 MB beat 16 and
# 32 on the H100 host, bench/RESULTS.md "Co-located clients").
CHUNK_BYTES = 64 << 20
MAX_CHUNKS = 16


@dataclass(frozen=True)
class Chunk:
    """Sequences [first, last) of the call, their query rows [q_start, q_stop) and key rows
    [k_start, k_stop), and their offsets rebased to start at 0."""
    first: int
    last: int
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    cu_seqlens_q: np.ndarray
    cu_seqlens_k: np.ndarray

    def rows(self, name: str):
        """(start, stop) of this chunk's rows of tensor `name`."""
        if name in KEY_ROWS:
            return self.k_start, self.k_stop
        return self.q_start, self.q_stop


def _whole(cu_q: np.ndarray, cu_k: np.ndarray) -> Chunk:
    return Chunk(0, len(cu_q) - 1, int(cu_q[0]), int(cu_q[-1]), int(cu_k[0]), int(cu_k[-1]),
                 cu_q, cu_k)


def plan_chunks(tensors: Dict[str, np.ndarray], cu_q: np.ndarray, cu_k: np.ndarray,
                splittable: bool = True) -> List[Chunk]:
    """The chunks of one call over `tensors` (every input and output, by name): one, unless
    the call is `splittable`, large, every tensor is one the pipeline knows, and the offsets
    are well formed (anything else goes as one call, so the server's answer names what is
    wrong)."""
    whole = _whole(cu_q, cu_k)
    payload = sum(array.nbytes for array in tensors.values())
    batch = len(cu_q) - 1
    if (not splittable or payload < PIPELINE_MIN_BYTES or batch < 2 or len(cu_k) != len(cu_q)
            or not _well_formed(tensors, cu_q, cu_k)):
        return [whole]
    count = int(min(MAX_CHUNKS, batch, max(2, payload // CHUNK_BYTES)))
    # Cut at the sequence boundaries nearest to equal shares of query and key tokens together.
    tokens = cu_q.astype(np.int64) + cu_k.astype(np.int64)
    targets = tokens[-1] * np.arange(1, count) / count
    cuts = np.unique(np.concatenate(([0], np.searchsorted(tokens, targets), [batch])))
    chunks = []
    for first, last in zip(cuts[:-1], cuts[1:]):
        q = cu_q[first:last + 1]
        k = cu_k[first:last + 1]
        chunks.append(Chunk(int(first), int(last), int(q[0]), int(q[-1]), int(k[0]), int(k[-1]),
                            (q - q[0]).astype(np.int32), (k - k[0]).astype(np.int32)))
    return chunks


def _well_formed(tensors: Dict[str, np.ndarray], cu_q: np.ndarray, cu_k: np.ndarray) -> bool:
    if cu_q[0] != 0 or cu_k[0] != 0 or np.any(np.diff(cu_q) < 0) or np.any(np.diff(cu_k) < 0):
        return False
    for name, array in tensors.items():
        if name in HEAD_MAJOR:
            if array.ndim != 2 or array.shape[1] != cu_q[-1]:
                return False
        elif name in QUERY_ROWS or name in KEY_ROWS:
            rows = cu_k[-1] if name in KEY_ROWS else cu_q[-1]
            if array.ndim < 1 or array.shape[0] != rows:
                return False
        else:
            return False
    return True


def chunk_shape(name: str, array: np.ndarray, chunk: Chunk) -> Sequence[int]:
    """The shape of `name`'s part in the chunk's call."""
    if name in HEAD_MAJOR:
        return (array.shape[0], chunk.q_stop - chunk.q_start)
    start, stop = chunk.rows(name)
    return (stop - start, *array.shape[1:])
