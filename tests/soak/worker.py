"""One soak client process: a loop of valid calls (checked against the reference) with faults
mixed in, counting how every call it issues ends. Besides raw gRPC calls it calls through
attnserve.Client (over the data channel in even-numbered workers, over gRPC in odd ones),
keeps saved contexts for backwards that find them, find them released, expired or never
made (the client then resends in full), and tears data channel connections mid-payload."""
import collections
import os
import time
import traceback

import grpc
import numpy as np

import attnserve
from attnserve import attention_pb2_grpc as pb2_grpc
from attnserve import data_channel, frames
from attnserve._proto.attnserve.v1 import data_channel_pb2 as dc_pb2
import raw_http2
import workload

RPCS = ("Forward", "Backward")
CALL_TIMEOUT_S = 30.0
# After a call refused for a device fault, before the next one.
DEVICE_REFUSED_PAUSE_S = 0.1
# A future still unresolved this long after its deadline counts as a hang.
HANG_GRACE_S = 15.0
# During the restart, refused calls are retried this long before the soak gives up on them.
GAP_RETRY_BUDGET_S = 90.0
GAP_RETRY_PAUSE_S = 0.05
# A call that started shortly after the new server became ready may still meet a channel in
# reconnect backoff; this much after the window still counts as the gap.
WINDOW_GRACE_S = 3.0

# (action, weight): mostly valid traffic, the faults the soak is about mixed in; the optional
# phases' actions (workload.FEATURES) on top, the weights then renormalized.
ACTIONS = (("valid", 0.22), ("client", 0.15), ("context", 0.15), ("cancel", 0.08),
           ("deadline", 0.08), ("close", 0.04), ("data_close", 0.05), ("malformed", 0.20),
           ("garbage", 0.03))
OPTIONAL_ACTIONS = (("memory", 0.04), ("unread", 0.03))
MEMORY_GROUP = 3
MEMORY_OVERSIZED_SHARE = 0.3
# What becomes of a kept context: its backward finds it (hit), finds it released or never
# made (unknown id), runs after the TTL (park, then expired), or it is only released.
CONTEXT_FATES = (("hit", 0.35), ("released", 0.15), ("unknown", 0.10), ("park", 0.25),
                 ("release_only", 0.15))
MAX_PARKED = 4
MIN_CHUNK_BYTES = 64 << 10
# A parked context's backward waits this long past the server's TTL (its sweep runs every
# 250 ms), so the context is surely gone.
EXPIRED_AFTER_S = workload.CONTEXT_TTL_S + 1.0

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


MAX_RESTARTS = 8
# Shared.restarts holds, per restart, these times:
WINDOW_START, BOUNDARY, WINDOW_END = range(3)


class Shared:
    """Cross-process state the coordinator sets; times are time.monotonic(), 0 = not yet."""

    def __init__(self, context):
        self.stop = context.Event()
        # Per restart i (lifetime L{i+1} -> L{i+2}): SIGTERM sent to the old server, the new
        # server spawned, the new server ready.
        self.restarts = context.Array("d", 3 * MAX_RESTARTS)

    def mark(self, restart: int, which: int, t: float) -> None:
        self.restarts[3 * restart + which] = t

    def phase(self, t: float) -> str:
        """Which server lifetime answered a call that ended at t: Ln, Lndrain (after its
        SIGTERM) or the next one. A server is spawned only after the one before has exited."""
        times = self.restarts[:]
        for i in range(MAX_RESTARTS):
            start, boundary = times[3 * i + WINDOW_START], times[3 * i + BOUNDARY]
            if not start or t < start:
                return f"L{i + 1}"
            if not boundary or t < boundary:
                return f"L{i + 1}drain"
        return f"L{MAX_RESTARTS + 1}"

    def in_window(self, t0: float, t1: float) -> bool:
        times = self.restarts[:]
        for i in range(MAX_RESTARTS):
            start, end = times[3 * i + WINDOW_START], times[3 * i + WINDOW_END]
            if start and t1 >= start and (not end or t0 <= end + WINDOW_GRACE_S):
                return True
        return False


