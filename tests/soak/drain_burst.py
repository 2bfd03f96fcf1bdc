"""Work in flight at the SIGTERM. The steady soak load leaves the CPU server idle at most
instants (the clients spend their time on the reference), so just before the SIGTERM the soak
sends a burst of larger calls and waits until the server reports work in flight. Every
burst call must end OK with a correct answer, or UNAVAILABLE if the server refused it before
accepting it."""
import time

import grpc
import numpy as np

import worker
import workload

CALLS = 6
# 768 tokens, 8 query heads over 2 kv heads, head_dim 64, fp32: about a hundred ms each on the
# CPU backend, so several are queued or running at once even when a loaded machine delays the
# SIGTERM after the server first reports one in flight (at 384 tokens all six were sometimes
# done by then).
SHAPE = (np.array([0, 768], np.int32), np.array([0, 768], np.int32), 8, 2, 64)
# On a GPU such a call takes about a millisecond, and all six were done before the SIGTERM
# (the GPU soak, call 24): many more calls of 1024 tokens (3 MiB, within the soak's message
# limit) keep the lanes busy, and the memory phase's device budget queues them.
GPU_CALLS = 48
GPU_SHAPE = (np.array([0, 1024], np.int32), np.array([0, 1024], np.int32), 8, 2, 64)
# Full attention, no causal mask or window: a random window of a few keys made some burst
# calls nearly free, and once all six were answered before the SIGTERM (CI, 2026-11-27).
OPTIONS = {}
IN_FLIGHT_TIMEOUT_S = 10.0
KIND = "drain_burst"


class DrainBurst:
    def __init__(self, target, rng):
        self.channel = grpc.insecure_channel(target, options=worker.CHANNEL_OPTIONS)
        gpu = "gpu" in workload.FEATURES
        self.problems = [workload.valid_problem(rng, "Forward", GPU_SHAPE if gpu else SHAPE,
                                                "fp32", OPTIONS)
                         for _ in range(GPU_CALLS if gpu else CALLS)]
        self.futures = []

    def send(self, lifetime):
        """Starts the calls and returns once the server has at least one in flight."""
        method = worker.stub_method(self.channel, "Forward")
        self.futures = [method.future(p.request, timeout=worker.CALL_TIMEOUT_S)
                        for p in self.problems]
        # When each ended, which says which phase answered it (settle runs much later).
        self.ended = [None] * len(self.futures)
        for index, future in enumerate(self.futures):
            future.add_done_callback(
                lambda _, index=index: self.ended.__setitem__(index, time.monotonic()))
        # Other clients' calls count too: wait until the server has work in flight while some
        # of the burst is still unanswered.
        deadline = time.monotonic() + IN_FLIGHT_TIMEOUT_S
        while time.monotonic() < deadline and not (
                self._inflight(lifetime) >= 1
                and not all(future.done() for future in self.futures)):
            time.sleep(0.005)

    @staticmethod
    def _inflight(lifetime):
        """The server's in-flight gauge; 0 when a scrape fails (a loaded CI machine can keep
        one past its timeout), so the wait goes on until its deadline instead of the soak."""
        try:
            return lifetime.metrics(timeout=1.0)["inflight"]
        except OSError:
            return 0

    def settle(self, counts, shared, fail):
        """Counts how each call ended into the soak's counts (see invariants.py)."""
        for index, (problem, future) in enumerate(zip(self.problems, self.futures)):
            counts[worker.key("issued", KIND)] += 1
            code, response = worker.resolve(future, worker.CALL_TIMEOUT_S)
            if code is None:
                counts[worker.key("hung", KIND)] += 1
                fail(f"{KIND}: unresolved after its deadline")
                continue
            phase = shared.phase(self.ended[index] or time.monotonic())
            counts[worker.key("outcome", phase, "Forward", KIND, code.name)] += 1
            if code == grpc.StatusCode.OK:
                why = problem.check(response)
                if why is None:
                    counts[worker.key("verified", "Forward", "fp32")] += 1
                else:
                    counts[worker.key("wrong", KIND)] += 1
                    fail(f"{KIND} wrong answer: {why}")
            elif code != grpc.StatusCode.UNAVAILABLE:
                counts[worker.key("unexpected", KIND, code.name)] += 1
                fail(f"{KIND} ended {code.name}: {response.details() if response else ''}")
        self.channel.close()
