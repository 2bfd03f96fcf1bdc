#!/usr/bin/env python3
"""CPU check of the warp-specialized Hopper kernels' synchronization: the forward
(fwd_sm90_ring.cuh, fwd_sm90_kernel.cuh; one CTA per query block, and persistent CTAs running
several blocks with Q slots and the K/V ring's tile numbers running on) and the backward dK/dV
kernels at head dims 64/128 (bwd_sm90_kernel.cuh) and 192/256 (bwd_sm90_wide_kernel.cuh), all on
sm90_stage_barriers.cuh.

The producer warpgroup and the consumer warpgroups run the kernel's sequence of barrier
operations, copies and wgmma reads as coroutines under many random schedules. Checked in the
forward:
- every wgmma reads a stage that holds the tile it expects, landed, and not overwritten before
  the read completes (the producer waits for the stage's empty barrier); likewise Q, read by the
  S GEMMs and the epilogue, in its slot (the producer waits for the slot's empty barrier, only
  after publishing the previous block's last V tile, which the slot's release waits on);
- mbarrier parity waits never alias: a waiter is never a whole phase behind (the parity would
  then read as not completed, or as completed a phase early);
- the ping-pong turns alternate strictly, from block to block of a persistent CTA (no bar.arrive
  lands on a barrier phase that already holds one, which would complete it without its owner)
  and none is left pending at exit;
- nothing deadlocks;
and all of that also where a consumer passes over key tiles none of its rows see (before and
after its own, or all of a block's), taking its turns and releasing their stages once landed.
The same with the TMA producer (head dim 256): full barriers of one arrival that
also wait for their tile's bytes, Q's bytes on its block's first K tile's barrier, copies
landing in any order, and partial tiles by cp.async, landed before the arrival. The cp.async
producer also with block notices (the persistent forward at 64 and 128: tile_config.h's
Sm90ForwardBlockNotices): every consumer reads each block's notice, and the end notice after the
last, as written for it, never a stale one or the next block's, and the end notice's arrival
aliases no parity.
In the backward at head dims 64/128 (with dQ; the deterministic mode's kernel without dQ runs
the same stage protocol less the dS^T buffers and the barrier before dQ): every consumer reads
a stage that holds its tile, landed and not overwritten; no consumer writes its dS^T rows into
a buffer whose dQ product the other consumer still reads (two buffers by tile parity, the
consumers' barrier before dQ bounding their drift); the epilogue overwrites K only after both
consumers' last dQ; nothing deadlocks.
The persistent dK/dV kernel at 64 (Sm90BackwardRunsPersistent): a CTA's blocks of random tile
counts (some without tiles, which touch no K/V buffer), tile numbers running on across blocks:
the same rules, and each block reads K and V from its buffer only once they landed, the producer
refills a buffer only after both consumers' epilogue of its previous block released it, and no
epilogue's buffer is refilled under it.
In the backward at head dims 192/256 (bwd_sm90_wide_kernel.cuh: the same producer, consumer 0
for S^T, P^T, dV and consumer 1 for dP^T, dS^T, dK, each issuing the previous tile's dQ, which
at 256 and in the deterministic mode the dQ kernel computes instead, the same protocol less the
dQ steps): every stage read (wgmma, lse, D) sees its tile, landed and not overwritten before the
consumer releases the stage; mbarrier parities never alias; consumer 1 reads the exchange tile
G only once it holds the current tile's, and consumer 0 never overwrites a G that consumer 1 has
not read; barrier 1's arrive never lands twice in one phase, nor stays pending at exit; dS^T is
never written into a buffer that a dQ product still reads, and every dQ reads its tile's dS^T,
written and fenced; the epilogue overwrites K only after both consumers' last dQ, and V after
consumer 1's last dP^T; nothing deadlocks.
In the backward's dQ kernel (bwd_sm90_dq_kernel.cuh: the forward's producer with whole tiles
published, each consumer holding K(i - 1) for its dQ product while it waits for tile i): every
read sees its tile, landed and not overwritten before its release; nothing deadlocks.
A broken variant of each rule (--broken NAME) must fail; the script raises on the first problem.
"""
import argparse
import itertools
import random

PRODUCER_ARRIVALS = 1  # the 128 producer threads act alike: one arrival stands for them


class Deadlock(Exception):
    pass


class Mbarrier:
    """A phase completes once `count` arrivals are in and its transaction count (bytes that TMA
    copies signal, expected by mbarrier.expect_tx; here one unit per copy) is back to zero."""

    def __init__(self, count):
        self.count, self.pending, self.completed, self.tx = count, 0, 0, 0

    def arrive(self):
        self.pending += 1
        assert self.pending <= self.count
        self._complete()

    def expect_tx(self, units):
        self.tx += units

    def complete_tx(self, units):
        self.tx -= units
        self._complete()

    def _complete(self):
        if self.pending == self.count and self.tx == 0:
            self.pending, self.completed = 0, self.completed + 1

    def ready(self, use):
        """try_wait.parity(use & 1) for the use-th phase: true iff that phase completed."""
        assert self.completed in (use, use + 1), f"parity aliasing: use {use}, {self.completed} done"
        return (self.completed & 1) != (use & 1)


