#!/usr/bin/env python3
"""CPU check of the Hopper forward's synchronization (fwd_sm90_ring.cuh, fwd_sm90_kernel.cuh).

The producer warpgroup and the consumer warpgroups run the kernel's sequence of barrier
operations, copies and wgmma reads as coroutines under many random schedules. Checked:
- every wgmma reads a stage that holds the tile it expects, landed, and not overwritten before
  the read completes (the producer waits for the stage's empty barrier);
- mbarrier parity waits never alias: a waiter is never a whole phase behind (the parity would
  then read as not completed, or as completed a phase early);
- the ping-pong turns alternate strictly (no bar.arrive lands on a barrier phase that already
  holds one, which would complete it without its owner) and none is left pending at exit;
- nothing deadlocks.
A broken variant of each rule (--broken NAME) must fail; the script raises on the first problem.
"""
import argparse
import random

PRODUCER_ARRIVALS = 1  # the 128 producer threads act alike: one arrival stands for them


class Deadlock(Exception):
    pass


class Mbarrier:
    def __init__(self, count):
        self.count, self.pending, self.completed = count, 0, 0

    def arrive(self):
        self.pending += 1
        assert self.pending <= self.count
        if self.pending == self.count:
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
    def __init__(self, stages, consumers):
        self.stages = stages
        self.full_k = [Mbarrier(PRODUCER_ARRIVALS) for _ in range(stages)]
        self.full_v = [Mbarrier(PRODUCER_ARRIVALS) for _ in range(stages)]
        self.empty_k = [Mbarrier(consumers) for _ in range(stages)]
        self.empty_v = [Mbarrier(consumers) for _ in range(stages)]
        # Stage contents: (tile, landed); readers: consumers whose wgmma reads it now.
        self.k = [None] * stages
        self.v = [None] * stages
        self.k_readers = [set() for _ in range(stages)]
        self.v_readers = [set() for _ in range(stages)]


def wait(barrier, use):
    while not barrier.ready(use):
        yield


def producer(ring, tiles, broken):
    s = ring.stages
    in_flight = []  # committed copy groups, oldest first: (buffer, stage)

    def issue(buf, readers, stage, tile):
        assert not readers[stage], f"copy into a stage a wgmma still reads (tile {tile})"
        buf[stage] = (tile, False)
        in_flight.append((buf, stage))

    def wait_groups(pending):
        while len(in_flight) > pending:
            buf, stage = in_flight.pop(0)
            buf[stage] = (buf[stage][0], True)

    for i in range(tiles):
        use = i // s
        if i >= s and broken != "no-empty-wait":
            yield from wait(ring.empty_k[i % s], use - 1)
        issue(ring.k, ring.k_readers, i % s, i)
        yield
        if i > 0:
            wait_groups(1)
            ring.full_v[(i - 1) % s].arrive()
        if i >= s and broken != "no-empty-wait":
            yield from wait(ring.empty_v[i % s], use - 1)
        issue(ring.v, ring.v_readers, i % s, i)
        yield
        if broken != "early-full":  # broken: K(i) published while its copies may still land
            wait_groups(1)
        ring.full_k[i % s].arrive()
        yield
    wait_groups(0)
    ring.full_v[(tiles - 1) % s].arrive()


def consumer(ring, tiles, wg, warpgroups, turns, pingpong, broken):
    s = ring.stages

    def read(buf, readers, i):
        stage = i % s
        assert buf[stage] == (i, True), f"wg {wg} reads stage {stage} for tile {i}: {buf[stage]}"
        readers[stage].add(wg)

    def done(readers, empty, i):
        readers[i % s].discard(wg)
        empty[i % s].arrive()

    if pingpong and wg == warpgroups - 1:
        turns[0].arrive()
    for i in range(tiles):
        yield from wait(ring.full_k[i % s], i // s)
        if i > 0:
            yield from wait(ring.full_v[(i - 1) % s], (i - 1) // s)
        if pingpong:
            while not turns[wg].arrived:
                yield
            turns[wg].arrived = 0
        read(ring.k, ring.k_readers, i)           # S = Q K(i)^T issued
        if i > 0:
            read(ring.v, ring.v_readers, i - 1)   # O += P V(i - 1) issued
        if pingpong and (wg < warpgroups - 1 or i < tiles - 1 or broken == "extra-turn"):
            turns[(wg + 1) % warpgroups].arrive()
        yield                                     # the GEMMs run
        assert ring.k[i % s] == (i, True), f"K stage of tile {i} overwritten under its wgmma"
        done(ring.k_readers, ring.empty_k, i)     # wgmma wait: S done
        yield                                     # softmax
        if i > 0:
            done(ring.v_readers, ring.empty_v, i - 1)
    yield from wait(ring.full_v[(tiles - 1) % s], (tiles - 1) // s)
    read(ring.v, ring.v_readers, tiles - 1)
    yield
    ring.v_readers[(tiles - 1) % s].discard(wg)


def run(tiles, stages, warpgroups, pingpong, seed, broken=None):
    rng = random.Random(seed)
    ring = Ring(stages, warpgroups)
    turns = [TurnBarrier() for _ in range(warpgroups)]
    agents = [producer(ring, tiles, broken)]
    agents += [consumer(ring, tiles, wg, warpgroups, turns, pingpong, broken)
               for wg in range(warpgroups)]
    live = list(agents)
    stalls = 0
    while live:
        agent = rng.choice(live)
        try:
            next(agent)
            stalls = 0
        except StopIteration:
            live.remove(agent)
        stalls += 1
        if stalls > 10000:
            raise Deadlock(f"tiles {tiles} stages {stages} warpgroups {warpgroups}")
    assert not any(t.arrived for t in turns), "a turn left pending at exit"


def check(broken=None, seeds=60):
    for tiles in range(1, 8):
        for stages in (2, 3):
            for warpgroups in (2, 3):
                for pingpong in (False, True):
                    for seed in range(seeds):
                        run(tiles, stages, warpgroups, pingpong, seed, broken)


BROKEN = ("no-empty-wait", "early-full", "extra-turn")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--broken", choices=BROKEN,
                        help="run one deliberately broken protocol (must fail)")
    args = parser.parse_args()
    if args.broken:
        check(args.broken)
        print(f"{args.broken}: passed (the check missed it)")
        return
    check()
    for broken in BROKEN:
        try:
            check(broken, seeds=20)
        except (AssertionError, Deadlock):
            continue
        raise AssertionError(f"the check misses a broken protocol: {broken}")
    print("sm90 forward ring protocol: all checks passed (and each broken variant fails)")


if __name__ == "__main__":
    main()
