"""Bounded load on a local attnserve: forward and backward calls from a few threads, over gRPC
and over the data channel, with saved contexts hit, missed and evicted, plus a steady trickle
of requests and data channel connections the server must reject, so every labelled series
(each rpc, OK and error codes, each kernel, each transfer direction) exists and moves."""
import socket
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

import attnserve

# The server under test runs with --max_head_dim=64 (LIMITS); head_dim 128 is refused with
# RESOURCE_EXHAUSTED before any work, offsets past the end with INVALID_ARGUMENT.
# The context budget holds one context of _problem()'s default shape (133 KB) but not two.
LIMITS = {"max_head_dim": 64, "max_total_tokens": 4096, "max_batch": 64,
          "max_message_bytes": 16 << 20, "cpu_threads": 1, "context_memory_bytes": 200_000}
CALL_TIMEOUT_S = 20


def _problem(rng, head_dim=32, heads=4, seqlens=(48, 80)):
    cu = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int32)
    total = int(cu[-1])
    q, k, v = (rng.standard_normal((total, heads, head_dim)).astype(np.float16) for _ in range(3))
    return q, k, v, cu


def break_data_protocol(address: Tuple[str, int]) -> None:
    """A data channel connection that opens with bytes no frame starts with: the server closes
    it and counts a protocol error."""
    with socket.create_connection(address, timeout=CALL_TIMEOUT_S) as sock:
        sock.sendall(b"\xff" * 64)
        while sock.recv(4096):
            pass


def one_round(client: attnserve.Client, rng, counts: Dict[str, int],
              data_address: Optional[Tuple[str, int]] = None) -> None:
    """Two forwards keeping contexts (the second evicts the first: LIMITS' context budget holds
    one), their two backwards by context_id (a miss resent in full, and usually a hit), a
    server-info call, two rejected requests and, given the data channel's address, a
    connection that breaks its protocol."""
    q, k, v, cu = _problem(rng)
    forwards = [client.forward(q, k, v, cu, cu, causal=True, keep_context=True,
                               timeout=CALL_TIMEOUT_S) for _ in range(2)]
    dout = rng.standard_normal(q.shape).astype(np.float16)
    for fwd in forwards:
        client.backward(dout, q, k, v, fwd.out, fwd.lse, cu, cu, causal=True,
                        context_id=fwd.context_id, context_address=fwd.context_address,
                        timeout=CALL_TIMEOUT_S)
    client.server_info(timeout=CALL_TIMEOUT_S)
    counts["ok"] += 5
    big_q, big_k, big_v, big_cu = _problem(rng, head_dim=128, seqlens=(8,))
    bad_cu = cu.copy()
    bad_cu[-1] += 5
    for args in ((big_q, big_k, big_v, big_cu, big_cu), (q, k, v, bad_cu, bad_cu)):
        try:
            client.forward(*args, timeout=CALL_TIMEOUT_S)
        except attnserve.AttentionError:
            counts["rejected"] += 1
        else:
            raise AssertionError("the server accepted a request it must refuse")
    if data_address is not None:
        break_data_protocol(data_address)
        counts["protocol_errors"] += 1


class Load:
    """Runs one_round in `threads` threads until stop() or `max_seconds`, whichever first; the
    first thread stays on gRPC, the others take the data channel when the server has one."""

    def __init__(self, target: str, threads: int = 3, max_seconds: float = 60.0,
                 data_address: Optional[Tuple[str, int]] = None):
        self.target = target
        self.data_address = data_address
        self.threads = threads
        self.deadline = time.monotonic() + max_seconds
        self.counts = {"ok": 0, "rejected": 0, "protocol_errors": 0}
        self.errors: List[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: List[threading.Thread] = []

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        local = {"ok": 0, "rejected": 0, "protocol_errors": 0}
        transport = "grpc" if seed == 0 else "auto"
        try:
            with attnserve.Client(self.target, timeout=CALL_TIMEOUT_S,
                                  transport=transport) as client:
                while not self._stop.is_set() and time.monotonic() < self.deadline:
                    one_round(client, rng, local, self.data_address)
        except BaseException as error:  # reported by stop(), not lost in a thread
            with self._lock:
                self.errors.append(error)
        finally:
            with self._lock:
                for key, value in local.items():
                    self.counts[key] += value

    def start(self) -> "Load":
        for seed in range(self.threads):
            worker = threading.Thread(target=self._run, args=(seed,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def stop(self) -> Dict[str, int]:
        self._stop.set()
        for worker in self._workers:
            worker.join(CALL_TIMEOUT_S * 2)
        if self.errors:
            raise self.errors[0]
        return dict(self.counts)


def run_rounds(target: str, rounds: int,
               data_address: Optional[Tuple[str, int]] = None) -> Dict[str, int]:
    """A fixed number of rounds from this thread."""
    counts = {"ok": 0, "rejected": 0, "protocol_errors": 0}
    rng = np.random.default_rng(0)
    with attnserve.Client(target, timeout=CALL_TIMEOUT_S) as client:
        for _ in range(rounds):
            one_round(client, rng, counts, data_address)
    return counts