class TurnBarrier:
    """A named barrier of 256 threads: its owner warpgroup syncs, the previous one arrives."""

    def __init__(self):
        self.arrived = 0

    def arrive(self):
        assert self.arrived == 0, "second bar.arrive in one phase: completes without its owner"
        self.arrived = 1


class Ring:
    def __init__(self, stages, consumers, q_stages=1):
        self.stages, self.q_stages = stages, q_stages
        self.tma = []  # TMA copies issued and not landed: (buffer, stage, barrier)
        self.full_k = [Mbarrier(PRODUCER_ARRIVALS) for _ in range(stages)]
        self.full_v = [Mbarrier(PRODUCER_ARRIVALS) for _ in range(stages)]
        self.empty_k = [Mbarrier(consumers) for _ in range(stages)]
        self.empty_v = [Mbarrier(consumers) for _ in range(stages)]
        self.empty_q = [Mbarrier(consumers) for _ in range(q_stages)]
        # Stage and slot contents: (tile or block, landed); readers: consumers reading it now.
        self.k = [None] * stages
        self.v = [None] * stages
        self.q = [None] * q_stages
        self.k_readers = [set() for _ in range(stages)]
        self.v_readers = [set() for _ in range(stages)]
        self.q_readers = [set() for _ in range(q_stages)]
        self.notice = [None] * q_stages  # kBlockNotices: block number, or END


END = "end of the CTA's blocks"


BLOCKED = "blocked"  # what an agent yields while it waits, as opposed to making progress


def wait(barrier, use):
    while not barrier.ready(use):
        yield BLOCKED


def schedule(agents, seed, what):
    """Steps random agents until all finish; raises Deadlock when none can make progress."""
    rng = random.Random(seed)
    live = list(agents)
    blocked = 0
    while live:
        agent = rng.choice(live)
        try:
            blocked = blocked + 1 if next(agent) == BLOCKED else 0
        except StopIteration:
            live.remove(agent)
            blocked = 0
        if blocked > 200 * len(live):
            raise Deadlock(what)


