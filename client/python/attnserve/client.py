"""The numpy client: Forward, Backward and saved contexts over gRPC or the data channel.

gRPC is the control plane and carries everything a server without the data channel needs.
When GetServerInfo advertises a data channel (data_channel.py), Forward and Backward move their
tensor bytes over it instead: sent from the caller's arrays and received into arrays allocated
(or passed in) before the request leaves, with no protobuf copy on either side.
"""
import json
import sys
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, Optional, Sequence, Tuple

import grpc
import numpy as np

from . import frames
from ._proto.attnserve.v1 import attention_pb2 as pb2
from ._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc
from .addresses import is_this_host, split_host_port, target_host
from .data_channel import DEFAULT_CHUNK_BYTES, DEFAULT_CONNECTIONS, DataChannel, Tls
from .errors import AttentionError
# forward_request and backward_request are imported from here by callers of earlier releases.
from .messages import (  # noqa: F401
    BackwardResult, Execution, ForwardResult, _check_answer, _grpc_result, _offsets, _output,
    _shape_only, _with_data, attention_options, backward_request, forward_request)
from .security import Security
from .shared_memory import DATATYPES, SharedMemoryPath, SharedMemoryUnavailable, request_parameters
from .tensors import numpy_dtype, wire_array

DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
# gRPC caps a retry policy at 5 attempts; more are silently treated as 5.
MAX_RETRIES = 4
SERVICE = "attnserve.v1.AttentionService"
TRANSPORTS = ("auto", "grpc")
SHARED_MEMORY = ("auto", "off")
# Calls moving fewer bytes than this take the data channel even where shared memory is on: a
# ModelInfer costs more than a data channel frame, and at 2 MB the two broke even on the H100
# host (0.13 MB: 0.83 against 0.52 ms; 34 MB: 3.6 against 4.9 ms; bench/RESULTS.md
# "Co-located clients").
SHARED_MEMORY_MIN_BYTES = 2 << 20
# The Open Inference Protocol's answers say nothing of where a request ran.
_UNREPORTED = Execution(device="", kernel="", queue_us=0, compute_us=0, batched_requests=0)
# GetServerInfo failures that every call of this client would meet too.
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
DEFAULT_ASYNC_WORKERS = 8


