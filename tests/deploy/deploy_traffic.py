"""Bounded load on a local attnserve: forward and backward calls from a few threads, over gRPC
and over the data channel, with saved contexts hit, missed and evicted, Open Inference Protocol
inferences over gRPC and HTTP (some through system shared memory), plus a steady trickle of
requests and data channel connections the server must reject (for their limits, for their
estimated compute time, for bad offsets), so every labelled series (each rpc, protocol,
shared-memory use, OK and error codes, rejection reason, each kernel, each transfer direction)
exists and moves."""
import contextlib
import socket
import threading
import time
import uuid
from typing import Dict, List, Optional, Tuple

import numpy as np

import attnserve

# The server under test runs with --max_head_dim=64 (LIMITS); head_dim 128 is refused with
# RESOURCE_EXHAUSTED before any work, offsets past the end with INVALID_ARGUMENT.
# The context budget holds one context of _problem()'s default shape (133 KB) but not two.
# A forward of 4096 tokens, 2 heads of head_dim 64 is estimated at about 2 s on one CPU thread:
# refused for compute at a 0.5 s limit, while the others take milliseconds. Shared memory is on
# for the OIP inferences through a system region.
LIMITS = {"max_head_dim": 64, "max_total_tokens": 4096, "max_batch": 64,
          "max_message_bytes": 16 << 20, "cpu_threads": 1, "context_memory_bytes": 200_000,
          "max_request_compute_seconds": 0.5, "allow_shared_memory": "true"}
CALL_TIMEOUT_S = 20
REGION_BYTES = 1 << 16


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


class Oip:
    """tritonclient's gRPC and HTTP clients of one server, and a system shared-memory region
    registered with it (each Oip its own, so threads do not share one)."""

    def __init__(self, grpc_target: str, http_address: str):
        import tritonclient.grpc
        import tritonclient.http
        from tritonclient.utils import shared_memory

        self.modules = {"grpc": tritonclient.grpc, "http": tritonclient.http}
        self.clients = {"grpc": tritonclient.grpc.InferenceServerClient(grpc_target),
                        "http": tritonclient.http.InferenceServerClient(
                            http_address, connection_timeout=CALL_TIMEOUT_S,
                            network_timeout=CALL_TIMEOUT_S)}
        self.shm = shared_memory
        self.name = f"deploy_{uuid.uuid4().hex[:12]}"
        self.key = f"/attnserve_{self.name}"
        self.handle = shared_memory.create_shared_memory_region(self.name, self.key,
                                                                REGION_BYTES)
        try:
            self.clients["grpc"].register_system_shared_memory(self.name, self.key,
                                                               REGION_BYTES)
        except BaseException:
            shared_memory.destroy_shared_memory_region(self.handle)
            raise

    def close(self) -> None:
        try:
            self.clients["grpc"].unregister_system_shared_memory(self.name)
        finally:
            self.shm.destroy_shared_memory_region(self.handle)
            for client in self.clients.values():
                client.close()

    def forward(self, protocol: str, arrays, through_region: bool = False) -> None:
        """attention_forward over `protocol`, its tensors in the messages or, with
        through_region, inputs read from and out and lse written to the region."""
        module = self.modules[protocol]
        inputs, offset = [], 0
        for name, array in arrays.items():
            datatype = "INT32" if array.dtype == np.int32 else "FP16"
            tensor = module.InferInput(name, list(array.shape), datatype)
            if through_region:
                tensor.set_shared_memory(self.name, array.nbytes, offset)
                offset += array.nbytes
            elif protocol == "http":
                tensor.set_data_from_numpy(array, binary_data=True)
            else:
                tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        outputs = None
        if through_region:
            self.shm.set_shared_memory_region(self.handle, list(arrays.values()))
            q = arrays["q"]
            outputs = [module.InferRequestedOutput("out"), module.InferRequestedOutput("lse")]
            outputs[0].set_shared_memory(self.name, q.nbytes, offset)
            outputs[1].set_shared_memory(self.name, 4 * q.shape[0] * q.shape[1],
                                         offset + q.nbytes)
        timeout = {"client_timeout": CALL_TIMEOUT_S} if protocol == "grpc" else {}
        self.clients[protocol].infer("attention_forward", inputs, outputs=outputs,
                                     parameters={"causal": True}, **timeout)


