"""The order a call's payload chunks go in, so the server can start computing early.

The server runs a large multi-sequence call by groups of consecutive sequences, each as soon
as every chunk overlapping its bytes has arrived (data_channel.proto, "Groups"): its rows of
q, k and v for a forward; of dout, q, k, v and out for a backward, whose first group also takes
all of lse. Sent in payload order (q, then k, then v) group 0 would be complete only after most
of the payload; sent group by group it is complete after about a quarter. The split is the
server's, computed here from the same rule: it must stay equal to GroupEnds and GroupRanges in
common/data_channel_wire.h.
"""
from typing import List, Sequence, Tuple

# Which rows of a payload tensor a group needs.
QUERY_ROWS = "query"       # q, out, dout
KEY_ROWS = "key"           # k, v
ALL_WITH_FIRST = "all"     # a backward's lse: all of it, with the first group

FORWARD_ROWS = (QUERY_ROWS, KEY_ROWS, KEY_ROWS)
BACKWARD_ROWS = (QUERY_ROWS, QUERY_ROWS, KEY_ROWS, KEY_ROWS, QUERY_ROWS, ALL_WITH_FIRST)

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
                  tensors: Sequence[Tuple[int, str]], payload_bytes: int,
                  chunk_bytes: int) -> List[int]:
    """The offsets of a call's chunks in the order to send them: for each group in turn, the
    chunks overlapping its bytes not sent yet (tensor by tensor); plain payload order when the
    call is not grouped. `tensors`: for each tensor laid end to end in the payload, its bytes
    and which of its rows a group needs (QUERY_ROWS, KEY_ROWS or ALL_WITH_FIRST)."""
    count = (payload_bytes + chunk_bytes - 1) // chunk_bytes
    ends = group_ends(cu_seqlens_q, cu_seqlens_k, payload_bytes)
    if not ends:
        return [i * chunk_bytes for i in range(count)]
    starts, start = [], 0
    for nbytes, _ in tensors:
        starts.append(start)
        start += nbytes
    order: List[int] = []
    taken = [False] * count
    first = 0
    for group, end in enumerate(ends):
        for (nbytes, rows), tensor_start in zip(tensors, starts):
            if rows == ALL_WITH_FIRST:
                begin, stop = tensor_start, tensor_start + (nbytes if group == 0 else 0)
            else:
                cu = cu_seqlens_q if rows == QUERY_ROWS else cu_seqlens_k
                row = nbytes // cu[-1] if cu[-1] else 0
                begin, stop = tensor_start + cu[first] * row, tensor_start + cu[end] * row
            for c in range(begin // chunk_bytes, (stop - 1) // chunk_bytes + 1):
                if stop > begin and c < count and not taken[c]:
                    taken[c] = True
                    order.append(c * chunk_bytes)
        first = end
    # Bytes outside every group's rows (none for a valid request) still go, last.
    order += [c * chunk_bytes for c in range(count) if not taken[c]]
    return order