def producer(ring, blocks, broken, whole_tiles=False, notices=False):
    """FwdSm90Producer: `blocks` holds each query block's key tile count, in the CTA's order
    (one entry: one CTA per block; 0: a block that sees no key, which the consumers skip).
    whole_tiles: the backward's dQ kernel (kWholeTiles), K(i) and V(i) published together once
    both landed, where the forward publishes V(i) only after issuing K(i + 1).
    notices: kBlockNotices, each block's notice written beside its Q slot and published by its
    first K tile's arrival; the end notice after the last block (write_end_notice)."""
    s, qs = ring.stages, ring.q_stages
    in_flight = []  # committed copy groups, oldest first: (buffer, stage)

    def issue(buf, readers, stage, what):
        assert not readers[stage], f"copy into a stage or slot a wgmma still reads ({what})"
        buf[stage] = (what, False)
        in_flight.append((buf, stage))

    def wait_groups(pending):
        while len(in_flight) > pending:
            buf, stage = in_flight.pop(0)
            buf[stage] = (buf[stage][0], True)

    next_tile = next_q = 0
    for tiles in (t for t in blocks if t > 0):
        for j in range(tiles):
            i = next_tile + j
            use = i // s
            if j == 0 and next_q >= qs and broken == "q-wait-before-v":
                yield from wait(ring.empty_q[next_q % qs], next_q // qs - 1)
            if j == 0 and notices and broken == "notice-before-q-wait":
                ring.notice[next_q % qs] = next_q
            if i >= s and broken != "no-empty-wait":
                yield from wait(ring.empty_k[i % s], use - 1)
            issue(ring.k, ring.k_readers, i % s, i)
            yield
            if i > 0 and not whole_tiles:
                wait_groups(1)
                ring.full_v[(i - 1) % s].arrive()
            if j == 0:
                if next_q >= qs and broken not in ("no-q-empty-wait", "q-wait-before-v"):
                    yield from wait(ring.empty_q[next_q % qs], next_q // qs - 1)
                if notices and broken != "notice-before-q-wait":
                    ring.notice[next_q % qs] = next_q
                issue(ring.q, ring.q_readers, next_q % qs, f"Q of block {next_q}")
                yield
            if i >= s and broken != "no-empty-wait":
                yield from wait(ring.empty_v[i % s], use - 1)
            issue(ring.v, ring.v_readers, i % s, i)
            yield
            if whole_tiles:
                wait_groups(0)
                ring.full_k[i % s].arrive()
                ring.full_v[i % s].arrive()
            else:
                if broken != "early-full":  # broken: K(i) published while its copies may land
                    wait_groups(1)
                ring.full_k[i % s].arrive()
            yield
        next_tile += tiles
        next_q += 1
    wait_groups(0)
    if next_tile > 0 and not whole_tiles:
        ring.full_v[(next_tile - 1) % s].arrive()
    if notices:
        yield from write_end_notice(ring, next_q, next_tile, broken)


def write_end_notice(ring, q, i, broken):
    """FwdSm90Ring::WriteEndNotice and the arrival after it: the end notice in the slot and on
    the K stage that the CTA's next block (q, first key tile i) would have taken, once both are
    free."""
    s, qs = ring.stages, ring.q_stages
    if i >= s and broken != "end-notice-no-empty-wait":
        yield from wait(ring.empty_k[i % s], i // s - 1)
    if q >= qs:
        yield from wait(ring.empty_q[q % qs], q // qs - 1)
    ring.notice[q % qs] = END
    yield
    ring.full_k[i % s].arrive()


def tma_producer(ring, blocks, seed, broken):
    """FwdSm90TmaProducer: one thread issues each tile's TMA copies, the tile's bytes expected
    on its full barrier (count 1) before they are issued and its arrival after them; Q goes
    onto its block's first K tile's barrier. A partial tile (random here: the one holding a
    sequence's last key) goes by cp.async instead, waited for before the arrival."""
    s, qs = ring.stages, ring.q_stages
    rng = random.Random(seed * 31 + 5)
    in_flight = []

    def tma(buf, readers, stage, what, barrier):
        assert not readers[stage], f"TMA into a stage or slot a wgmma still reads ({what})"
        buf[stage] = (what, False)
        barrier.expect_tx(1)
        ring.tma.append((buf, stage, barrier))

    def cp_async(buf, readers, stage, what):
        assert not readers[stage], f"copy into a stage a wgmma still reads ({what})"
        buf[stage] = (what, False)
        in_flight.append((buf, stage))

    def land_copies():
        for buf, stage in in_flight:
            buf[stage] = (buf[stage][0], True)
        in_flight.clear()

    next_tile = next_q = 0
    for tiles in (t for t in blocks if t > 0):
        for j in range(tiles):
            i = next_tile + j
            partial = rng.random() < 0.3
            for kind, buf, readers, full, empty in (
                    ("K", ring.k, ring.k_readers, ring.full_k, ring.empty_k),
                    ("V", ring.v, ring.v_readers, ring.full_v, ring.empty_v)):
                if i >= s:
                    yield from wait(empty[i % s], i // s - 1)
                if partial:
                    cp_async(buf, readers, i % s, i)
                else:
                    tma(buf, readers, i % s, i, full[i % s])
                yield
                q_after_arrive = kind == "K" and j == 0 and broken == "tma-q-after-arrive"
                if kind == "K" and j == 0 and not q_after_arrive:
                    if next_q >= qs:
                        yield from wait(ring.empty_q[next_q % qs], next_q // qs - 1)
                    tma(ring.q, ring.q_readers, next_q % qs, f"Q of block {next_q}", full[i % s])
                    yield
                if partial and broken != "tma-partial-no-wait":
                    land_copies()  # cp.async.wait_group 0, the proxy fence, the producers' barrier
                full[i % s].arrive()
                yield
                land_copies()  # (broken: the copies land only after the arrival)
                if q_after_arrive:
                    if next_q >= qs:
                        yield from wait(ring.empty_q[next_q % qs], next_q // qs - 1)
                    tma(ring.q, ring.q_readers, next_q % qs, f"Q of block {next_q}", full[i % s])
        next_tile += tiles
        next_q += 1


def tma_engine(ring, producer_done, seed):
    """Lands the TMA copies in flight in random order, each completing its bytes on its
    barrier; runs until the producer is done and nothing is in flight."""
    rng = random.Random(seed * 7 + 1)
    while not (producer_done[0] and not ring.tma):
        if not ring.tma or rng.random() < 0.5:
            yield BLOCKED if not ring.tma else None
            continue
        buf, stage, barrier = ring.tma.pop(rng.randrange(len(ring.tma)))
        buf[stage] = (buf[stage][0], True)
        barrier.complete_tx(1)
        yield


def consumer(ring, blocks, own, wg, warpgroups, turns, pingpong, broken, notices=False):
    """FwdSm90BlockRunner over the CTA's blocks: Run, then the epilogue through the Q slot.
    own[b] is (front, back): how many of block b's key tiles this warpgroup passes over
    (PassOver: none of its rows sees them) before its own tiles and after them, in visit order;
    (0, 0) is the shipped kernel, which computes every tile of the block. notices: each block
    read from its notice once its first K tile is full (ForEachNoticedBlock), until the end
    notice."""
    s, qs = ring.stages, ring.q_stages

    def read(buf, readers, i):
        stage = i % s
        assert buf[stage] == (i, True), f"wg {wg} reads stage {stage} for tile {i}: {buf[stage]}"
        readers[stage].add(wg)

    def done(readers, empty, i):
        readers[i % s].discard(wg)
        empty[i % s].arrive()

    def holds_q(q):
        assert ring.q[q % qs] == (f"Q of block {q}", True), f"wg {wg}, block {q}: {ring.q[q % qs]}"

    def wait_turn():
        if pingpong:
            while not turns[wg].arrived:
                yield BLOCKED
            turns[wg].arrived = 0

    def pass_turn():
        if pingpong:
            turns[(wg + 1) % warpgroups].arrive()

    def take_turn():
        yield from wait_turn()
        pass_turn()

    def pass_over(i):
        if broken != "pass-over-no-turn":
            yield from take_turn()
        for full, empty in ((ring.full_k, ring.empty_k), (ring.full_v, ring.empty_v)):
            if broken != "pass-over-no-full-wait":
                yield from wait(full[i % s], i // s)
            empty[i % s].arrive()
            yield

    def release_q(q):
        ring.empty_q[q % qs].arrive()

    first = q = 0
    deferred_q = None  # broken "q-release-next-block": the slot released in the next block
    if pingpong and wg == warpgroups - 1 and broken != "no-first-turn":
        turns[0].arrive()                             # StartTurns

    def read_notice(expected):
        yield from wait(ring.full_k[first % s], first // s)
        notice = ring.notice[q % qs]
        assert notice == expected, f"wg {wg} reads notice {notice} for block {q} ({expected})"

    for tiles, (front, back) in zip((t for t in blocks if t > 0), own):
        if notices:
            yield from read_notice(q)
        if pingpong and wg == warpgroups - 1 and q > 0 and broken == "first-turn-per-block":
            turns[0].arrive()
        for j in range(front):
            yield from pass_over(first + j)
        for j in range(front, tiles - back):
            i = first + j
            yield from wait(ring.full_k[i % s], i // s)
            if j > front:
                yield from wait(ring.full_v[(i - 1) % s], (i - 1) // s)
            yield from wait_turn()
            holds_q(q)                                # S = Q K(i)^T issued
            ring.q_readers[q % qs].add(wg)
            read(ring.k, ring.k_readers, i)
            if j > front:
                read(ring.v, ring.v_readers, i - 1)   # O += P V(i - 1) issued
            pass_turn()
            yield                                     # the GEMMs run
            assert ring.k[i % s] == (i, True), f"K stage of tile {i} overwritten under its wgmma"
            holds_q(q)
            done(ring.k_readers, ring.empty_k, i)     # wgmma wait: S done
            yield                                     # softmax
            if deferred_q is not None:
                release_q(deferred_q)
                deferred_q = None
            if j > front:
                done(ring.v_readers, ring.empty_v, i - 1)
        if front < tiles - back:
            last = first + tiles - back - 1           # the last own tile's P V
            yield from wait(ring.full_v[last % s], last // s)
            read(ring.v, ring.v_readers, last)
            yield
            if broken == "no-last-v-release":
                ring.v_readers[last % s].discard(wg)
            else:
                done(ring.v_readers, ring.empty_v, last)
        for j in range(tiles - back, tiles):
            yield from pass_over(first + j)
        if deferred_q is not None:                    # no own tile in this block
            release_q(deferred_q)
            deferred_q = None
        holds_q(q)                                    # the epilogue: O through the Q slot
        yield
        holds_q(q)
        ring.q_readers[q % qs].discard(wg)
        if broken == "q-release-next-block":
            deferred_q = q
        else:
            release_q(q)
        first += tiles
        q += 1
    if notices:
        yield from read_notice(END)
    if wg == 0 and broken != "no-end-turn":
        yield from wait_turn()                        # EndTurns: the last pass taken


def own_tiles(blocks, warpgroups, seed, pass_over):
    """Per warpgroup and block that sees keys: (front, back), the tiles passed over; random
    when pass_over, including warpgroups that pass over every tile of a block."""
    rng = random.Random(seed * 7919 + 17)
    own = []
    for _ in range(warpgroups):
        ranges = []
        for tiles in (t for t in blocks if t > 0):
            front = rng.randint(0, tiles) if pass_over else 0
            back = rng.randint(0, tiles - front) if pass_over else 0
            ranges.append((front, back))
        own.append(ranges)
    return own


def run(blocks, stages, q_stages, warpgroups, pingpong, seed, broken=None, pass_over=False,
        tma=False, notices=False):
    ring = Ring(stages, warpgroups, q_stages)
    turns = [TurnBarrier() for _ in range(warpgroups)]
    own = own_tiles(blocks, warpgroups, seed, pass_over)
    if tma:
        producer_done = [False]

        def tma_producer_then_done():
            yield from tma_producer(ring, blocks, seed, broken)
            producer_done[0] = True

        agents = [tma_producer_then_done(), tma_engine(ring, producer_done, seed)]
    else:
        agents = [producer(ring, blocks, broken, notices=notices)]
    agents += [consumer(ring, blocks, own[wg], wg, warpgroups, turns, pingpong, broken, notices)
               for wg in range(warpgroups)]
    schedule(agents, seed, f"forward: blocks {blocks} stages {stages}/{q_stages} "
                           f"warpgroups {warpgroups} own tiles {own} notices {notices}")
    assert not any(t.arrived for t in turns), "a turn left pending at exit"


# One CTA per block (one entry), and persistent CTAs' block lists with keyless blocks (0).
FORWARD_BLOCKS = [[tiles] for tiles in range(1, 8)] + [
    [2, 1, 3], [1, 0, 2, 1], [3, 3], [1, 1, 1, 1, 1], [0, 2, 0, 1]]


def check(broken=None, seeds=60):
    for blocks in FORWARD_BLOCKS:
        for stages, q_stages in ((2, 1), (3, 1), (2, 2)):
            for warpgroups in (2, 3):
                for pingpong in (False, True):
                    for pass_over, tma, notices in itertools.product((False, True), repeat=3):
                        pass_over = pass_over or broken in BROKEN_PASS_OVER
                        tma = tma or broken in BROKEN_TMA
                        notices = notices or broken in BROKEN_NOTICES
                        if tma and notices:
                            continue  # (no notices with the TMA producer)
                        for seed in range(seeds):
                            run(blocks, stages, q_stages, warpgroups, pingpong, seed, broken,
                                pass_over, tma, notices)


def dq_consumer(ring, tiles, wg, broken):
    """BwdSm90DqRunner (bwd_sm90_dq_kernel.cuh): per key tile i, with K(i) and V(i) landed,
    S = Q K(i)^T, dP = dO V(i)^T and tile i-1's dQ += dS K(i-1) in flight together; V(i) is
    released once dP is complete, K(i-1) once its dQ product is; the last tile's dQ follows."""
    s = ring.stages

    def read(buf, readers, i):
        assert buf[i % s] == (i, True), f"wg {wg} reads stage {i % s} for tile {i}: {buf[i % s]}"
        readers[i % s].add(wg)

    def intact(buf, i, what):
        assert buf[i % s] == (i, True), f"{what} stage of tile {i} overwritten under its wgmma"

    def done(readers, empty, i):
        readers[i % s].discard(wg)
        empty[i % s].arrive()

    for i in range(tiles):
        yield from wait(ring.full_k[i % s], i // s)
        yield from wait(ring.full_v[i % s], i // s)
        assert ring.q[0] == ("Q of block 0", True), f"wg {wg}: Q and dO not landed"
        read(ring.k, ring.k_readers, i)
        read(ring.v, ring.v_readers, i)
        if broken == "dq-early-k-release":  # broken: K(i) released with V(i), as in the forward
            done(ring.k_readers, ring.empty_k, i)
        yield                                        # S, dP and dQ(i - 1) run
        intact(ring.v, i, "V")
        if i > 0:
            intact(ring.k, i - 1, "K (dQ)")
        done(ring.v_readers, ring.empty_v, i)
        if i > 0 and broken != "dq-early-k-release":
            done(ring.k_readers, ring.empty_k, i - 1)
        yield                                        # P, dS
    if tiles:
        yield                                        # the last tile's dQ
        intact(ring.k, tiles - 1, "K (dQ)")
        if broken != "dq-early-k-release":
            done(ring.k_readers, ring.empty_k, tiles - 1)


def run_dq(tiles, seed, broken=None):
    ring = Ring(2, 2)
    agents = [producer(ring, [tiles], broken, whole_tiles=broken != "dq-lazy-v")]
    agents += [dq_consumer(ring, tiles, wg, broken) for wg in range(2)]
    schedule(agents, seed, f"dQ kernel: tiles {tiles}")


def check_dq(broken=None, seeds=60):
    for tiles in range(1, 9):
        for seed in range(seeds):
            run_dq(tiles, seed, broken)


class NamedBarrier:
    """bar.sync among `count` agents: each generation completes when all have arrived."""

    def __init__(self, count):
        self.count, self.arrived, self.generation = count, 0, 0

    def sync(self):
        generation = self.generation
        self.arrived += 1
        if self.arrived == self.count:
            self.arrived, self.generation = 0, generation + 1
        while self.generation == generation:
            yield BLOCKED


def backward_producer(ring, tiles, broken):
    """Produce() of bwd_sm90_block.cuh, which both backward kernels share."""
    s = ring.stages
    for it in range(tiles):
        if it >= s and broken not in ("bwd-no-empty-wait", "wide-no-empty-wait"):
            yield from wait(ring.empty_k[it % s], it // s - 1)
        assert not ring.k_readers[it % s], f"copy into a stage a consumer still reads (tile {it})"
        ring.k[it % s] = (it, False)
        yield
        ring.k[it % s] = (it, True)  # cp.async.wait_group 0
        ring.full_k[it % s].arrive()
        yield


def backward_tile(ring, i, wg, ds, ds_readers, before_dq, keys, broken, block=None):
    """Query tile i (in load order) of consumer wg at head dims 64/128; `block` (persistent: its
    number and K/V buffer) must have landed in that buffer."""
    s = ring.stages
    buffers = 1 if broken == "bwd-one-ds-buffer" else 2
    yield from wait(ring.full_k[i % s], i // s)
    assert ring.k[i % s] == (i, True), f"wg {wg} reads stage {i % s} for tile {i}"
    if block is not None:
        n, b = block
        assert ring.kvs[b] == (n, True), f"wg {wg} reads K/V buffer {b}: {ring.kvs[b]}, block {n}"
        ring.kv_users[b].add(wg)
    ring.k_readers[i % s].add(wg)
    yield                                      # S^T, dP^T, dV issued
    buf = i % buffers
    assert not ds_readers[buf] - {wg}, f"wg {wg} writes dS^T buffer {buf} under a dQ"
    ds[buf][wg] = i
    yield
    if broken != "bwd-no-dq-barrier":
        yield from before_dq.sync()
    assert ds[buf] == [i, i], f"wg {wg}'s dQ of tile {i} reads dS^T {ds[buf]}"
    ds_readers[buf].add(wg)
    keys["readers"].add(wg)
    yield                                      # dQ = dS K runs
    assert ds[buf] == [i, i], f"dS^T buffer {buf} overwritten under wg {wg}'s dQ"
    ds_readers[buf].discard(wg)
    keys["readers"].discard(wg)
    ring.k_readers[i % s].discard(wg)
    ring.empty_k[i % s].arrive()               # every wgmma of the tile is complete


def backward_consumer(ring, tiles, wg, ds, ds_readers, before_dq, keys, broken):
    for it in range(tiles):
        yield from backward_tile(ring, it, wg, ds, ds_readers, before_dq, keys, broken)
    if broken != "bwd-no-epilogue-barrier":
        yield from before_dq.sync()
    assert not keys["readers"] - {wg}, f"wg {wg} overwrites K under the other's dQ"
    keys["written"] = True


def persistent_backward_producer(ring, blocks, broken):
    """Produce() of the persistent dK/dV kernel (T::kPersistent) over one CTA's blocks (their
    tile counts): tile numbers run on across blocks; a block with tiles takes the K/V buffers by
    turns, loading into one only once the consumers' epilogue of its previous block there
    released it, K and V landing with the block's first tile."""
    s = ring.stages
    first = used = 0
    for n, tiles in enumerate(blocks):
        if tiles == 0:
            continue
        b, turn = used % 2, used // 2
        if turn > 0 and broken != "persistent-no-kv-wait":
            yield from wait(ring.kv_empty[b], turn - 1)
        for it in range(tiles):
            i = first + it
            if i >= s:
                yield from wait(ring.empty_k[i % s], i // s - 1)
            assert not ring.k_readers[i % s], f"copy into a stage a consumer still reads ({i})"
            ring.k[i % s] = (i, False)
            if it == 0:
                assert not ring.kv_users[b], f"K/V of block {n} loaded into buffer {b} in use"
                ring.kvs[b] = (n, False)
            yield
            ring.k[i % s] = (i, True)              # cp.async.wait_group 0
            if it == 0:
                ring.kvs[b] = (n, True)
            ring.full_k[i % s].arrive()
            yield
        first += tiles
        used += 1


def persistent_backward_consumer(ring, blocks, wg, ds, ds_readers, before_dq, broken):
    """Run and Epilogue of consumer wg over the CTA's blocks: a block without tiles stores zeros
    straight (no K/V buffer); the others' epilogue stages dK / dV in the block's K/V buffer after
    the consumers' barrier and then releases the buffer."""
    first = used = 0
    for n, tiles in enumerate(blocks):
        if tiles == 0:
            yield
            continue
        b = used % 2
        keys = {"readers": set()}
        for it in range(tiles):
            yield from backward_tile(ring, first + it, wg, ds, ds_readers, before_dq, keys,
                                     broken, (n, b))
        yield from before_dq.sync()
        assert not keys["readers"] - {wg}, f"wg {wg} overwrites K under the other's dQ"
        if broken == "persistent-early-kv-release":
            ring.kv_users[b].discard(wg)
            ring.kv_empty[b].arrive()
        yield                                      # dK / dV staged in the buffer, stored
        assert ring.kvs[b] == (n, True), f"K/V buffer {b} refilled under block {n}'s epilogue"
        if broken != "persistent-early-kv-release":
            ring.kv_users[b].discard(wg)
            ring.kv_empty[b].arrive()
        first += tiles
        used += 1


def run_backward(tiles, stages, seed, broken=None):
    ring = Ring(stages, 2)
    ds = [[None, None], [None, None]]
    ds_readers = [set(), set()]
    before_dq = NamedBarrier(2)
    keys = {"readers": set(), "written": False}
    agents = [backward_producer(ring, tiles, broken)]
    agents += [backward_consumer(ring, tiles, wg, ds, ds_readers, before_dq, keys, broken)
               for wg in range(2)]
    schedule(agents, seed, f"backward: tiles {tiles} stages {stages}")


def check_backward(broken=None, seeds=60):
    for tiles in range(0, 8):
        for seed in range(seeds):
            run_backward(tiles, 2, seed, broken)


def run_persistent_backward(blocks, seed, broken=None):
    ring = Ring(2, 2)
    ring.kvs = [None, None]                    # each K/V buffer's block and whether it landed
    ring.kv_users = [set(), set()]             # consumers from a block's first read to release
    ring.kv_empty = [Mbarrier(2), Mbarrier(2)]
    ds = [[None, None], [None, None]]
    ds_readers = [set(), set()]
    before_dq = NamedBarrier(2)
    agents = [persistent_backward_producer(ring, blocks, broken)]
    agents += [persistent_backward_consumer(ring, blocks, wg, ds, ds_readers, before_dq, broken)
               for wg in range(2)]
    schedule(agents, seed, f"persistent backward: blocks {blocks}")


# A persistent CTA's blocks (query tiles of each; 0: a block no query tile sees).
PERSISTENT_BLOCKS = [[1], [3, 2], [1, 1, 1, 1], [2, 0, 3, 1], [0, 0, 2], [4, 1, 0, 2, 3],
                     [1, 2, 1, 2, 1, 2]]


def check_persistent_backward(broken=None, seeds=60):
    for blocks in PERSISTENT_BLOCKS:
        for seed in range(seeds):
            run_persistent_backward(blocks, seed, broken)


class Wide:
    """The wide backward kernel's consumer-side shared memory and named barriers (one CTA)."""

    def __init__(self, buffers):
        self.ds = [[None, False] for _ in range(buffers)]  # dS^T tiles: [tile, fenced]
        self.ds_readers = [set() for _ in range(buffers)]  # consumers whose dQ reads it now
        self.g = None                     # exchange tile: [tile, read by consumer 1]
        self.k_readers, self.v_readers = set(), set()  # consumers whose wgmma reads K / V
        self.exchange = TurnBarrier()     # barrier 1: consumer 0 arrives, consumer 1 syncs
        self.consumers = NamedBarrier(2)  # barrier 2: PublishDs and the epilogue


def wide_publish_ds(w, wg):
    """PublishDs: every thread fences (consumer 1's dS^T stores become visible to the tensor
    cores), then barrier 2."""
    if wg == 1:
        for entry in w.ds:
            entry[1] = True
    yield from w.consumers.sync()


def wide_issue_dq(w, wg, it):
    """dQ(it) = dS K issued: it reads tile it's dS^T tile, which must be written and fenced."""
    buf = it % len(w.ds)
    assert w.ds[buf] == [it, True], f"wg {wg}'s dQ({it}) reads dS^T buffer {buf}: {w.ds[buf]}"
    w.ds_readers[buf].add(wg)
    w.k_readers.add(wg)


def wide_dq_done(w, wg, it):
    """dQ(it) complete (wgmma wait): its dS^T tile must not have been overwritten under it."""
    buf = it % len(w.ds)
    assert w.ds[buf][0] == it, f"dS^T buffer {buf} overwritten under wg {wg}'s dQ({it})"
    w.ds_readers[buf].discard(wg)


def wide_step(ring, w, wg, it, broken):
    """Step(it): every stage, K, V and dS^T read it issues is complete at its end."""
    stage = it % ring.stages

    def stage_holds(what):  # a wgmma or ld.shared of the stage sees tile it, landed
        assert ring.k[stage] == (it, True), f"wg {wg}'s {what}({it}) reads {ring.k[stage]}"

    stage_holds("S^T" if wg == 0 else "dP^T")
    ring.k_readers[stage].add(wg)
    (w.k_readers if wg == 0 else w.v_readers).add(wg)
    if it > 0:
        wide_issue_dq(w, wg, it - 1)    # straight behind the scores
    yield                               # the scores complete
    if wg == 0:
        stage_holds("lse")              # P^T, then G to the exchange tile
        assert w.g is None or w.g[1], f"G({w.g[0]}) overwritten before consumer 1 read it"
        w.g = [it, False]
        w.exchange.arrive()
    else:
        if broken != "wide-no-exchange-wait":
            while not w.exchange.arrived:
                yield BLOCKED
            w.exchange.arrived = 0      # the sync completes barrier 1's phase
        assert w.g == [it, False], f"consumer 1 reads G {w.g} for tile {it}"
        w.g[1] = True
        stage_holds("D")
        buf = it % len(w.ds)
        assert not w.ds_readers[buf], f"dS^T({it}) written into buffer {buf} under a dQ"
        w.ds[buf] = [it, False]
    yield                               # dV / dK issued; dQ(it - 1) completes
    if it > 0:
        wide_dq_done(w, wg, it - 1)
    yield                               # the dV / dK product completes
    stage_holds("dV / dK product")
    ring.k_readers[stage].discard(wg)
    w.k_readers.discard(wg)
    w.v_readers.discard(wg)


def wide_consumer(ring, w, tiles, wg, broken):
    """RunTiles and Epilogue of consumer wg (0: S^T, P^T, dV; 1: dP^T, dS^T, dK)."""
    s = ring.stages
    for it in range(tiles):
        yield from wait(ring.full_k[it % s], it // s)
        if it > 0 and broken != "wide-no-publish":
            yield from wide_publish_ds(w, wg)
        if broken == "wide-early-release":
            ring.empty_k[it % s].arrive()
        yield from wide_step(ring, w, wg, it, broken)
        if broken != "wide-early-release":
            ring.empty_k[it % s].arrive()   # Release: the Step's reads are complete
    if tiles:
        yield from wide_publish_ds(w, wg)
        wide_issue_dq(w, wg, tiles - 1)
        yield
        wide_dq_done(w, wg, tiles - 1)
        w.k_readers.discard(wg)
    if broken != "wide-no-epilogue-barrier":
        yield from w.consumers.sync()
    readers = w.v_readers if wg == 0 else w.k_readers  # dV staged in V, dK in K
    assert not readers, f"wg {wg} overwrites {'VK'[wg]} under a wgmma of wg {readers}"


def run_wide(tiles, seed, broken=None):
    ring = Ring(2, 2)  # ring.k: the stages of Q, dO, lse, D; Sm90StageBarriers<2, 1>
    w = Wide(1 if broken == "wide-one-ds-buffer" else 2)
    agents = [backward_producer(ring, tiles, broken)]
    agents += [wide_consumer(ring, w, tiles, wg, broken) for wg in range(2)]
    schedule(agents, seed, f"wide backward: tiles {tiles}")
    assert not w.exchange.arrived, "a barrier-1 arrive left pending at exit"


def check_wide(broken=None, seeds=60):
    for tiles in range(0, 9):
        for seed in range(seeds):
            run_wide(tiles, seed, broken)


# A warpgroup passing over tiles none of its rows see (the forward at head dim 64) without its
# turn, or releasing a stage before its tile landed.
BROKEN_PASS_OVER = ("pass-over-no-turn", "pass-over-no-full-wait")
# The TMA producer (the forward at head dim 256) arriving before Q's bytes are expected, or before
# a partial tile's cp.async copies landed.
BROKEN_TMA = ("tma-q-after-arrive", "tma-partial-no-wait")
# The block notices (the persistent forward's kBlockNotices) written before the producer knows
# the slot's previous block read them, or the end notice arriving on a K stage not yet released.
BROKEN_NOTICES = ("notice-before-q-wait", "end-notice-no-empty-wait")
# A consumer releasing a block's Q slot only after the next block's first key tile (session 24's
# `defer`, to keep the TMA store's read wait off the epilogue): with one slot the next block's Q
# waits for that release, which waits for the next block's Q (the GPU run hung at 256).
BROKEN = ("no-empty-wait", "early-full", "first-turn-per-block", "no-first-turn", "no-end-turn",
          "no-last-v-release",
          "no-q-empty-wait", "q-wait-before-v", "q-release-next-block") + BROKEN_PASS_OVER + \
    BROKEN_TMA + BROKEN_NOTICES
BROKEN_BACKWARD = ("bwd-no-empty-wait", "bwd-one-ds-buffer", "bwd-no-dq-barrier",
                   "bwd-no-epilogue-barrier")
# The persistent backward's producer loading a K/V buffer without waiting for its release, or
# its consumers releasing a buffer before their epilogue read dK / dV back out of it.
BROKEN_PERSISTENT = ("persistent-no-kv-wait", "persistent-early-kv-release")
BROKEN_WIDE = ("wide-no-publish", "wide-one-ds-buffer", "wide-no-exchange-wait",
               "wide-no-empty-wait", "wide-early-release", "wide-no-epilogue-barrier")
# The dQ kernel's producer publishing V(i) only after issuing K(i + 1), which waits for the
# stage of K(i - 1) that the consumers hold until tile i landed (a deadlock), or its consumers
# releasing K(i) before tile i's dQ product read it.
BROKEN_DQ = ("dq-lazy-v", "dq-early-k-release")


def checker(broken):
    if broken in BROKEN_DQ:
        return check_dq
    if broken in BROKEN_PERSISTENT:
        return check_persistent_backward
    if broken in BROKEN_WIDE:
        return check_wide
    return check_backward if broken in BROKEN_BACKWARD else check


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--broken", choices=BROKEN + BROKEN_BACKWARD + BROKEN_WIDE + BROKEN_DQ +
                        BROKEN_PERSISTENT,
                        help="run one deliberately broken protocol (must fail)")
    args = parser.parse_args()
    if args.broken:
        checker(args.broken)(args.broken)
        print(f"{args.broken}: passed (the check missed it)")
        return
    check()
    check_backward()
    check_persistent_backward()
    check_wide()
    check_dq()
    for broken in BROKEN + BROKEN_BACKWARD + BROKEN_WIDE + BROKEN_DQ + BROKEN_PERSISTENT:
        try:
            checker(broken)(broken, seeds=20)
        except (AssertionError, Deadlock):
            continue
        raise AssertionError(f"the check misses a broken protocol: {broken}")
    print("sm90 warp-specialized protocols: all checks passed (and each broken variant fails)")


if __name__ == "__main__":
    main()
