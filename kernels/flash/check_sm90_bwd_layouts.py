#!/usr/bin/env python3
"""CPU-side self-check of the Hopper backward's index maps (bwd_sm90_kernel.cuh), written while
no GPU was available: it emulates, in Python, what each thread of the kernel stores and reads
and asserts the properties the kernel relies on.
Run: python3 kernels/flash/check_sm90_bwd_layouts.py

  1. SwizzledOffset is a bijection of (row, 16-byte vector) onto the tile and equals wgmma's
     128-byte swizzle of the canonical K-major address (K, V, Q, dO tiles).
  2. The dS^T tile as stored by the threads (32-bit pairs from the S^T accumulator layout) is
     exactly what the MN-major A descriptor of dQ = dS K reads for every (query, key), and K
     read through the MN-major B descriptor (N = 32 or 64 columns from column c0) is K, for
     the dQ split by head-dim halves.
  3. The accumulator layout of wgmma (m64nN) packed as the kernel packs P^T / dS^T is the
     register A fragment layout of wgmma m64k16 (RS), per k16 step.
  4. The dQ reductions (v2 adds straight from the accumulators) cover every element of each
     warpgroup's dQ product exactly once, with the right value.
  5. The epilogue copy-out: each warp reads back exactly the 16 rows it wrote.
  6. Masking: the per-warp decision never skips a tile that has an element to hide, and the
     element-wise bounds hide exactly the (key, query) pairs the contract hides; the query-tile
     range of a key block holds every row that sees one of its keys.
  7. The walk over a key block's query tiles (FirstTile / Next, rotated when no mask cuts the
     block's range) visits every (query head, tile) of the range once; the first blocks of a
     head start on different tiles at both start strides.
  8. The wide kernel (bwd_sm90_wide_kernel.cuh, head dims 192 / 256, 64 keys per CTA): the flat
     cp.async loader of the 128 producer threads (head dim 192) covers every vector of a tile
     once; the exchange tile hands consumer 1's thread t the G of exactly the elements its dP^T
     holds; consumer 1's dS^T tile is what the dQ descriptors read, in both dS^T buffers (one
     per tile parity, the second kDsBytes after the first), K read through the B descriptors of
     the two dQ products of each consumer (DqColA / DqColB, N = 64 and 32 or 64) is K, and
     those products cover the head dim once; the dQ reductions, epilogue and masks of 4 warps x
     16 keys.
"""

import math
import random

BLOCK_N = 128