def oip_round(oip: Oip, rng, counts: Dict[str, int]) -> None:
    """A forward over each protocol with its tensors in the message, one over gRPC through
    the shared-memory region, and one refused (an offset past the end) over each protocol."""
    from tritonclient.utils import InferenceServerException

    q, k, v, cu = _problem(rng, heads=2, head_dim=16, seqlens=(7, 9))
    arrays = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu, "cu_seqlens_k": cu}
    for protocol, through_region in (("grpc", False), ("http", False), ("grpc", True)):
        oip.forward(protocol, arrays, through_region)
        counts["ok"] += 1
    bad_cu = cu.copy()
    bad_cu[-1] += 5
    for protocol in ("grpc", "http"):
        try:
            oip.forward(protocol, dict(arrays, cu_seqlens_q=bad_cu, cu_seqlens_k=bad_cu))
        except InferenceServerException:
            counts["rejected"] += 1
        else:
            raise AssertionError(f"the server accepted an OIP {protocol} request it must refuse")


def one_round(client: attnserve.Client, rng, counts: Dict[str, int],
              data_address: Optional[Tuple[str, int]] = None,
              oip: Optional[Oip] = None) -> None:
    """Two forwards keeping contexts (the second evicts the first: LIMITS' context budget holds
    one), their two backwards by context_id (a miss resent in full, and usually a hit), a
    server-info call, three rejected requests (over the head_dim limit, bad offsets, too much
    compute), given an Oip its oip_round, and, given the data channel's address, a connection
    that breaks its protocol."""
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
    long_q, long_k, long_v, long_cu = _problem(rng, heads=2, head_dim=64, seqlens=(4096,))
    for args in ((big_q, big_k, big_v, big_cu, big_cu), (q, k, v, bad_cu, bad_cu),
                 (long_q, long_k, long_v, long_cu, long_cu)):
        try:
            client.forward(*args, timeout=CALL_TIMEOUT_S)
        except attnserve.AttentionError:
            counts["rejected"] += 1
        else:
            raise AssertionError("the server accepted a request it must refuse")
    if oip is not None:
        oip_round(oip, rng, counts)
    if data_address is not None:
        break_data_protocol(data_address)
        counts["protocol_errors"] += 1


def oip_for(oip_addresses: Optional[Tuple[str, str]]):
    """An Oip on (gRPC target, HTTP host:port), closed on exit; None without addresses."""
    if oip_addresses is None:
        return contextlib.nullcontext()
    return contextlib.closing(Oip(*oip_addresses))


class Load:
    """Runs one_round in `threads` threads until stop() or `max_seconds`, whichever first; the
    first thread stays on gRPC, the others take the data channel when the server has one.
    Given oip_addresses (the gRPC target and the HTTP host:port), each thread also makes OIP
    inferences with its own tritonclient clients and shared-memory region."""

    def __init__(self, target: str, threads: int = 3, max_seconds: float = 60.0,
                 data_address: Optional[Tuple[str, int]] = None,
                 oip_addresses: Optional[Tuple[str, str]] = None):
        self.target = target
        self.data_address = data_address
        self.oip_addresses = oip_addresses
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
            # Native calls (shared memory has calls of its own, through `oip`).
            with attnserve.Client(self.target, timeout=CALL_TIMEOUT_S, transport=transport,
                                  shared_memory="off") as client, \
                    oip_for(self.oip_addresses) as oip:
                while not self._stop.is_set() and time.monotonic() < self.deadline:
                    one_round(client, rng, local, self.data_address, oip)
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
               data_address: Optional[Tuple[str, int]] = None,
               oip_addresses: Optional[Tuple[str, str]] = None) -> Dict[str, int]:
    """A fixed number of rounds from this thread."""
    counts = {"ok": 0, "rejected": 0, "protocol_errors": 0}
    rng = np.random.default_rng(0)
    with attnserve.Client(target, timeout=CALL_TIMEOUT_S, shared_memory="off") as client, \
            oip_for(oip_addresses) as oip:
        for _ in range(rounds):
            one_round(client, rng, counts, data_address, oip)
    return counts
