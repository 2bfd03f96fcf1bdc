#!/usr/bin/env python3
"""CPU check of the forward's key-tile ranges (fwd_block.cuh): LocateBlock's rows and
[n_begin, n_end) for a query block, with the blocks laid from the sequence's start (the partial
block last) and from its end (the Hopper forward at 64, and at 256 with one CTA per block:
Sm90ForwardBlocksFromEnd), and BlockRowsKeyTiles' for a consumer warpgroup's 64 rows of it (the
Hopper forward at head dim 64, Sm90ForwardWarpgroupKeys), emulated in integers as the kernel
computes them.

Over many sequence lengths, windows (causal, sliding, none) and the Hopper tiles, checks that
- the blocks hold every row of the sequence once;
- every key a row sees lies in a tile of its block's range and of its warpgroup's range;
- every tile of a warpgroup's range holds a key one of its rows sees, so passing over the
  others drops no work that matters and keeps none that does not (the first and last tile of
  the block's range likewise);
- a warpgroup's range lies inside its block's, and is empty where its rows lie past the
  sequence or see no key;
and counts the warpgroup tiles computed with and without the per-warpgroup ranges on the
anchor rows that tuning.h quotes (32x512 at head dim 64), and the rounds of key tiles (a
block's most tiles of one warpgroup, summed over the blocks) of both layouts on the causal ones.
"""

UNBOUNDED = 1 << 29  # kUnboundedWindow (kernels/gpu_attention_args.h)


def rows_key_tiles(block_n, window_left, window_right, first_diagonal, last_diagonal, len_k):
    """RowsKeyTiles: (n_begin, n_end)."""
    key_end = min(len_k, last_diagonal + window_right + 1)
    key_begin = max(0, first_diagonal - window_left)
    return min(key_begin, len_k) // block_n, 0 if key_end <= 0 else -(-key_end // block_n)


def locate_block(block_m, block_n, window, m_block, len_q, len_k, from_end):
    """LocateBlock's row and tile range: (row_first, rows_valid, diagonal, n_begin, n_end)."""
    before = (block_m - len_q % block_m) % block_m if from_end else 0
    row_first = max(0, m_block * block_m - before)
    rows_valid = min((m_block + 1) * block_m - before, len_q) - row_first
    diagonal = row_first + len_k - len_q
    n_begin, n_end = rows_key_tiles(block_n, *window, diagonal, diagonal + rows_valid - 1, len_k)
    return row_first, rows_valid, diagonal, n_begin, n_end


def block_rows_key_tiles(block_n, window, block, first_row, rows, len_k):
    """BlockRowsKeyTiles."""
    _, rows_valid, diagonal, block_begin, block_end = block
    last_row = min(first_row + rows, rows_valid) - 1
    if last_row < first_row:
        return block_end, block_end
    n_begin, n_end = rows_key_tiles(block_n, *window, diagonal + first_row, diagonal + last_row,
                                    len_k)
    n_end = max(block_begin, min(n_end, block_end))
    return min(max(n_begin, block_begin), n_end), n_end


def seen_keys(row, len_q, len_k, window):
    """The keys row `row` of the sequence sees (bottom-right aligned, FlashAttention's)."""
    window_left, window_right = window
    diagonal = row + len_k - len_q
    return range(max(0, diagonal - window_left), min(len_k, diagonal + window_right + 1))


def tiles_of(keys, block_n):
    return set(range(keys.start // block_n, (keys.stop - 1) // block_n + 1)) if keys else set()


def check_sequence(block_m, block_n, window, len_q, len_k, from_end=False):
    """Checks every block and warpgroup of one sequence; returns the warpgroup tiles computed
    (whole block range per warpgroup, own range per warpgroup) and the rounds (per block the
    most tiles of one of its warpgroups, summed)."""
    whole = own_total = rounds = 0
    rows = []
    for m_block in range(-(-len_q // block_m)):
        block = locate_block(block_m, block_n, window, m_block, len_q, len_k, from_end)
        row_first, rows_valid, _, n_begin, n_end = block
        assert 0 < rows_valid <= block_m, f"block {m_block} holds {rows_valid} rows"
        rows += range(row_first, row_first + rows_valid)
        block_tiles = set()
        most = 0
        for wg in range(block_m // 64):
            wg_begin, wg_end = block_rows_key_tiles(block_n, window, block, wg * 64, 64, len_k)
            assert n_begin <= wg_begin <= wg_end <= n_end or n_begin >= n_end, (
                f"warpgroup range {wg_begin, wg_end} outside the block's {n_begin, n_end}")
            seen = set()
            for row in range(row_first + wg * 64, row_first + min(wg * 64 + 64, rows_valid)):
                seen |= tiles_of(seen_keys(row, len_q, len_k, window), block_n)
            own = set(range(wg_begin, wg_end))
            assert seen <= own, f"rows see tiles {sorted(seen - own)} outside {wg_begin, wg_end}"
            assert own <= seen, f"tiles {sorted(own - seen)} in {wg_begin, wg_end} seen by no row"
            block_tiles |= seen
            if n_begin < n_end:
                whole += n_end - n_begin
                own_total += wg_end - wg_begin
                most = max(most, wg_end - wg_begin)
        rounds += most
        if block_tiles:
            assert (n_begin, n_end) == (min(block_tiles), max(block_tiles) + 1), (
                f"block range {n_begin, n_end} for tiles {min(block_tiles)}..{max(block_tiles)}")
        else:
            assert n_begin >= n_end, f"a block that sees no key has tiles {n_begin, n_end}"
    assert rows == list(range(len_q)), "the blocks hold every row once"
    return whole, own_total, rounds


# The Hopper forward's tiles (tile_config.h): (rows, keys per tile) at 64, 128, 256 (one CTA
# per block and persistent).
TILES = ((192, 128), (128, 128), (128, 80), (128, 64))
WINDOWS = ((UNBOUNDED, UNBOUNDED), (UNBOUNDED, 0), (0, 0), (5, 0), (100, 37), (0, 200),
           (130, 130), (UNBOUNDED, 63), (64, UNBOUNDED))
LENGTHS = (1, 7, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 300, 512, 700, 1000)


def main():
    for block_m, block_n in TILES:
        for window in WINDOWS:
            for len_q in LENGTHS:
                for len_k in LENGTHS:
                    for from_end in (False, True):
                        check_sequence(block_m, block_n, window, len_q, len_k, from_end)
    # tuning.h's counts: head dim 64, 32x512, per (head, sequence).
    assert check_sequence(192, 128, (UNBOUNDED, 0), 512, 512) == (27, 20, 9)
    assert check_sequence(192, 128, (UNBOUNDED, UNBOUNDED), 512, 512) == (36, 32, 12)
    # tile_config.h's Sm90ForwardBlocksFromEnd: the causal rounds at 64 from the end.
    assert check_sequence(192, 128, (UNBOUNDED, 0), 512, 512, True) == (24, 20, 8)
    assert check_sequence(192, 128, (UNBOUNDED, 0), 2048, 2048) == (303, 272, 101)
    assert check_sequence(192, 128, (UNBOUNDED, 0), 2048, 2048, True) == (288, 272, 96)
    print("forward key-tile ranges: all checks passed")


if __name__ == "__main__":
    main()
