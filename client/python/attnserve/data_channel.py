"""The client side of the data channel (proto/attnserve/v1/data_channel.proto): tensor bytes
over several TCP connections beside gRPC (TLS on each when the server speaks it: tls_socket.py),
sent from and received into the caller's own buffers.

A DataChannel holds one session to one server: `connections` TCP connections that all said
HELLO with the same random session id. Per connection, a sender thread drains a queue of frames
(sendmsg on memoryviews: the GIL is released and tensor bytes are never copied) and a reader
thread dispatches incoming frames to the pending calls by request_id, receiving CHUNK bytes with
recv_into straight into the call's response arrays at their offsets.

A call: REQUEST (tensors with shapes, no data) on one connection, its payload right behind it
when it fits one chunk or the server's max_inline_bytes (DataRequest.inline_payload), else after
the server's ACCEPTED as chunks spread over every connection;
then RESPONSE and the response's CHUNKs, in any order. The call completes when the RESPONSE has
come and every response byte is in. Response arrays are sized by the caller from the shapes it
expects, before the REQUEST leaves, so nothing is buffered twice; each chunk is checked against
them (in range, no byte twice) before a byte is read.

Any connection lost fails every pending call of the session with UNAVAILABLE and discards the
session; the next call opens a new one. Thread-safe: calls from many threads run at once.
"""
import bisect
import itertools
import os
import queue
import socket
import ssl
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import List, Optional, Sequence, Tuple

import grpc
import numpy as np

from . import frames, groups
from ._proto.attnserve.v1 import data_channel_pb2 as dc_pb2
from .errors import AttentionError
from .tensors import byte_view
from .tls_socket import connect_tls

