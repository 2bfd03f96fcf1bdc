"""The order a forward's payload chunks go in, so the server can start computing early.

The server runs a large multi-sequence forward by groups of consecutive sequences, each as soon
as every chunk overlapping its q, k and v rows has arrived (data_channel.proto, "Groups"). Sent
in payload order (q, then k, then v) group 0 would be complete only after most of the payload;
sent group by group it is complete after about a quarter. The split is the server's, computed
here from the same rule: it must stay equal to GroupEnds in
server/transport/data/group_tracker.cc.
"""
from typing import List, Sequence

MIN_GROUPED_PAYLOAD_BYTES = 16 << 20
MAX_GROUPS = 4


def group_ends(cu_seqlens_q: Sequence[int], cu_seqlens_k: Sequence[int],
               payload_bytes: int) -> List[int]:
    """Each group's end sequence index (up to MAX_GROUPS runs of consecutive sequences of about
    equal q + k tokens); empty when the server runs the forward whole (one sequence, or a
    payload under MIN_GROUPED_PAYLOAD_BYTES)."""
    batch = len(cu_seqlens_q) - 1
    if payload_bytes < MIN_GROUPED_PAYLOAD_BYTES or batch < 2:
        return []
    groups = min(MAX_GROUPS, batch)
    tokens = cu_seqlens_q[batch] + cu_seqlens_k[batch]
    ends: List[int] = []
    b = 1
    for g in range(1, groups):
        target = tokens * g // groups
        while b < batch and cu_seqlens_q[b] + cu_seqlens_k[b] < target:
            b += 1
        if b < batch and (not ends or b > ends[-1]):
            ends.append(b)
    ends.append(batch)
    return ends if len(ends) >= 2 else []


def chunk_offsets(cu_seqlens_q: Sequence[int], cu_seqlens_k: Sequence[int],
                  row_bytes: Sequence[int], payload_bytes: int, chunk_bytes: int) -> List[int]:
    """The offsets of a forward's chunks in the order to send them: for each group in turn, the
    chunks overlapping its q, k and v rows not sent yet; plain payload order when the forward
    is not grouped. `row_bytes`: the bytes of one row of q, k and v (laid end to end in the
    payload)."""
    count = (payload_bytes + chunk_bytes - 1) // chunk_bytes
    ends = group_ends(cu_seqlens_q, cu_seqlens_k, payload_bytes)
    if not ends:
        return [i * chunk_bytes for i in range(count)]
    starts = [0, row_bytes[0] * cu_seqlens_q[-1]]
    starts.append(starts[1] + row_bytes[1] * cu_seqlens_k[-1])
    cus = (cu_seqlens_q, cu_seqlens_k, cu_seqlens_k)
    order: List[int] = []
    taken = [False] * count
    first = 0
    for end in ends:
        for tensor in range(3):
            cu, row = cus[tensor], row_bytes[tensor]
            begin, stop = starts[tensor] + cu[first] * row, starts[tensor] + cu[end] * row
            if stop <= begin:
                continue
            for c in range(begin // chunk_bytes, (stop - 1) // chunk_bytes + 1):
                if not taken[c]:
                    taken[c] = True
                    order.append(c * chunk_bytes)
        first = end
    # Bytes outside every group's rows (none for a valid request) still go, last.
    order += [c * chunk_bytes for c in range(count) if not taken[c]]
    return order