def swizzled_offset(rows, row, vec):
    return (vec // 8) * (rows * 128) + row * 128 + (((vec % 8) ^ (row % 8)) * 16)


def hw_swizzle(addr):
    """wgmma's 128-byte swizzle: address bits [4:6] ^= bits [7:9] (tiles 1024-byte aligned)."""
    return addr ^ (((addr >> 7) & 7) << 4)


def check_tiles():
    for rows, d in ((128, 64), (128, 128), (64, 64), (64, 128), (64, 192), (64, 256)):
        vecs = d // 8
        seen = set()
        for r in range(rows):
            for v in range(vecs):
                off = swizzled_offset(rows, r, v)
                assert off % 16 == 0 and 0 <= off < rows * d * 2
                seen.add(off)
                # K-major canonical layout: head-dim block v // 8 of rows * 128 bytes, row r at
                # r * 128 (8-row groups 1024 apart), then the hardware swizzle.
                canonical = (v // 8) * rows * 128 + r * 128 + (v % 8) * 16
                assert hw_swizzle(canonical) == off
        assert len(seen) == rows * vecs


def accumulator_coords(t, i):
    """wgmma m64nN fp32 accumulator register i (= 4 * tile + e) of thread t of the warpgroup."""
    warp, lane = t // 32, t % 32
    row = 16 * warp + lane // 4 + 8 * ((i % 4) // 2)
    col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    return row, col


def a_fragment_coords(t, reg, half):
    """wgmma m64k16 register A fragment: 32-bit register reg (0..3), 16-bit half of thread t."""
    warp, lane = t // 32, t % 32
    row = 16 * warp + lane // 4 + 8 * (reg % 2)
    col = 2 * (lane % 4) + half + 8 * (reg // 2)
    return row, col


def check_fragments(block_m):
    s_tiles = block_m // 8
    for t in range(128):
        for nt in range(s_tiles):
            for h in range(2):
                # The kernel: p[nt / 2][(nt % 2) * 2 + h] = pack(s[nt][2h], s[nt][2h + 1]).
                kk, reg = nt // 2, (nt % 2) * 2 + h
                for half in range(2):
                    acc = accumulator_coords(t, 4 * nt + 2 * h + half)
                    frag = a_fragment_coords(t, reg, half)
                    assert acc == (frag[0], frag[1] + 16 * kk), (t, nt, h, half)


def check_ds_tile_and_dq_operands(head_dim, block_m):
    # Stores: thread t of warpgroup wg writes the pair (key, query 8 nt + 2 (t % 4) + {0, 1}) at
    # SwizzledOffset<128>(key, nt) + (t % 4) * 4, key = 64 wg + 16 warp + group + 8 h.
    memory = {}
    for wg in range(2):
        for t in range(128):
            for nt in range(block_m // 8):
                for h in range(2):
                    row, col = accumulator_coords(t, 4 * nt + 2 * h)
                    key = 64 * wg + row
                    assert col == 8 * nt + 2 * (t % 4)
                    base = swizzled_offset(BLOCK_N, key, nt) + (t % 4) * 4
                    for half in range(2):
                        addr = base + 2 * half
                        assert addr not in memory
                        memory[addr] = (key, col + half)
    assert len(memory) == BLOCK_N * block_m
    # dQ = dS K per warpgroup: A = dS (M = the 64 queries, K = keys), MN-major, start
    # ds + key_rows + kk * 16 * 128, SBO = 1024; B = K (K = keys, N = dq_cols head-dim columns
    # from col0), MN-major. Split by head-dim halves (all 128 keys).
    assert block_m == 64
    for wg in range(2):
        key0, steps, dq_cols, col0 = 0, BLOCK_N // 16, head_dim // 2, wg * head_dim // 2
        key_rows = key0 * 128
        for kk in range(steps):
            start = key_rows + kk * 16 * 128
            for m in range(64):
                for k in range(16):
                    canonical = start + (k // 8) * 1024 + (k % 8) * 128 + m * 2
                    assert memory[hw_swizzle(canonical)] == (key0 + kk * 16 + k, m)
        k_cols = key_rows + (col0 // 64) * BLOCK_N * 128 + (col0 % 64) * 2
        for kk in range(steps):
            start = k_cols + kk * 16 * 128
            for n in range(dq_cols):
                for k in range(16):
                    canonical = start + (n // 64) * BLOCK_N * 128 + (k // 8) * 1024 + \
                        (k % 8) * 128 + (n % 64) * 2
                    key, col = key0 + kk * 16 + k, col0 + n
                    stored = swizzled_offset(BLOCK_N, key, col // 8) + (col % 8) * 2
                    assert hw_swizzle(canonical) == stored, (wg, kk, n, k)


def check_epilogue(head_dim, warps=8):
    row_vecs = head_dim // 8
    for warp in range(warps):
        reads = set()
        for lane in range(32):
            for i in range(16 * row_vecs // 32):
                idx = i * 32 + lane
                reads.add((warp * 16 + idx // row_vecs, idx % row_vecs))
        writes = set()
        for lane in range(32):
            for h in range(2):
                for nt in range(row_vecs):
                    writes.add((warp * 16 + lane // 4 + 8 * h, nt))
        assert reads == writes and len(reads) == 16 * row_vecs


def check_flat_loader(rows, row_vecs, threads):
    """LoadSwizzledFlatAsync (bwd_sm90_block.cuh): thread tid computes the address of vector
    tid + threads p (p < period) of the row-major order and steps it by period_rows rows (a
    whole number of swizzle periods: plain byte steps); that is the vector of the flat order
    tid + threads (p + period r), and the copies cover every vector of the tile once."""
    gcd = math.gcd(threads, row_vecs)
    period, period_rows = row_vecs // gcd, threads // gcd
    assert rows % period_rows == 0 and period_rows % 8 == 0
    seen = set()
    for tid in range(threads):
        for p in range(period):
            idx = tid + threads * p
            row, vec = idx // row_vecs, idx % row_vecs
            for r in range(rows // period_rows):
                off = swizzled_offset(rows, row, vec) + r * period_rows * 128
                flat = idx + threads * period * r
                assert off == swizzled_offset(rows, flat // row_vecs, flat % row_vecs)
                assert off not in seen
                seen.add(off)
    assert len(seen) == rows * row_vecs


def wide_dq_cols(wg):
    """BwdSm90WideTraits::DqColA / DqColB with their N (head dim 192, the fused dQ)."""
    return [(wg * 128, 64), (64 + wg * 32, 32)]


def check_wide(head_dim):
    block_n, block_m, row_vecs = 64, 64, head_dim // 8
    if head_dim == 192:
        check_flat_loader(block_n, row_vecs, threads=128)
    # Exchange: warpgroup 0's thread t stores s[nt][0..3] at (nt * 128 + t) * 16; warpgroup 1's
    # thread t reads the same address for dp[nt][0..3]; the accumulator layouts agree.
    exchange = {}
    for t in range(128):
        for nt in range(block_m // 8):
            for e in range(4):
                exchange[(nt * 128 + t) * 16 + 4 * e] = accumulator_coords(t, 4 * nt + e)
    assert len(exchange) == 128 * block_m // 8 * 4
    for t in range(128):
        for nt in range(block_m // 8):
            for e in range(4):
                assert exchange[(nt * 128 + t) * 16 + 4 * e] == accumulator_coords(t, 4 * nt + e)
    if head_dim == 192:  # the fused dQ (at 256 the dQ kernel computes it)
        check_wide_dq(block_n, block_m, head_dim)
    check_epilogue(head_dim, warps=4)
    check_masks(block_m, block_n=block_n, warps=4)


def check_wide_dq(block_n, block_m, head_dim):
    # dS^T tile: warpgroup 1 alone writes all 64 keys, SwizzledOffset<64>(key, nt), from the
    # start of its buffer (offsets from the first buffer; both 1024-byte aligned).
    ds_bytes = block_n * block_m * 2
    memory = {}
    for ds in (0, ds_bytes):
        for t in range(128):
            for nt in range(block_m // 8):
                for h in range(2):
                    key, col = accumulator_coords(t, 4 * nt + 2 * h)
                    base = ds + swizzled_offset(block_n, key, nt) + (t % 4) * 4
                    for half in range(2):
                        assert base + 2 * half not in memory
                        memory[base + 2 * half] = (ds, key, col + half)
    assert len(memory) == 2 * block_n * block_m
    covered = []
    for wg in range(2):
        for col0, n_cols in wide_dq_cols(wg):
            assert n_cols in (32, 64) and col0 % 64 + n_cols <= 64  # ends inside its block
            covered += range(col0, col0 + n_cols)
            for kk in range(block_n // 16):
                for ds in (0, ds_bytes):
                    start = ds + kk * 16 * 128
                    for m in range(64):
                        for k in range(16):
                            canonical = start + (k // 8) * 1024 + (k % 8) * 128 + m * 2
                            assert memory[hw_swizzle(canonical)] == (ds, kk * 16 + k, m)
                start = (col0 // 64) * block_n * 128 + (col0 % 64) * 2 + kk * 16 * 128
                for n in range(n_cols):
                    for k in range(16):
                        canonical = start + (n // 64) * block_n * 128 + (k // 8) * 1024 + \
                            (k % 8) * 128 + (n % 64) * 2
                        key, col = kk * 16 + k, col0 + n
                        stored = swizzled_offset(block_n, key, col // 8) + (col % 8) * 2
                        assert hw_swizzle(canonical) == stored, (wg, col0, kk, n, k)
    assert sorted(covered) == list(range(head_dim))


def visible(i, j, len_q, len_k, wl, wr):
    d = i + len_k - len_q
    return j < len_k and d - wl <= j <= d + wr


def check_masks(block_m, trials=40, block_n=BLOCK_N, warps=8):
    rng = random.Random(1)
    unbounded = 1 << 29
    for _ in range(trials):
        len_q, len_k = rng.randint(1, 200), rng.randint(1, 200)
        kind = rng.choice(("none", "causal", "window", "left"))
        wl, wr = unbounded, unbounded
        if kind == "causal":
            wr = 0
        elif kind == "window":
            wl, wr = rng.randint(0, 80), rng.randint(0, 80)
        elif kind == "left":
            wl, wr = rng.randint(0, 80), 0
        offset = len_k - len_q
        for key_first in range(0, len_k, block_n):
            key_last = min(len_k, key_first + block_n) - 1
            row_first = max(0, key_first - wr - offset)
            row_last = min(len_q - 1, key_last + wl - offset)
            m_begin = row_first // block_m
            m_count = 0 if row_first > row_last else row_last // block_m - m_begin + 1
            tiles = set(range(m_begin, m_begin + m_count))
            for i in range(len_q):
                if any(visible(i, j, len_q, len_k, wl, wr)
                       for j in range(key_first, key_last + 1)):
                    assert i // block_m in tiles
            for m in tiles:
                row0 = m * block_m
                for wk in range(warps):
                    warp_key_first = key_first + 16 * wk
                    masked_tile = (warp_key_first + 16 > len_k or
                                   warp_key_first + 15 > row0 + offset + wr or
                                   warp_key_first < row0 + block_m - 1 + offset - wl)
                    for key in range(warp_key_first, warp_key_first + 16):
                        for c in range(block_m):
                            i = row0 + c
                            if i >= len_q:
                                continue  # zero Q, dO, lse, D: contributes nothing
                            vis = visible(i, key, len_q, len_k, wl, wr)
                            if not masked_tile:
                                assert vis
                                continue
                            base = row0 + 2 * (c % 8 // 2)
                            e = c % 2
                            nt = c // 8
                            lo = key - offset - wr - base
                            hi = key - offset + wl - base if key < len_k else -1
                            col = nt * 8 + e
                            assert (col < lo or col > hi) == (not vis), (key, i)


def start_tile(n_block, m_count, stride):
    """The rotated first tile of an unmasked key block (BwdSm90Block's constructor)."""
    lead = n_block * stride
    next_lap_shifts = stride > 1 and m_count % stride == 0
    return (lead + (lead // m_count if next_lap_shifts else 0)) % m_count


def check_start_tiles():
    """The first m_count key blocks of a head start on m_count different tiles, at both
    kStartTileStride values (1: the hdim-64/128 kernel, 2: the wide kernel)."""
    for stride in (1, 2):
        for m_count in range(1, 300):
            starts = [start_tile(n, m_count, stride) for n in range(m_count)]
            assert sorted(starts) == list(range(m_count)), (stride, m_count)


def check_tile_walk(block_m=64, trials=2000):
    """FirstTile / Next (bwd_sm90_block.cuh): from the key block's first tile (rotated by n_block
    when the block sees every query row), iters = tiles x group steps visit every (query head,
    tile) of the block's range exactly once."""
    rng = random.Random(3)
    for _ in range(trials):
        len_q = rng.randint(1, 2000)
        tiles_total = (len_q + block_m - 1) // block_m
        m_begin = rng.choice([0, rng.randint(0, tiles_total - 1)])
        m_count = rng.randint(1, tiles_total - m_begin)
        group, kv_head, n_block = rng.randint(1, 4), rng.randint(0, 3), rng.randint(0, 300)
        all_rows = m_begin == 0 and m_count * block_m >= len_q
        stride = rng.choice([1, 2])
        first = (m_begin + (start_tile(n_block, m_count, stride) if all_rows else 0)) * block_m
        head, row0 = kv_head * group, first
        seen = set()
        for _ in range(m_count * group):
            seen.add((head, row0))
            row0 += block_m
            if row0 == (m_begin + m_count) * block_m:
                row0 = m_begin * block_m
            if row0 == first:
                head += 1
        want = {(kv_head * group + g, (m_begin + t) * block_m)
                for g in range(group) for t in range(m_count)}
        assert seen == want, (len_q, m_begin, m_count, group, n_block, stride)


def main():
    check_tiles()
    check_start_tiles()
    check_tile_walk()
    check_fragments(64)
    for head_dim in (64, 128):
        check_ds_tile_and_dq_operands(head_dim, 64)
    check_epilogue(64)
    check_epilogue(128)
    check_masks(64)
    for head_dim in (192, 256):
        check_wide(head_dim)
    print("sm90 backward layouts: all checks passed")


if __name__ == "__main__":
    main()