DEFAULT_CONNECTIONS = 4
DEFAULT_CHUNK_BYTES = 4 << 20
MIN_CHUNK_BYTES = 64 << 10  # the spec's lower bound for DataRequest.chunk_bytes
CONNECT_TIMEOUT_S = 10.0

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_code(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a wire code; UNKNOWN for values gRPC does not define."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


class _Layout:
    """Several flat byte buffers seen as one: a request's payload or a response's tensors."""

    def __init__(self, arrays: Sequence[np.ndarray]):
        # Empty buffers are left out so that every offset maps to exactly one buffer.
        self.views: List[memoryview] = [byte_view(a) for a in arrays if a.nbytes]
        self.starts: List[int] = list(itertools.accumulate(
            [0] + [v.nbytes for v in self.views[:-1]]))
        self.total = sum(v.nbytes for v in self.views)

    def pieces(self, offset: int, length: int) -> List[memoryview]:
        """Views of bytes [offset, offset + length), which the caller has checked are in
        range."""
        result = []
        index = bisect.bisect_right(self.starts, offset) - 1
        end = offset + length
        while offset < end:
            view, start = self.views[index], self.starts[index]
            take = min(end, start + view.nbytes) - offset
            result.append(view[offset - start:offset - start + take])
            offset += take
            index += 1
        return result


class _Call:
    """One request in flight. Mutable state is guarded by its session's lock."""

    def __init__(self, request_id: int, connection: int, payload: _Layout, outputs: _Layout,
                 chunk_bytes: int, chunk_offsets: List[int]):
        self.request_id = request_id
        self.connection = connection  # where its REQUEST (and a CANCEL) goes
        self.payload = payload
        self.outputs = outputs
        self.chunk_bytes = chunk_bytes
        self.chunk_offsets = chunk_offsets  # the order its chunks go in
        self.future: Future = Future()
        self.response: Optional[dc_pb2.DataResponse] = None
        self.accepted = False
        self.inline = False  # its chunks went right behind the REQUEST: no ACCEPTED comes
        self.request_sent = False
        self.finished = False
        # Response byte ranges claimed by chunks, as sorted disjoint [start, end) pairs, and
        # the bytes of them fully received.
        self._starts: List[int] = []
        self._ends: List[int] = []
        self.received_bytes = 0

    def claim(self, offset: int, length: int) -> Optional[str]:
        """Reserves a response chunk's range; a description of what is wrong with it, if
        anything."""
        where = f"CHUNK of request {self.request_id} at offset {offset} ({length} bytes)"
        if length == 0:
            return f"{where}: empty"
        if offset + length > self.outputs.total:
            return f"{where} runs past the response's {self.outputs.total} bytes"
        index = bisect.bisect_right(self._starts, offset)
        if index and self._ends[index - 1] > offset or \
                index < len(self._starts) and self._starts[index] < offset + length:
            return f"{where} overlaps bytes already received"
        self._starts.insert(index, offset)
        self._ends.insert(index, offset + length)
        return None

    def complete(self) -> bool:
        return self.response is not None and self.received_bytes == self.outputs.total


class _ServerClosed(Exception):
    """The server sent ERROR: it refused the session or saw a protocol error, and closes."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class Tls:
    """TLS for a data channel: the context (CA, client certificate) and the name the server's
    certificate must carry."""

    def __init__(self, context: ssl.SSLContext, server_name: str):
        self.context = context
        self.server_name = server_name


def _connect(host: str, port: int, session_id: bytes, token: Optional[str],
             timeout: float, tls: Optional[Tls]):
    """A connection that said HELLO (after the TLS handshake, with `tls`), and the server's
    DataHelloOk."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = connect_tls(sock, tls.context, tls.server_name, timeout)
        hello = dc_pb2.DataHello(protocol_version=frames.PROTOCOL_VERSION,
                                 session_id=session_id, token=token or "")
        frames.send_views(sock, [frames.message_frame(frames.HELLO, hello)])
        header = frames.recv_header(sock)
        if header.type == frames.ERROR:
            error = frames.recv_message(sock, header, dc_pb2.DataError)
            raise _ServerClosed(error.code, error.message)
        if header.type != frames.HELLO_OK:
            raise frames.ProtocolError(f"{header.name()} in answer to HELLO")
        ok = frames.recv_message(sock, header, dc_pb2.DataHelloOk)
        sock.settimeout(None)  # readers block for as long as calls are pending
        return sock, ok
    except BaseException:
        sock.close()
        raise


class _Session:
    """The connections of one HELLO'd session, their threads, and the calls pending on it."""

    def __init__(self, host: str, port: int, token: Optional[str], connections: int,
                 chunk_bytes: int, connect_timeout: float, tls: Optional[Tls]):
        self.address = f"{host}:{port}"
        self.session_id = os.urandom(16)
        self._lock = threading.Lock()
        self._calls = {}
        # Calls given up here (deadline, error) whose late frames are read and dropped.
        self._abandoned = set()
        self._ids = itertools.count(1)
        self._next_connection = itertools.count()
        self.error: Optional[AttentionError] = None
        first, ok = _connect(host, port, self.session_id, token, connect_timeout, tls)
        self.sockets = [first]
        try:
            count = max(1, min(connections, ok.max_connections_per_session or connections))
            for _ in range(count - 1):
                self.sockets.append(_connect(host, port, self.session_id, token,
                                             connect_timeout, tls)[0])
        except BaseException:
            for sock in self.sockets:
                sock.close()
            raise
        limit = ok.max_chunk_bytes or chunk_bytes
        self.chunk_bytes = max(MIN_CHUNK_BYTES, min(chunk_bytes, limit))
        # Payloads up to this go right behind their REQUEST (inline_payload); 0 from servers
        # that take only one chunk that way.
        self.max_inline_bytes = ok.max_inline_bytes
        self._slots = (threading.BoundedSemaphore(ok.max_requests_per_session)
                       if ok.max_requests_per_session > 0 else None)
        self._queues = [queue.SimpleQueue() for _ in self.sockets]
        self._senders = []
        for index, sock in enumerate(self.sockets):
            sender = threading.Thread(target=self._send_loop, args=(index, sock), daemon=True,
                                      name=f"attnserve-dc-send-{index}")
            sender.start()
            self._senders.append(sender)
            threading.Thread(target=self._read_loop, args=(index, sock), daemon=True,
                             name=f"attnserve-dc-read-{index}").start()

    # --- calls --------------------------------------------------------------------------------

    def submit(self, kind: str, message, payload: _Layout, outputs: _Layout,
               timeout_ms: int, timeout: Optional[float],
               group_tensors: Optional[Sequence[Tuple[int, str]]] = None) -> _Call:
        """Sends the REQUEST. `group_tensors` (each payload tensor's bytes and the rows a group
        needs, groups.chunk_offsets) puts the chunks in the server's group order; None sends
        them in payload order."""
        if self._slots is not None and not self._slots.acquire(timeout=timeout):
            raise AttentionError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 f"data channel {self.address}: no request slot of the "
                                 "session freed up before the deadline")
        request_id = next(self._ids)
        if group_tensors is not None:
            offsets = groups.chunk_offsets(message.cu_seqlens_q, message.cu_seqlens_k,
                                           group_tensors, payload.total, self.chunk_bytes)
        else:
            offsets = list(range(0, payload.total, self.chunk_bytes))
        call = _Call(request_id, next(self._next_connection) % len(self.sockets), payload,
                     outputs, self.chunk_bytes, offsets)
        request = dc_pb2.DataRequest(payload_bytes=payload.total, chunk_bytes=self.chunk_bytes,
                                     timeout_ms=timeout_ms)
        getattr(request, kind).CopyFrom(message)
        # Small: right behind the REQUEST on its connection, no round trip for ACCEPTED (one
        # chunk always; up to the server's max_inline_bytes when the REQUEST says so).
        call.inline = 0 < payload.total <= max(self.chunk_bytes, self.max_inline_bytes)
        request.inline_payload = call.inline and payload.total > self.chunk_bytes
        views = [frames.message_frame(frames.REQUEST, request, request_id)]
        if call.inline:
            for offset in offsets:
                length = min(self.chunk_bytes, payload.total - offset)
                views.append(frames.pack_header(frames.CHUNK, request_id, offset, length))
                views += payload.pieces(offset, length)
        with self._lock:
            if self.error is not None:
                self._release_slot()
                raise self.error
            self._calls[request_id] = call
        self._queues[call.connection].put((call, views, True))
        return call

    def abandon(self, call: _Call, error: AttentionError) -> None:
        """Gives up on a call here (its deadline passed): fails it and tells the server."""
        with self._lock:
            sent = call.request_sent
        if self._finish(call, error) and sent:
            cancel = frames.pack_header(frames.CANCEL, call.request_id)
            self._queues[call.connection].put((None, [cancel], False))

    def _release_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def _finish(self, call: _Call, error: Optional[AttentionError] = None) -> bool:
        """Resolves the call's future once; False if it already was."""
        with self._lock:
            if call.finished:
                return False
            call.finished = True
            self._calls.pop(call.request_id, None)
            if error is not None:
                self._abandoned.add(call.request_id)
        self._release_slot()
        if error is None:
            call.future.set_result(call.response)
        else:
            call.future.set_exception(error)
        return True

    def fail(self, error: AttentionError) -> None:
        """Ends the session: every pending call fails with `error`, the threads stop."""
        with self._lock:
            if self.error is not None:
                return
            self.error = error
            calls = list(self._calls.values())
        for sock in self.sockets:
            try:
                # Wakes the threads blocked on this socket; each reader closes its own.
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for q in self._queues:
            q.put(None)
        for call in calls:
            self._finish(call, error)

    # --- threads ------------------------------------------------------------------------------

    def _send_loop(self, index: int, sock: socket.socket) -> None:
        q = self._queues[index]
        while True:
            item = q.get()
            if item is None:
                return
            call, views, is_request = item
            # A call that already failed (deadline, error RESPONSE) sends nothing more.
            if call is not None and call.finished:
                continue
            try:
                frames.send_views(sock, views)
            except OSError as error:
                self.fail(AttentionError(grpc.StatusCode.UNAVAILABLE,
                                         f"data channel {self.address}: sending on connection "
                                         f"{index} failed: {error}"))
                return
            if is_request:
                with self._lock:
                    call.request_sent = True

    def _read_loop(self, index: int, sock: socket.socket) -> None:
        try:
            while True:
                header = frames.recv_header(sock)
                if header.type == frames.CHUNK:
                    self._on_chunk(sock, header)
                elif header.type == frames.RESPONSE:
                    self._on_response(header, frames.recv_message(sock, header,
                                                                  dc_pb2.DataResponse))
                elif header.type == frames.ACCEPTED:
                    frames.recv_message(sock, header, dc_pb2.DataAccepted)
                    self._on_accepted(header)
                elif header.type == frames.ERROR:
                    error = frames.recv_message(sock, header, dc_pb2.DataError)
                    raise _ServerClosed(error.code, error.message)
                else:
                    raise frames.ProtocolError(f"unexpected {header.name()} (request "
                                               f"{header.request_id}) on an open session")
        except frames.ProtocolError as error:
            self.fail(AttentionError(grpc.StatusCode.INTERNAL,
                                     f"data channel {self.address}: protocol error on "
                                     f"connection {index}: {error}"))
        except _ServerClosed as error:
            self.fail(AttentionError(status_code(error.code),
                                     f"data channel {self.address} closed connection {index}: "
                                     f"{error}"))
        except OSError as error:  # ConnectionClosed included
            self.fail(AttentionError(grpc.StatusCode.UNAVAILABLE,
                                     f"data channel {self.address}: connection {index} lost: "
                                     f"{error or type(error).__name__}"))
        except Exception as error:  # a bug here must still fail the calls, not hang them
            self.fail(AttentionError(grpc.StatusCode.INTERNAL,
                                     f"data channel {self.address}: reader of connection "
                                     f"{index} failed: {error!r}"))
        finally:
            # The sender may still be inside sendmsg on this socket; closing first could hand
            # its descriptor to another socket.
            self._senders[index].join()
            sock.close()

    def _lookup(self, header: frames.Header) -> Optional[_Call]:
        """The pending call a frame is for; None for one abandoned here (drop the frame)."""
        call = self._calls.get(header.request_id)
        if call is None and header.request_id not in self._abandoned:
            raise frames.ProtocolError(f"{header.name()} for unknown request "
                                       f"{header.request_id}")
        return call

    def _on_chunk(self, sock: socket.socket, header: frames.Header) -> None:
        with self._lock:
            call = self._lookup(header)
            if call is not None:
                problem = call.claim(header.offset, header.length)
                if problem:
                    raise frames.ProtocolError(problem)
        if call is None:
            frames.skip(sock, header.length)
            return
        # Outside the lock: other connections fill other ranges of the same arrays meanwhile.
        for piece in call.outputs.pieces(header.offset, header.length):
            frames.recv_into_exactly(sock, piece)
        with self._lock:
            call.received_bytes += header.length
            done = call.complete() and not call.finished
        if done:
            self._finish(call)

    def _on_response(self, header: frames.Header, response: dc_pb2.DataResponse) -> None:
        with self._lock:
            call = self._lookup(header)
            if call is None:
                return
            if call.response is not None:
                raise frames.ProtocolError(f"second RESPONSE for request {call.request_id}")
            call.response = response
            done = call.complete()
        if response.code:
            self._finish(call, AttentionError(status_code(response.code), response.message))
        elif response.payload_bytes != call.outputs.total:
            self._finish(call, AttentionError(
                grpc.StatusCode.INTERNAL,
                f"data channel {self.address}: RESPONSE of request {call.request_id} announces "
                f"{response.payload_bytes} payload bytes; its shapes need "
                f"{call.outputs.total}"))
        elif done:
            self._finish(call)

    def _on_accepted(self, header: frames.Header) -> None:
        with self._lock:
            call = self._lookup(header)
            if call is None:
                return
            if call.accepted:
                raise frames.ProtocolError(f"second ACCEPTED for request {call.request_id}")
            call.accepted = True
        if call.inline:
            return  # its payload went with the REQUEST already
        count = len(self.sockets)
        for number, offset in enumerate(call.chunk_offsets):
            length = min(call.chunk_bytes, call.payload.total - offset)
            views = [frames.pack_header(frames.CHUNK, call.request_id, offset, length),
                     *call.payload.pieces(offset, length)]
            # Spread from the REQUEST's connection on, so concurrent calls start on different
            # connections.
            self._queues[(call.connection + number) % count].put((call, views, False))