# What the server says when a device fault (injected, or a real sticky CUDA error) keeps a
# request from running: the launch that faulted, launches beside it on the same device, queued
# requests it evicted, and requests refused while no device is in service.
DEVICE_FAULT_MARKERS = ("injected device fault", "injected fault on", "sticky: the device needs",
                        "cannot run the request (", "that could run the request is in service")


def device_refused(code, details: str) -> bool:
    """An UNAVAILABLE the soak accepts when faults are injected: retryable, and naming the
    fault, so never a wrong answer or a call lost."""
    return ("faults" in workload.FEATURES and code == grpc.StatusCode.UNAVAILABLE
            and any(marker in (details or "") for marker in DEVICE_FAULT_MARKERS))


def gap_cause(details: str) -> str:
    """Why a call failed around the restart (details: its error's message): refused by the
    draining server, sent while no server listened, or cut with the connection (the one an
    accepted call would show if the server dropped it)."""
    details = details or ""
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
    def __init__(self, target: str, rng: np.random.Generator, shared: Shared, index: int = 0,
                 data_address=None):
        self.target, self.rng, self.shared = target, rng, shared
        self.data_address = data_address
        self.channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        # No retries: every UNAVAILABLE reaches the soak, as on the raw channel.
        self.transport = "auto" if index % 2 == 0 else "grpc"
        self.client = attnserve.Client(target, timeout=CALL_TIMEOUT_S, retries=0,
                                       transport=self.transport)
        self.parked = collections.deque()  # (forward problem, its result, kept at)
        self.unread_calls = collections.deque()  # (close at, socket, phase it was sent in)
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
            if callable(channel):
                channel_now.close()
            again = self.settle(kind, rpc, t0, code, response, accepted, check, describe)
            if not (again and retry and time.monotonic() - first <= GAP_RETRY_BUDGET_S):
                return
            time.sleep(GAP_RETRY_PAUSE_S)

    def settle(self, kind, rpc, t0, code, response, accepted, check, describe) -> bool:
        """Counts how one attempt ended (code None: it hung); True when it was refused during
        a restart and may be sent again."""
        t1 = time.monotonic()
        if code is None:
            self.counts[key("hung", kind)] += 1
            self.fail(f"{kind} {rpc}: unresolved {HANG_GRACE_S}s after its deadline")
            return False
        self.counts[key("outcome", self.shared.phase(t1), rpc, kind, code.name)] += 1
        if code == grpc.StatusCode.OK:
            self._check(kind, rpc, check, response, describe)
            return False
        if code in accepted:
            return False
        details = response.details() if response is not None else ""
        if device_refused(code, details):
            self.count_device_refused(kind, rpc, t1)
            return False
        if code in GAP_CODES and self.shared.in_window(t0, t1):
            self.counts[key("gap_refused", kind, code.name, gap_cause(details))] += 1
            return True
        self.counts[key("unexpected", kind, code.name)] += 1
        self.fail(f"{kind} {rpc} ended {code.name}: {details or 'cancelled'!r} [{describe}]")
        return False

    def memory_pressure(self):
        """MEMORY_GROUP large Forwards at once, which the device budget cannot hold together
        (they wait for memory in the server's queue, and so do other clients' calls behind
        them), each answer checked; now and then a Backward that could never fit, which must
        be refused RESOURCE_EXHAUSTED, never run."""
        stub = stub_method(self.channel, "Forward")
        group = [workload.memory_hog(self.rng) for _ in range(MEMORY_GROUP)]
        sent = []
        for problem in group:
            self.counts[key("issued", "memory")] += 1
            sent.append((problem, time.monotonic(),
                         stub.future(problem.request, timeout=CALL_TIMEOUT_S)))
        for problem, t0, future in sent:
            code, response = resolve(future, CALL_TIMEOUT_S)
            self.settle("memory", "Forward", t0, code, response, frozenset(), problem.check,
                        problem.describe)
        if self.rng.random() < MEMORY_OVERSIZED_SHARE:
            self.call("memory:oversized", "Backward", workload.memory_oversized(self.rng),
                      workload.LIMIT, describe="memory:oversized")

    def unread(self):
        """A raw HTTP/2 call with a stream window of 0: the server computes the answer but can
        never send it. The socket stays open for a while (past the server's answer timeout
        about half the time) while this worker goes on with other calls, then closes. The
        client never learns the outcome: it counts the call CANCELLED (abandoned), in the
        lifetime it was sent to."""
        self.close_unread()
        t0 = time.monotonic()
        self.counts[key("issued", "unread")] += 1
        phase = self.shared.phase(t0)
        try:
            sock = raw_http2.start_unread_call(int(self.target.rsplit(":", 1)[1]),
                                               "/attnserve.v1.AttentionService/Forward",
                                               workload.unread_request(self.rng))
        except OSError as error:
            t1 = time.monotonic()
            self.counts[key("outcome", phase, "Forward", "unread", "UNAVAILABLE")] += 1
            if self.shared.in_window(t0, t1):
                self.counts[key("gap_refused", "unread", "UNAVAILABLE", "not_listening")] += 1
            else:
                self.counts[key("unexpected", "unread", "UNAVAILABLE")] += 1
                self.fail(f"unread: {error}")
            return
        hold = float(self.rng.uniform(0.2, 2 * workload.ANSWER_TIMEOUT_S))
        self.unread_calls.append((t0 + hold, sock, phase))

    def close_unread(self, everything=False):
        """Closes the unread calls whose time is up (all of them when everything)."""
        now = time.monotonic()
        keep = collections.deque()
        for close_at, sock, phase in self.unread_calls:
            if not everything and close_at > now:
                keep.append((close_at, sock, phase))
                continue
            sock.close()
            self.counts[key("outcome", phase, "Forward", "unread", "CANCELLED")] += 1
        self.unread_calls = keep

    def count_device_refused(self, kind, rpc, t1):
        """A call answered UNAVAILABLE for a device fault: it ended (once, with an allowed
        code); invariants.py allows the server's UNAVAILABLE count for it. Pausing a little
        keeps a client from spinning while the device is out of service."""
        self.counts[key("device_refused", self.shared.phase(t1), rpc, kind)] += 1
        time.sleep(DEVICE_REFUSED_PAUSE_S)

    def client_call(self, kind, rpc, make, check=None, describe=""):
        """As call, for a call made through attnserve.Client by make(); check(result) says
        why its result is wrong (None: right; no check: nothing to verify)."""
        first = time.monotonic()
        while True:
            t0 = time.monotonic()
            self.counts[key("issued", kind)] += 1
            try:
                result, code, details = make(), grpc.StatusCode.OK, ""
            except attnserve.AttentionError as error:
                result, code, details = None, error.code, error.details
            t1 = time.monotonic()
            self.counts[key("outcome", self.shared.phase(t1), rpc, kind, code.name)] += 1
            if code == grpc.StatusCode.OK:
                why = check(result) if check is not None else None
                if why is not None:
                    self.counts[key("wrong", kind)] += 1
                    self.fail(f"wrong answer: {why} [{kind} {describe}]")
                elif check is not None:
                    self.counts[key("verified", rpc, describe.split()[1])] += 1
                return result
            if device_refused(code, details):
                self.count_device_refused(kind, rpc, t1)
                return None
            if code in GAP_CODES and self.shared.in_window(t0, t1):
                self.counts[key("gap_refused", kind, code.name, gap_cause(details))] += 1
                if t1 - first > GAP_RETRY_BUDGET_S:
                    return None
                time.sleep(GAP_RETRY_PAUSE_S)
                continue
            self.counts[key("unexpected", kind, code.name)] += 1
            self.fail(f"{kind} {rpc} ended {code.name}: {details!r} [{describe}]")
            return None

    def client_valid(self, rpc):
        problem = workload.valid_problem(self.rng, rpc)
        method = getattr(self.client, rpc.lower())
        self.client_call(f"client:{self.transport}", rpc,
                         lambda: method(*problem.args, **problem.options),
                         problem.check_result, problem.describe)

    def context_step(self):
        """A forward keeping its context, then what CONTEXT_FATES draws for the context."""
        problem = workload.valid_problem(self.rng, "Forward")
        result = self.client_call(
            "context:keep", "Forward",
            lambda: self.client.forward(*problem.args, **problem.options, keep_context=True),
            problem.check_result, problem.describe)
        if result is None:
            return
        if not result.context_id:
            self.fail(f"forward with keep_context kept no context [{problem.describe}]")
            return
        names, weights = zip(*CONTEXT_FATES)
        fate = str(self.rng.choice(names, p=weights))
        if fate == "park":
            if len(self.parked) < MAX_PARKED:
                self.parked.append((problem, result, time.monotonic()))
                return
            fate = "hit"  # enough are parked already
        if fate in ("released", "release_only"):
            # False when the context is already gone (it lived on the server before a restart).
            released = self.client_call(
                "context:release", "ReleaseContext",
                lambda: self.client.release_context(result.context_id))
            self.counts[key("context_released", released)] += 1
            if fate == "release_only":
                return
        context_id = "0" * 32 if fate == "unknown" else result.context_id
        self.context_backward(f"context:{fate}", problem, result, context_id)

    def context_backward(self, kind, problem, result, context_id):
        args, check = workload.context_backward(self.rng, problem, result)
        self.client_call(kind, "Backward",
                         lambda: self.client.backward(*args, **problem.options,
                                                      context_id=context_id),
                         check, "Backward" + problem.describe[len("Forward"):])

    def expire_parked(self):
        """The backward of a parked context once its TTL has surely run out."""
        if self.parked and time.monotonic() - self.parked[0][2] > EXPIRED_AFTER_S:
            problem, result, _ = self.parked.popleft()
            self.context_backward("context:expired", problem, result, result.context_id)

    def data_close(self):
        """A data channel connection closed mid-payload: HELLO, a Forward's REQUEST, part of
        its payload, and close, as a client that crashes while sending."""
        problem = workload.valid_problem(self.rng, "Forward")
        request, payload = workload.data_payload(problem)
        if len(payload) < 2:
            return
        cut = int(self.rng.integers(1, len(payload)))
        # One chunk, sent right behind the REQUEST (the server's chunks are 64 KiB at least).
        chunk_bytes = max(len(payload), MIN_CHUNK_BYTES)
        message = dc_pb2.DataRequest(payload_bytes=len(payload), chunk_bytes=chunk_bytes,
                                     timeout_ms=int(CALL_TIMEOUT_S * 1000))
        message.forward.CopyFrom(request)
        t0 = time.monotonic()
        self.counts[key("issued", "data_close")] += 1
        try:
            sock, _ = data_channel._connect(*self.data_address, os.urandom(16), None, 5.0, None)
            with sock:
                sock.sendall(frames.message_frame(frames.REQUEST, message, 1)
                             + frames.pack_header(frames.CHUNK, 1, 0, len(payload))
                             + payload[:cut])
            code, details = "CANCELLED", ""
        except (OSError, frames.ProtocolError, data_channel._ServerClosed) as error:
            code, details = "UNAVAILABLE", str(error)
        t1 = time.monotonic()
        self.counts[key("outcome", self.shared.phase(t1), "Forward", "data_close", code)] += 1
        if code == "UNAVAILABLE":
            if self.shared.in_window(t0, t1):
                self.counts[key("gap_refused", "data_close", code, gap_cause(details))] += 1
            else:
                self.counts[key("unexpected", "data_close", code)] += 1
                self.fail(f"data_close: {details}")

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
        self.expire_parked()
        self.close_unread()
        names, weights = zip(*(ACTIONS + tuple(
            (name, weight) for name, weight in OPTIONAL_ACTIONS if name in workload.FEATURES)))
        action = str(self.rng.choice(names, p=np.array(weights) / sum(weights)))
        rpc = RPCS[int(self.rng.random() < 0.4)]
        plain = {"memory": self.memory_pressure, "unread": self.unread,
                 "client": lambda: self.client_valid(rpc), "context": self.context_step,
                 "data_close": self.data_close}
        if action in plain:
            plain[action]()
            return
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


def run(index, target, seed, shared, results, data_address):
    """Process entry point: loops until the coordinator sets stop, then reports its counts.
    Contexts still parked then are left to the server's TTL."""
    worker = Worker(target, np.random.default_rng(seed), shared, index, data_address)
    try:
        while not shared.stop.is_set():
            worker.step()
    except Exception:  # reported, not swallowed: a soak client that dies is a failure
        worker.fail("worker crashed:\n" + traceback.format_exc())
    finally:
        worker.close_unread(everything=True)
        worker.client.close()
        worker.channel.close()
        results.put(worker.report(index))
