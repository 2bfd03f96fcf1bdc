"""One soak client process: a loop of valid calls (checked against the reference) with faults
mixed in, counting how every call it issues ends."""
import collections
import time
import traceback

import grpc
import numpy as np

from attnserve import attention_pb2_grpc as pb2_grpc
import workload

RPCS = ("Forward", "Backward")
CALL_TIMEOUT_S = 30.0
# A future still unresolved this long after its deadline counts as a hang.
HANG_GRACE_S = 15.0
# During the restart, refused calls are retried this long before the soak gives up on them.
GAP_RETRY_BUDGET_S = 90.0
GAP_RETRY_PAUSE_S = 0.05
# A call that started shortly after the new server became ready may still meet a channel in
# reconnect backoff; this much after the window still counts as the gap.
WINDOW_GRACE_S = 3.0

# (action, weight): mostly valid traffic, the faults the soak is about mixed in.
ACTIONS = (("valid", 0.50), ("cancel", 0.10), ("deadline", 0.10), ("close", 0.05),
           ("malformed", 0.22), ("garbage", 0.03))

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    # No transparent retries: every UNAVAILABLE reaches the soak, which retries and counts it.
    ("grpc.enable_retries", 0),
    # Reconnect quickly once the restarted server listens again.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]

GAP_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


def key(*parts) -> str:
    return "|".join(str(p) for p in parts)


class Shared:
    """Cross-process state the coordinator sets; times are time.monotonic(), 0 = not yet."""

    def __init__(self, context):
        self.stop = context.Event()
        self.window_start = context.Value("d", 0.0)  # SIGTERM sent to the first server
        self.boundary = context.Value("d", 0.0)      # the second server spawned
        self.window_end = context.Value("d", 0.0)    # the second server ready

    def phase(self, t: float) -> str:
        """Which server lifetime answered a call that ended at t: L1, L1drain (after its
        SIGTERM) or L2. The second server is spawned only after the first has exited."""
        start, boundary = self.window_start.value, self.boundary.value
        if not start or t < start:
            return "L1"
        return "L2" if boundary and t >= boundary else "L1drain"

    def in_window(self, t0: float, t1: float) -> bool:
        start, end = self.window_start.value, self.window_end.value
        return bool(start) and t1 >= start and (not end or t0 <= end + WINDOW_GRACE_S)


def gap_cause(error) -> str:
    """Why a call failed around the restart: refused by the draining server, sent while no
    server listened, or cut with the connection (the one an accepted call would show if the
    server dropped it)."""
    details = (error.details() if error is not None else "") or ""
    if "shutting down" in details:
        return "draining_server"
    if "failed to connect" in details or "Connection refused" in details:
        return "not_listening"
    return f"connection_lost: {details[:60]}"


def stub_method(channel, rpc, raw=False):
    """The rpc's callable; raw sends bytes as they are (no protobuf serialization)."""
    if raw:
        return channel.unary_unary(f"/attnserve.v1.AttentionService/{rpc}")
    return getattr(pb2_grpc.AttentionServiceStub(channel), rpc)


def resolve(future, timeout: float):
    """(code, response) once the future is done; code None means it hung."""
    try:
        return grpc.StatusCode.OK, future.result(timeout=timeout + HANG_GRACE_S)
    except grpc.FutureTimeoutError:
        future.cancel()
        return None, None
    except grpc.FutureCancelledError:
        return grpc.StatusCode.CANCELLED, None
    except grpc.RpcError as error:
        return error.code(), error