class DataChannel:
    """A client's data channel to one server (host, port): one session, reopened on the next
    call after it fails. `token` is the bearer token the gRPC calls carry; `tls`, for a server
    whose DataChannelInfo.tls is set, the gRPC channel's CA, client certificate and server
    name. `group_chunks` (default on) sends a large multi-sequence call's chunks group by
    group, in the order the server computes them (groups.py), so it starts early; off, in
    payload order."""

    def __init__(self, host: str, port: int, *, token: Optional[str] = None,
                 connections: int = DEFAULT_CONNECTIONS,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 connect_timeout: float = CONNECT_TIMEOUT_S,
                 tls: Optional[Tls] = None, group_chunks: bool = True):
        if connections < 1:
            raise ValueError(f"connections must be at least 1, got {connections}")
        self.host, self.port = host, port
        self.address = f"{host}:{port}"
        self.token = token
        self.connections = connections
        self.chunk_bytes = chunk_bytes
        self.connect_timeout = connect_timeout
        self.tls = tls
        self.group_chunks = group_chunks
        self._lock = threading.Lock()
        self._session: Optional[_Session] = None
        self._closed = False

    def session(self) -> _Session:
        """The open session, opened here if there is none or the last one failed."""
        with self._lock:
            if self._closed:
                raise AttentionError(grpc.StatusCode.CANCELLED,
                                     f"data channel {self.address} is closed")
            if self._session is None or self._session.error is not None:
                self._session = self._open()
            return self._session

    def _open(self) -> _Session:
        try:
            return _Session(self.host, self.port, self.token, self.connections,
                            self.chunk_bytes, self.connect_timeout, self.tls)
        except _ServerClosed as error:
            raise AttentionError(status_code(error.code),
                                 f"data channel {self.address} refused the session: "
                                 f"{error}") from error
        except frames.ProtocolError as error:
            raise AttentionError(grpc.StatusCode.INTERNAL,
                                 f"data channel {self.address}: {error}") from error
        except OSError as error:
            raise AttentionError(grpc.StatusCode.UNAVAILABLE,
                                 f"data channel {self.address}: cannot connect: "
                                 f"{error}") from error

    def call(self, kind: str, message, payload: Sequence[np.ndarray],
             outputs: Sequence[np.ndarray], timeout: Optional[float] = None):
        """Runs one Forward or Backward (kind "forward"/"backward"; message its request with
        tensors' data left empty): `payload` (C-contiguous arrays, in the wire's field order)
        is sent, the response's tensor bytes land in `outputs` (writable C-contiguous arrays
        sized from the expected shapes, in field order). Returns the DataResponse's
        ForwardResponse/BackwardResponse (shapes, execution, context); raises AttentionError."""
        for array in outputs:
            if not (array.flags.writeable and array.flags.c_contiguous):
                raise ValueError("data channel outputs must be writable C-contiguous arrays")
        payload_layout, output_layout = _Layout(payload), _Layout(outputs)
        group_tensors = None
        if self.group_chunks:
            rows = groups.FORWARD_ROWS if kind == "forward" else groups.BACKWARD_ROWS
            group_tensors = [(a.nbytes, r) for a, r in zip(payload, rows)]
        session = self.session()
        timeout_ms = 0 if timeout is None else max(1, int(timeout * 1000))
        call = session.submit(kind, message, payload_layout, output_layout, timeout_ms, timeout,
                              group_tensors)
        try:
            response = call.future.result(timeout)
        except FutureTimeout:
            session.abandon(call, AttentionError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"data channel {self.address}: no answer to request {call.request_id} within "
                f"{timeout} s"))
            response = call.future.result()  # raises, unless it completed meanwhile
        return getattr(response, kind)

    def close(self) -> None:
        """Ends the session; pending calls fail with CANCELLED."""
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None:
            session.fail(AttentionError(grpc.StatusCode.CANCELLED,
                                        f"data channel {self.address} closed"))