def service_config(retries: int, load_balancing: str) -> str:
    """The channel's default service config: the balancing policy over every address the target
    resolves to, and retries of UNAVAILABLE (server down, restarting or draining) with
    exponential backoff. Forward and Backward are pure functions of their request, so a retry is
    always safe; other codes are never retried: they would fail the same way again."""
    config = {"loadBalancingConfig": [{load_balancing: {}}]}
    if retries:
        config["methodConfig"] = [{
            "name": [{"service": SERVICE}],
            "retryPolicy": {
                "maxAttempts": retries + 1,
                "initialBackoff": "0.1s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }]
    return json.dumps(config)


class Client:
    """A connection to attnserve. Thread-safe; use one per process and share it.

    target is any gRPC target: "host:port", or "dns:///host:port" (every address the name
    resolves to, e.g. a Kubernetes headless service) or "ipv4:10.0.0.1:8001,10.0.0.2:8001", over
    which calls are spread with load_balancing ("round_robin"; "pick_first" for one server at a
    time). timeout is the default deadline in seconds for every call, retries included (None: no
    deadline); each call can override it. Calls failing with UNAVAILABLE are retried up to
    `retries` times (at most 4) with exponential backoff. Failed calls raise AttentionError.

    transport: "auto" (default) asks the server once (GetServerInfo, on the first call) whether
    it has a data channel and, if it does, moves Forward and Backward tensors over it
    (`data_connections` TCP connections, `chunk_bytes` per chunk, both capped by the server);
    else, and with "grpc", everything goes over gRPC. group_chunks (default True) sends a large
    multi-sequence call's chunks group by group in the order the server computes its groups
    of sequences, so it starts computing after about a quarter of the payload (False: payload
    order). The data channel is used when it is as
    secure as the channel: TLS with the same CA, client certificate and server name when the
    client uses TLS (and the server's data channel does), plain TCP when neither does. It goes
    to the replica that answered GetServerInfo (its advertised address, else the target's
    host), and needs a little-endian host. Result arrays from the data channel are writable
    arrays of their own; over gRPC they are read-only views of the response (copy them to
    modify in place). Both write into arrays the caller passes (out=, lse=, dq=, ...) when
    given.

    shared_memory: "auto" (default) passes the tensors of Forward and Backward through POSIX
    shared memory when the target is this host (loopback, "localhost", or this host's own name
    or addresses: addresses.is_this_host) and the server, started with
    --allow_shared_memory, maps the client's region, which the first call finds out by
    registering one; calls of less than SHARED_MEMORY_MIN_BYTES still take the data channel,
    which answers them sooner. Large calls are cut into chunks of sequences that the client
    copies on several threads while the server works on the last (shared_memory_call.py): a
    539 MB numpy forward moved 5.4-5.6x the bytes per second of a raw loopback socket and 2.5x
    the data channel's on the H100 host (bench/RESULTS.md). Else, and with "off", the paths
    above. The Open Inference Protocol has no saved contexts: a forward through shared memory
    keeps none (keep_context=True gets an empty context_id, which the contract allows) and the
    backward goes in full, which costs memcpys rather than network bytes. Results are the same, but their `execution` is not
    reported (empty device and kernel, zero times). The client's regions are unregistered and
    unlinked by close() and at interpreter exit.

    cuda_shared_memory: "auto" (default) passes the torch drop-in's CUDA tensors through CUDA
    shared memory when the server is on this host and started with --allow_shared_memory:
    one device buffer per GPU, registered once by its CUDA IPC handle (cuda_shared_memory.py),
    so the server's kernels read and write the client's GPU memory where it lies, with no
    copy across PCIe or a socket (measured 2.1x local FlashAttention-2 for a training step,
    bench/RESULTS.md); a buffer is registered under the server's ordinal of its GPU, found by
    the GPU's UUID in GetServerInfo (client and server may see different CUDA_VISIBLE_DEVICES),
    and a GPU the server does not serve takes the other paths. A server that refuses the buffer
    turns it off for this client.
    Backwards go in full (no saved contexts on this protocol), as device-to-device copies.

    Security (see attnserve.security): tls_ca_file (PEM CA of the server's certificate; tls=True
    alone uses the system's roots), tls_cert_file + tls_key_file (a client certificate, for
    mTLS), server_name (the name the server's certificate carries, when not the target's host),
    token (sent as "authorization: Bearer <token>" on every call, and in the data channel's
    HELLO), or a whole `security`; `credentials` (grpc.ChannelCredentials) replaces the TLS
    settings.
    """

    def __init__(self, target: str = "localhost:8001", timeout: Optional[float] = None, *,
                 retries: int = MAX_RETRIES, load_balancing: str = "round_robin",
                 tls: bool = False, tls_ca_file: Optional[str] = None,
                 tls_cert_file: Optional[str] = None, tls_key_file: Optional[str] = None,
                 server_name: Optional[str] = None, token: Optional[str] = None,
                 security: Optional[Security] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence[Tuple[str, object]] = (),
                 transport: str = "auto", data_connections: int = DEFAULT_CONNECTIONS,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 async_workers: int = DEFAULT_ASYNC_WORKERS, group_chunks: bool = True,
                 shared_memory: str = "auto", cuda_shared_memory: str = "auto"):
        if not 0 <= retries <= MAX_RETRIES:
            raise ValueError(f"retries must be in [0, {MAX_RETRIES}], got {retries}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        if shared_memory not in SHARED_MEMORY:
            raise ValueError(f"shared_memory must be one of {SHARED_MEMORY}, "
                             f"got {shared_memory!r}")
        if cuda_shared_memory not in SHARED_MEMORY:
            raise ValueError(f"cuda_shared_memory must be one of {SHARED_MEMORY}, "
                             f"got {cuda_shared_memory!r}")
        if security is not None and (tls or tls_ca_file or tls_cert_file or tls_key_file
                                     or server_name or token):
            raise ValueError("pass either security or its parts (tls*, server_name, token)")
        if security is None:
            security = Security(tls=tls, tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
                                tls_key_file=tls_key_file, server_name=server_name, token=token)
        self.target = target
        self.security = security
        self.retries = retries
        self.transport = transport
        self.data_connections = data_connections
        self.chunk_bytes = chunk_bytes
        self.async_workers = async_workers
        self.group_chunks = group_chunks
        self._metadata = security.call_metadata()
        # Credentials of the caller's own making: the data channel cannot copy them for TLS.
        self._custom_credentials = credentials is not None
        # Kept to make clients of the same kind for other replicas (contexts held there).
        self._peer_settings = dict(retries=retries, security=security, credentials=credentials,
                                   max_message_bytes=max_message_bytes, options=tuple(options),
                                   transport=transport, data_connections=data_connections,
                                   chunk_bytes=chunk_bytes, async_workers=async_workers,
                                   group_chunks=group_chunks, shared_memory=shared_memory,
                                   cuda_shared_memory=cuda_shared_memory)
        if credentials is None:
            credentials = security.channel_credentials()
        # gRPC's 4 MiB default receive limit is far below one realistic attention request, and
        # a call whose request outgrows the retry buffer (256 KiB by default) is never retried.
        channel_options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
            ("grpc.service_config", service_config(retries, load_balancing)),
            *security.channel_options(),
            *options,
        ]
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=channel_options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=channel_options)
        self.stub = pb2_grpc.AttentionServiceStub(self._channel)
        self.timeout = timeout
        self._lock = threading.Lock()
        # Held through the first call's GetServerInfo, so apart from _lock.
        self._transport_lock = threading.Lock()
        self._transport_decided = transport == "grpc"
        self._data: Optional[DataChannel] = None
        # The gRPC address of the replica the data channel reaches, as it advertises it.
        self._replica_address = ""
        self._peers: Dict[str, "Client"] = {}
        self._pool: Optional[ThreadPoolExecutor] = None
        # Decided on the first call that could use it, apart from _lock (it registers a region).
        self._shm_lock = threading.Lock()
        self._shm_decided = shared_memory == "off"
        self._shm: Optional[SharedMemoryPath] = None
        self._shm_finalizer: Optional[weakref.finalize] = None
        # CUDA tensors' path (cuda_shared_memory.py), decided on the first CUDA call.
        self._cuda_lock = threading.Lock()
        self._cuda_decided = cuda_shared_memory == "off"
        self._cuda = None

    # --- transport ----------------------------------------------------------------------------

    def _call(self, method, request, timeout):
        try:
            return method(request, timeout=self._deadline(timeout), metadata=self._metadata)
        except grpc.RpcError as error:
            raise AttentionError(error.code(), error.details()) from error

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout

    def _data_channel(self) -> Optional[DataChannel]:
        """The data channel, when the server has one this client may use; decided on the first
        call (a GetServerInfo) and kept."""
        with self._lock:
            if self._transport_decided:
                return self._data
            info = None
            try:
                info = self.server_info()
            except AttentionError as error:
                if error.code in _REFUSED:
                    raise  # the call itself would be refused the same way
                if error.code != grpc.StatusCode.UNIMPLEMENTED:
                    return None  # this call goes over gRPC (and fails there); ask later
            self._data = self._open_data_channel(info)
            self._transport_decided = True
            return self._data

    def _open_data_channel(self, info: Optional[pb2.ServerInfo]) -> Optional[DataChannel]:
        if info is None or not info.HasField("data_channel"):
            return None
        advertised = info.data_channel
        # Exactly as protected as the channel: a TLS client never sends tokens or tensors in
        # the clear (to a plaintext data port behind a TLS-terminating proxy, say), and TLS
        # needs this client's own TLS settings.
        if advertised.tls != self.security.uses_tls or (advertised.tls and
                                                        self._custom_credentials):
            return None
        if advertised.protocol_version != frames.PROTOCOL_VERSION or sys.byteorder != "little":
            return None
        if advertised.address:
            address = split_host_port(advertised.address)
        else:
            host = target_host(self.target)
            address = (host, advertised.port) if host and advertised.port else None
        if address is None:
            return None
        connections = self.data_connections
        if advertised.max_connections_per_session > 0:
            connections = min(connections, advertised.max_connections_per_session)
        chunk_bytes = self.chunk_bytes
        if advertised.max_chunk_bytes > 0:
            chunk_bytes = min(chunk_bytes, advertised.max_chunk_bytes)
        tls = None
        if advertised.tls:
            # The name gRPC checks: the override, else the target's host.
            name = self.security.server_name or target_host(self.target) or address[0]
            tls = Tls(self.security.ssl_context(), name)
        self._replica_address = info.address
        return DataChannel(*address, token=self.security.token, connections=connections,
                           chunk_bytes=chunk_bytes, tls=tls, group_chunks=self.group_chunks)

    def _shared_memory(self) -> Optional[SharedMemoryPath]:
        """The shared-memory path, when the server is on this host and maps this client's
        regions; decided on the first call (a region registered) and kept."""
        if self._shm_decided:
            return self._shm
        with self._shm_lock:
            if self._shm_decided:
                return self._shm
            if not self._server_on_this_host():
                self._shm_decided = True
                return None
            path = SharedMemoryPath(self._channel, self._metadata)
            try:
                path.ensure_registered()
            except SharedMemoryUnavailable as error:
                path.close()
                self._shm_decided = error.permanent  # else ask again on the next call
                return None
            except AttentionError:  # refused: so would the call be, with the same answer
                path.close()
                raise
            # Unregistered and unlinked at close(), when the client is collected, or at exit.
            self._shm_finalizer = weakref.finalize(self, path.close)
            self._shm = path
            self._shm_decided = True
            return path

    def _server_on_this_host(self) -> bool:
        host = target_host(self.target)
        # The server is Linux-only: a client on another system has its server in a VM.
        return (host is not None and is_this_host(host) and sys.platform == "linux"
                and sys.byteorder == "little")

    def _cuda_shared_memory(self):
        """The CUDA shared memory path (cuda_shared_memory.CudaSharedMemoryPath) when the server
        is on this host; whether it maps this client's memory the first call's registration
        tells (and a refusal turns it off)."""
        if self._cuda_decided:
            return self._cuda
        with self._cuda_lock:
            if not self._cuda_decided:
                if self._server_on_this_host():
                    from .cuda_shared_memory import CudaSharedMemoryPath
                    self._cuda = CudaSharedMemoryPath(self._channel, self._metadata)
                    weakref.finalize(self, self._cuda.close)
                self._cuda_decided = True
            return self._cuda

    def cuda_call(self, model, inputs, inline, outputs, options, deterministic, timeout):
        """One call of CUDA tensors through CUDA shared memory (CudaSharedMemoryPath.call), or
        None when it must go another way (after which it stays off if no later call can go)."""
        path = self._cuda_shared_memory()
        if path is None:
            return None
        try:
            return path.call(model, inputs, inline, outputs,
                             request_parameters(options, deterministic), self._deadline(timeout))
        except SharedMemoryUnavailable as error:
            if error.permanent:
                with self._cuda_lock:
                    self._cuda = None
                path.close()
            return None

    def _disable_shared_memory(self) -> None:
        with self._shm_lock:
            finalizer, self._shm_finalizer = self._shm_finalizer, None
            self._shm, self._shm_decided = None, True
        if finalizer is not None:
            finalizer()

    def _shared_memory_call(self, model, inputs, inline, outputs, parameters, timeout) -> bool:
        """One call through shared memory (see SharedMemoryPath.call); False when it must go
        another way, after which shared memory stays off if it cannot serve later calls."""
        path = self._shared_memory()
        if path is None:
            return False
        try:
            path.call(model, inputs, inline, outputs, parameters, self._deadline(timeout))
            return True
        except SharedMemoryUnavailable as error:
            if error.permanent:
                self._disable_shared_memory()
            return False

    def _takes_shared_memory(self, payload: int) -> bool:
        """Whether a call moving `payload` bytes (in and out) goes through shared memory: the
        path is on and, where a data channel would take it instead, the call is large enough
        to gain from it (below SHARED_MEMORY_MIN_BYTES the data channel answered first)."""
        if self._shared_memory() is None:
            return False
        return payload >= SHARED_MEMORY_MIN_BYTES or self._data_channel() is None

    def active_transport(self) -> str:
        """"shared_memory", "data_channel" or "grpc": where this client's Forward and Backward
        go now (a backward on a context kept before shared memory was decided goes where the
        context is)."""
        if self._shared_memory() is not None:
            return "shared_memory"
        return "grpc" if self._data_channel() is None else "data_channel"

    def _data_call(self, channel: DataChannel, kind: str, message, payload, outputs, timeout):
        """channel.call with gRPC's retry policy: UNAVAILABLE (a lost session) is retried with
        exponential backoff within the deadline; the call is a pure function of its request."""
        timeout = self._deadline(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        for attempt in range(self.retries + 1):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return channel.call(kind, message, payload, outputs, remaining)
            except AttentionError as error:
                backoff = min(2.0, 0.1 * 2 ** attempt)
                if (error.code != grpc.StatusCode.UNAVAILABLE or attempt == self.retries
                        or deadline is not None and time.monotonic() + backoff >= deadline):
                    raise
                time.sleep(backoff)
        raise AssertionError("unreachable")

    # --- calls --------------------------------------------------------------------------------

    def forward(self, q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                window_size=(-1, -1), softcap=0.0, *, keep_context=False, timeout=None,
                out: Optional[np.ndarray] = None,
                lse: Optional[np.ndarray] = None) -> ForwardResult:
        """flash_attn_varlen_func's forward: out and lse for packed q [total_q, H, D],
        k and v [total_k, H_k, D] (float16, float32 or bfloat16, all the same dtype).

        keep_context=True asks the server to keep what a Backward needs; the result's
        context_id (empty if the server keeps none) then goes to backward(context_id=...), or
        to release_context if no backward follows. out= and lse= are arrays to write the
        results into (C-contiguous, writable, of the results' shapes and dtypes)."""
        options = attention_options(softmax_scale=softmax_scale, causal=causal,
                                    window_size=window_size, softcap=softcap)
        (q_enum, q_wire), (k_enum, k_wire), (v_enum, v_wire) = (
            wire_array(q, "q"), wire_array(k, "k"), wire_array(v, "v"))
        offsets = dict(cu_seqlens_q=_offsets(cu_seqlens_q, "cu_seqlens_q"),
                       cu_seqlens_k=_offsets(cu_seqlens_k, "cu_seqlens_k"))
        if q_wire.ndim == 3 and self._takes_shared_memory(
                4 * q_wire.nbytes + q_wire.shape[0] * q_wire.shape[1] * 4):
            total_q, heads = q_wire.shape[:2]
            result_out = _output(out, q_wire.shape, numpy_dtype(q_enum), "out")
            result_lse = _output(lse, (heads, total_q), np.dtype(np.float32), "lse")
            if self._shared_memory_call(
                    "attention_forward",
                    [(name, DATATYPES[enum], wire) for name, enum, wire in
                     (("q", q_enum, q_wire), ("k", k_enum, k_wire), ("v", v_enum, v_wire))],
                    [(name, np.asarray(values)) for name, values in offsets.items()],
                    [("out", result_out), ("lse", result_lse)],
                    request_parameters(options, None), timeout):
                return ForwardResult(out=result_out, lse=result_lse, execution=_UNREPORTED)
        # Malformed shapes go to gRPC, whose answer names the field; the data channel must size
        # the answer before it asks.
        channel = self._data_channel() if q_wire.ndim == 3 else None
        if channel is None:
            request = pb2.ForwardRequest(q=_with_data(q_wire, q_enum),
                                         k=_with_data(k_wire, k_enum),
                                         v=_with_data(v_wire, v_enum), options=options,
                                         keep_context=keep_context, **offsets)
            response = self._call(self.stub.Forward, request, timeout)
            result_out = _grpc_result(response.out, out, "out")
            result_lse = _grpc_result(response.lse, lse, "lse")
        else:
            request = pb2.ForwardRequest(q=_shape_only(q_wire, q_enum),
                                         k=_shape_only(k_wire, k_enum),
                                         v=_shape_only(v_wire, v_enum), options=options,
                                         keep_context=keep_context, **offsets)
            total_q, heads = q_wire.shape[:2]
            result_out = _output(out, q_wire.shape, numpy_dtype(q_enum), "out")
            result_lse = _output(lse, (heads, total_q), np.dtype(np.float32), "lse")
            response = self._data_call(channel, "forward", request, [q_wire, k_wire, v_wire],
                                       [result_out, result_lse], timeout)
            _check_answer(response.out, result_out, "out")
            _check_answer(response.lse, result_lse, "lse")
        return ForwardResult(out=result_out, lse=result_lse,
                             execution=Execution.from_proto(response.execution),
                             context_id=response.context_id,
                             context_address=response.context_address)

    def backward(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale=None,
                 causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False, *,
                 context_id: str = "", context_address: str = "", keep_context: bool = False,
                 timeout=None, dq: Optional[np.ndarray] = None, dk: Optional[np.ndarray] = None,
                 dv: Optional[np.ndarray] = None) -> BackwardResult:
        """Gradients dq, dk, dv given dout and the forward's out and lse (float32).

        With a context_id (and the context_address) of a forward that kept one, only dout is
        sent, to the replica holding the context; q, k and v are then read for their shapes
        only, and out and lse not at all, unless the server no longer has the context
        (NOT_FOUND): then the whole request is sent, without the caller noticing. So they may
        be anything with .shape whose np.asarray() makes the array, fetched only then. The
        context is released unless keep_context. dq=, dk=, dv= are arrays to write into."""
        options = attention_options(softmax_scale=softmax_scale, causal=causal,
                                    window_size=window_size, softcap=softcap)
        full = dict(q=q, k=k, v=v, out=out, lse=lse,
                    cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, options=options)
        outputs = dict(dq=dq, dk=dk, dv=dv)
        if not context_id:
            return self._backward(dout, full, deterministic, "", False, timeout, outputs)
        route = self._for_context(context_address)
        try:
            shapes = dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
            return route._backward(dout, shapes, deterministic, context_id, keep_context,
                                   timeout, outputs)
        except AttentionError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                fallback = route
            elif error.code == grpc.StatusCode.UNAVAILABLE and route is not self:
                fallback = self  # the replica holding the context is gone; any one will do
            else:
                raise
        return fallback._backward(dout, full, deterministic, "", False, timeout, outputs)

    def _backward(self, dout, inputs, deterministic, context_id, keep_context, timeout,
                  outputs) -> BackwardResult:
        """One Backward: with a context_id, `inputs` holds q, k, v for their shapes only, and
        the offsets (sent when given: they must be the context's, and let the server run the
        backward group by group as dout arrives); else every input of a full request."""
        dout_enum, dout_wire = wire_array(dout, "dout")
        shapes = [tuple(inputs[name].shape) for name in ("q", "k", "v")]
        names = ("dout",) if context_id else ("dout", "q", "k", "v", "out", "lse")
        wires = {"dout": (dout_enum, dout_wire)}
        wires.update((name, wire_array(inputs[name], name)) for name in names[1:])
        fields = dict(deterministic=deterministic, context_id=context_id,
                      keep_context=keep_context)
        if not context_id or inputs["cu_seqlens_q"] is not None:
            fields.update(cu_seqlens_q=_offsets(inputs["cu_seqlens_q"], "cu_seqlens_q"),
                          cu_seqlens_k=_offsets(inputs["cu_seqlens_k"], "cu_seqlens_k"))
        if not context_id:
            fields.update(options=inputs["options"])
        if (not context_id and all(len(s) == 3 for s in shapes) and self._takes_shared_memory(
                2 * sum(wire.nbytes for _, wire in wires.values()))):
            dtype = numpy_dtype(dout_enum)  # the server requires dout's dtype to be q's
            grads = {name: _output(outputs[name], shape, dtype, name)
                     for name, shape in zip(("dq", "dk", "dv"), shapes)}
            if self._shared_memory_call(
                    "attention_backward",
                    [(name, DATATYPES[enum], wire) for name, (enum, wire) in wires.items()],
                    [(name, np.asarray(fields[name])) for name in ("cu_seqlens_q", "cu_seqlens_k")],
                    list(grads.items()), request_parameters(inputs["options"], deterministic),
                    timeout):
                return BackwardResult(execution=_UNREPORTED, **grads)
        channel = self._data_channel() if all(len(s) == 3 for s in shapes) else None
        if channel is None:
            request = pb2.BackwardRequest(
                **{name: _with_data(wire, enum) for name, (enum, wire) in wires.items()},
                **fields)
            response = self._call(self.stub.Backward, request, timeout)
            grads = {name: _grpc_result(getattr(response, name), outputs[name], name)
                     for name in ("dq", "dk", "dv")}
        else:
            request = pb2.BackwardRequest(
                **{name: _shape_only(wire, enum) for name, (enum, wire) in wires.items()},
                **fields)
            dtype = numpy_dtype(dout_enum)  # the server requires dout's dtype to be q's
            grads = {name: _output(outputs[name], shape, dtype, name)
                     for name, shape in zip(("dq", "dk", "dv"), shapes)}
            response = self._data_call(channel, "backward", request,
                                       [wire for _, wire in wires.values()],
                                       list(grads.values()), timeout)
            for name, array in grads.items():
                _check_answer(getattr(response, name), array, name)
        return BackwardResult(execution=Execution.from_proto(response.execution), **grads)

    def release_context(self, context_id: str, *, context_address: str = "",
                        timeout=None) -> bool:
        """Frees a context that no backward will use; False if the server had no such context
        (already used, released, expired or evicted)."""
        route = self._for_context(context_address)
        response = route._call(route.stub.ReleaseContext,
                               pb2.ReleaseContextRequest(context_id=context_id), timeout)
        return response.released

    def _for_context(self, address: str) -> "Client":
        """The client whose calls reach the replica at `address` (this one, unless the target
        spreads calls over several replicas and the context lives on another)."""
        if not address or address in (self.target, self._replica_address):
            return self
        with self._lock:
            peer = self._peers.get(address)
            if peer is None:
                peer = self._peers[address] = Client(address, self.timeout,
                                                     load_balancing="pick_first",
                                                     **self._peer_settings)
            return peer

    # --- async --------------------------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.async_workers,
                                                thread_name_prefix="attnserve-call")
            return self._pool

    def forward_async(self, *args, **kwargs) -> "Future[ForwardResult]":
        """forward(...) run in the background (at most async_workers calls at once, the rest
        queued); the arguments must stay unchanged until the future is done."""
        return self._executor().submit(self.forward, *args, **kwargs)

    def backward_async(self, *args, **kwargs) -> "Future[BackwardResult]":
        """backward(...) run in the background, as forward_async."""
        return self._executor().submit(self.backward, *args, **kwargs)

    # --- the rest -----------------------------------------------------------------------------

    def server_info(self, *, timeout=None) -> pb2.ServerInfo:
        """Version, devices, kernel families and limits, as the attnserve.v1.ServerInfo proto."""
        return self._call(self.stub.GetServerInfo, pb2.GetServerInfoRequest(), timeout)

    def close(self) -> None:
        with self._transport_lock:
            data, self._data = self._data, None
            self._transport_decided = True
        with self._lock:
            pool, self._pool = self._pool, None
            peers, self._peers = list(self._peers.values()), {}
        if pool is not None:
            pool.shutdown(wait=False)
        self._disable_shared_memory()
        with self._cuda_lock:
            cuda, self._cuda, self._cuda_decided = self._cuda, None, True
        if cuda is not None:
            cuda.close()
        for peer in peers:
            peer.close()
        if data is not None:
            data.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