class Worker:
    def __init__(self, target: str, rng: np.random.Generator, shared: Shared):
        self.target, self.rng, self.shared = target, rng, shared
        self.channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.counts = collections.Counter()
        self.failures = []

    def fail(self, what: str) -> None:
        self.counts["failures"] += 1
        if len(self.failures) < 50:
            self.failures.append(what)

    def call(self, kind, rpc, request, accepted, timeout=CALL_TIMEOUT_S, inject=None,
             channel=None, raw=False, check=None, describe="", retry=True):
        """Issues the request (again while the server restarts, if retry) and counts how each
        attempt ended. accepted: the codes besides the gap's that this kind may end with."""
        first = time.monotonic()
        while True:
            channel_now = channel() if callable(channel) else (channel or self.channel)
            t0 = time.monotonic()
            self.counts[key("issued", kind)] += 1
            future = stub_method(channel_now, rpc, raw).future(request, timeout=timeout)
            if inject is not None:
                inject(future, channel_now)
            code, response = resolve(future, timeout)
            t1 = time.monotonic()
            if callable(channel):
                channel_now.close()
            if code is None:
                self.counts[key("hung", kind)] += 1
                self.fail(f"{kind} {rpc}: unresolved {HANG_GRACE_S}s after its deadline")
                return
            self.counts[key("outcome", self.shared.phase(t1), rpc, kind, code.name)] += 1
            if code == grpc.StatusCode.OK:
                self._check(kind, rpc, check, response, describe)
                return
            if code in accepted:
                return
            if code in GAP_CODES and self.shared.in_window(t0, t1):
                self.counts[key("gap_refused", kind, code.name, gap_cause(response))] += 1
                if not retry or t1 - first > GAP_RETRY_BUDGET_S:
                    return
                time.sleep(GAP_RETRY_PAUSE_S)
                continue
            self.counts[key("unexpected", kind, code.name)] += 1
            details = response.details() if response is not None else "cancelled"
            self.fail(f"{kind} {rpc} ended {code.name}: {details!r} [{describe}]")
            return

    def _check(self, kind, rpc, check, response, describe):
        if check is None:  # a malformed request: OK is never right
            self.counts[key("wrong", kind)] += 1
            self.fail(f"{kind} {rpc} answered OK [{describe}]")
            return
        why = check(response)
        if why is None:
            self.counts[key("verified", rpc, describe.split()[1])] += 1
        else:
            self.counts[key("wrong", kind)] += 1
            self.fail(f"wrong answer: {why} [{describe}]")

    def step(self):
        names, weights = zip(*ACTIONS)
        action = str(self.rng.choice(names, p=weights))
        rpc = RPCS[int(self.rng.random() < 0.4)]
        if action == "malformed":
            name = str(self.rng.choice(list(workload.MALFORMED)))
            codes = workload.MALFORMED[name][0]
            request = workload.malformed_request(self.rng, rpc, name)
            self.call(f"malformed:{name}", rpc, request, codes, describe=name)
            return
        if action == "garbage":
            name, codes, _ = workload.GARBAGE
            self.call(name, rpc, workload.garbage_bytes(self.rng), codes, raw=True)
            return
        problem = workload.valid_problem(self.rng, rpc)
        ok_only = frozenset()
        common = dict(check=problem.check, describe=problem.describe)
        if action == "valid":
            self.call("valid", rpc, problem.request, ok_only, **common)
        elif action == "cancel":
            delay = float(self.rng.uniform(0, 0.02))
            self.call("cancel", rpc, problem.request, {grpc.StatusCode.CANCELLED},
                      inject=lambda future, _: (time.sleep(delay), future.cancel()),
                      retry=False, **common)
        elif action == "deadline":
            timeout = float(self.rng.uniform(0.001, 0.02))
            self.call("deadline", rpc, problem.request, {grpc.StatusCode.DEADLINE_EXCEEDED},
                      timeout=timeout, retry=False, **common)
        else:  # close: a channel of its own, closed under the call
            delay = float(self.rng.uniform(0, 0.02))
            self.call("close", rpc, problem.request, {grpc.StatusCode.CANCELLED},
                      channel=lambda: grpc.insecure_channel(self.target, CHANNEL_OPTIONS),
                      inject=lambda _, channel: (time.sleep(delay), channel.close()),
                      retry=False, **common)

    def report(self, index):
        return {"worker": index, "counts": dict(self.counts), "failures": self.failures}


def run(index, target, seed, shared, results):
    """Process entry point: loops until the coordinator sets stop, then reports its counts."""
    worker = Worker(target, np.random.default_rng(seed), shared)
    try:
        while not shared.stop.is_set():
            worker.step()
    except Exception:  # reported, not swallowed: a soak client that dies is a failure
        worker.fail("worker crashed:\n" + traceback.format_exc())
    finally:
        worker.channel.close()
        results.put(worker.report(index))
