"""An in-process server speaking the data channel's spec (data_channel.proto) over real sockets,
beside a gRPC AttentionService that advertises it, for tests of the client's side: answers can be
chunked at odd sizes, shuffled over several connections, sent before or after their RESPONSE,
cut off mid-response, or replaced by malformed frames, which the real server never does on cue.

Forward and Backward answer with the float64 reference (attnserve.reference) rounded to the
request's dtype, on both paths, so the two must agree exactly. Contexts are kept in memory;
`forget_contexts` makes every context backward answer NOT_FOUND, as after an eviction.
Anything the client does against the spec is recorded in `violations`.
"""
import random
import socket
import threading
from concurrent import futures
from typing import Dict, List, Optional

import grpc
import numpy as np

from attnserve import attention_pb2 as pb2
from attnserve import attention_pb2_grpc as pb2_grpc
from attnserve import frames, reference
from attnserve._proto.attnserve.v1 import data_channel_pb2 as dc_pb2
from attnserve.tensors import from_tensor, to_tensor

# What the server does instead of a correct answer (FakeDataServer.misbehave).
BAD_MAGIC = "bad_magic"
CHUNK_OUT_OF_RANGE = "chunk_out_of_range"
CHUNK_TWICE = "chunk_twice"
UNKNOWN_REQUEST = "unknown_request"
WRONG_SHAPE = "wrong_shape"
DIE_MID_RESPONSE = "die_mid_response"


def _options(options: pb2.AttentionOptions) -> dict:
    return dict(softmax_scale=options.softmax_scale or None, causal=options.causal,
                window_size=(options.window_left if options.HasField("window_left") else -1,
                             options.window_right if options.HasField("window_right") else -1),
                softcap=options.softcap)


def _round(array, like):
    return array.astype(like.dtype)


class FakeDataServer(pb2_grpc.AttentionServiceServicer):
    def __init__(self, *, token: Optional[str] = None, max_connections: int = 4,
                 max_chunk_bytes: int = 4 << 20, response_chunk_bytes: int = 4099,
                 shuffle: bool = True, response_first: bool = False,
                 misbehave: Optional[str] = None, forget_contexts: bool = False,
                 max_inline_bytes: int = 0):
        self.token = token
        self.max_connections = max_connections
        self.max_chunk_bytes = max_chunk_bytes
        self.max_inline_bytes = max_inline_bytes
        # ACCEPTED frames sent, for tests of inline payloads.
        self.accepted_sent = 0
        self.response_chunk_bytes = response_chunk_bytes
        self.shuffle, self.response_first = shuffle, response_first
        self.misbehave = misbehave
        self.forget_contexts = forget_contexts
        self.violations: List[str] = []
        # Every data channel request, as (kind, payload_bytes, context_id), and the sessions'
        # connection counts, for tests to check what the client sent.
        self.requests: List[tuple] = []
        self.grpc_calls: List[str] = []
        # Per data channel request with chunks: their offsets in the order they arrived.
        self.chunk_orders: List[List[int]] = []
        self.connections_per_session: Dict[bytes, int] = {}
        self.contexts: Dict[str, dict] = {}
        self._lock = threading.Lock()
        self._sessions: Dict[bytes, List["_Connection"]] = {}
        self._pending: Dict[tuple, dict] = {}
        self._context_ids = iter(range(1, 1 << 30))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.data_port = self._listener.getsockname()[1]
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20)])
        pb2_grpc.add_AttentionServiceServicer_to_server(self, self._grpc)
        self.port = self._grpc.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"

    def __enter__(self) -> "FakeDataServer":
        self._grpc.start()
        threading.Thread(target=self._accept_loop, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._grpc.stop(grace=None)
        self._listener.close()
        self.kill_connections()

    def kill_connections(self) -> None:
        """Closes every data connection, as a server that dies would."""
        with self._lock:
            connections = [c for group in self._sessions.values() for c in group]
        for connection in connections:
            connection.close()

    # --- the computation, shared by both paths -------------------------------------------------

    def _forward(self, request: pb2.ForwardRequest, tensors: dict) -> pb2.ForwardResponse:
        q, k, v = tensors["q"], tensors["k"], tensors["v"]
        out, lse = reference.attention_forward(q, k, v, request.cu_seqlens_q,
                                               request.cu_seqlens_k, **_options(request.options))
        response = pb2.ForwardResponse(out=to_tensor(_round(out, q), "out"),
                                       lse=to_tensor(lse.astype(np.float32), "lse"))
        if request.keep_context:
            context_id = f"ctx-{next(self._context_ids)}"
            with self._lock:
                self.contexts[context_id] = dict(
                    q=q, k=k, v=v, out=from_tensor(response.out, "out"),
                    lse=from_tensor(response.lse, "lse"), cu_seqlens_q=request.cu_seqlens_q,
                    cu_seqlens_k=request.cu_seqlens_k, options=request.options)
            response.context_id = context_id
            response.context_address = self.target
        return response

    def _backward(self, request: pb2.BackwardRequest, tensors: dict) -> pb2.BackwardResponse:
        if request.context_id:
            with self._lock:
                saved = None if self.forget_contexts else self.contexts.get(request.context_id)
                if saved is not None and not request.keep_context:
                    del self.contexts[request.context_id]
            if saved is None:
                raise KeyError(request.context_id)
            tensors = dict(saved, dout=tensors["dout"])
            offsets, options = (saved["cu_seqlens_q"], saved["cu_seqlens_k"]), saved["options"]
        else:
            offsets, options = (request.cu_seqlens_q, request.cu_seqlens_k), request.options
        q, k, v = tensors["q"], tensors["k"], tensors["v"]
        dq, dk, dv = reference.attention_backward(tensors["dout"], q, k, v, tensors["out"],
                                                  tensors["lse"], *offsets, **_options(options))
        return pb2.BackwardResponse(dq=to_tensor(_round(dq, q), "dq"),
                                    dk=to_tensor(_round(dk, k), "dk"),
                                    dv=to_tensor(_round(dv, v), "dv"))

    # --- gRPC ----------------------------------------------------------------------------------

    def GetServerInfo(self, request, context):
        self.grpc_calls.append("GetServerInfo")
        channel = pb2.DataChannelInfo(
            port=self.data_port, protocol_version=frames.PROTOCOL_VERSION,
            max_chunk_bytes=self.max_chunk_bytes,
            max_connections_per_session=self.max_connections)
        return pb2.ServerInfo(version="fake", address=self.target, data_channel=channel)

    def Forward(self, request, context):
        self.grpc_calls.append("Forward")
        return self._forward(request, {n: from_tensor(getattr(request, n), n)
                                       for n in ("q", "k", "v")})

    def Backward(self, request, context):
        self.grpc_calls.append("Backward")
        names = ("dout",) if request.context_id else ("dout", "q", "k", "v", "out", "lse")
        try:
            return self._backward(request, {n: from_tensor(getattr(request, n), n)
                                            for n in names})
        except KeyError:
            context.abort(grpc.StatusCode.NOT_FOUND, f"context {request.context_id} not found")

    def ReleaseContext(self, request, context):
        self.grpc_calls.append("ReleaseContext")
        with self._lock:
            released = self.contexts.pop(request.context_id, None) is not None
        return pb2.ReleaseContextResponse(released=released)

    # --- the data channel ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=_Connection(self, sock).serve, daemon=True).start()

    def _violation(self, text: str) -> None:
        with self._lock:
            self.violations.append(text)

    def _join(self, connection: "_Connection", hello: dc_pb2.DataHello) -> bool:
        if self.token and hello.token != self.token:
            connection.send(frames.message_frame(frames.ERROR, dc_pb2.DataError(
                code=grpc.StatusCode.UNAUTHENTICATED.value[0], message="bad token")))
            return False
        with self._lock:
            group = self._sessions.setdefault(hello.session_id, [])
            group.append(connection)
            self.connections_per_session[hello.session_id] = len(group)
            if len(group) > self.max_connections:
                self.violations.append(f"{len(group)} connections in one session")
        connection.send(frames.message_frame(frames.HELLO_OK, dc_pb2.DataHelloOk(
            max_chunk_bytes=self.max_chunk_bytes,
            max_connections_per_session=self.max_connections, max_requests_per_session=64,
            max_inline_bytes=self.max_inline_bytes)))
        return True

    def _on_request(self, connection, header, request: dc_pb2.DataRequest) -> None:
        kind = request.WhichOneof("call")
        message = getattr(request, kind)
        names = ("q", "k", "v") if kind == "forward" else (
            ("dout",) if message.context_id else ("dout", "q", "k", "v", "out", "lse"))
        tensors = [getattr(message, n) for n in names]
        sizes = [int(np.prod(t.shape)) * (4 if t.dtype == pb2.DTYPE_FLOAT32 else 2)
                 for t in tensors]
        if any(t.data for t in tensors):
            self._violation(f"request {header.request_id}: tensor data inside the REQUEST")
        if sum(sizes) != request.payload_bytes:
            self._violation(f"request {header.request_id}: payload_bytes "
                            f"{request.payload_bytes} != {sum(sizes)}")
        with self._lock:
            self.requests.append((kind, request.payload_bytes,
                                  getattr(message, "context_id", "")))
            self._pending[(connection.session_id, header.request_id)] = dict(
                kind=kind, message=message, names=names, sizes=sizes, request=request,
                payload=bytearray(request.payload_bytes), chunks=set())
        if request.inline_payload and request.payload_bytes > self.max_inline_bytes:
            self._violation(f"request {header.request_id}: inline payload of "
                            f"{request.payload_bytes} bytes over max_inline_bytes")
        if request.payload_bytes > request.chunk_bytes and not request.inline_payload:
            with self._lock:
                self.accepted_sent += 1
            connection.send(frames.pack_header(frames.ACCEPTED, header.request_id))
        elif request.payload_bytes == 0:
            self._run(connection.session_id, header.request_id)

    def _on_chunk(self, connection, header, data: bytes) -> None:
        key = (connection.session_id, header.request_id)
        with self._lock:
            state = self._pending.get(key)
            if state is None:
                self.violations.append(f"CHUNK for unknown request {header.request_id}")
                return
            request = state["request"]
            expected = min(request.chunk_bytes, request.payload_bytes - header.offset)
            if (header.offset % request.chunk_bytes or header.length != expected
                    or header.offset in state["chunks"]):
                self.violations.append(f"request {header.request_id}: bad chunk at "
                                       f"{header.offset} ({header.length} bytes)")
                return
            state["chunks"].add(header.offset)
            state.setdefault("order", []).append(header.offset)
            state["payload"][header.offset:header.offset + header.length] = data
            done = len(state["chunks"]) * request.chunk_bytes >= request.payload_bytes
        if done:
            self._run(*key)

    def _run(self, session_id: bytes, request_id: int) -> None:
        with self._lock:
            state = self._pending.pop((session_id, request_id))
            if "order" in state:
                self.chunk_orders.append(state["order"])
        tensors, start = {}, 0
        for name, size in zip(state["names"], state["sizes"]):
            tensor = pb2.Tensor()
            tensor.CopyFrom(getattr(state["message"], name))
            tensor.data = bytes(state["payload"][start:start + size])
            tensors[name] = from_tensor(tensor, name)
            start += size
        try:
            if state["kind"] == "forward":
                answer = self._forward(state["message"], tensors)
                outputs = ("out", "lse")
            else:
                answer = self._backward(state["message"], tensors)
                outputs = ("dq", "dk", "dv")
        except KeyError as error:
            self._send_response(session_id, request_id, dc_pb2.DataResponse(
                code=grpc.StatusCode.NOT_FOUND.value[0], message=f"context {error} not found"),
                b"")
            return
        payload = b"".join(getattr(answer, name).data for name in outputs)
        for name in outputs:
            getattr(answer, name).data = b""
        if self.misbehave == WRONG_SHAPE:
            getattr(answer, outputs[0]).shape[0] += 1
        response = dc_pb2.DataResponse(payload_bytes=len(payload), **{state["kind"]: answer})
        self._send_response(session_id, request_id, response, payload)

    def _send_response(self, session_id, request_id, response, payload: bytes) -> None:
        with self._lock:
            connections = list(self._sessions[session_id])
        size = self.response_chunk_bytes
        chunks = [(offset, payload[offset:offset + size])
                  for offset in range(0, len(payload), size)]
        if self.shuffle:
            random.shuffle(chunks)
        frames_out = [frames.pack_header(frames.CHUNK, request_id, offset, len(data)) + data
                      for offset, data in chunks]
        if self.misbehave == CHUNK_OUT_OF_RANGE:
            frames_out[-1] = frames.pack_header(frames.CHUNK, request_id, len(payload) - 3, 8) \
                + bytes(8)
        elif self.misbehave == CHUNK_TWICE:
            frames_out.append(frames_out[0])
        elif self.misbehave == UNKNOWN_REQUEST:
            frames_out[-1] = frames.pack_header(frames.CHUNK, request_id + 1000, 0, 4) + bytes(4)
        elif self.misbehave == BAD_MAGIC:
            frames_out[-1] = b"XXXX" + frames_out[-1][4:]
        response_frame = frames.message_frame(frames.RESPONSE, response, request_id)
        if self.misbehave == DIE_MID_RESPONSE:
            for index, frame in enumerate(frames_out[:len(frames_out) // 2]):
                connections[index % len(connections)].send(frame)
            self.kill_connections()
            return
        if self.response_first:
            connections[0].send(response_frame)
        for index, frame in enumerate(frames_out):
            connections[index % len(connections)].send(frame)
        if not self.response_first:
            connections[-1].send(response_frame)


class _Connection:
    """One accepted data connection: reads frames, sends whole frames under a lock."""

    def __init__(self, server: FakeDataServer, sock: socket.socket):
        self.server, self.sock = server, sock
        self.session_id = b""
        self._send_lock = threading.Lock()

    def send(self, frame: bytes) -> None:
        with self._send_lock:
            try:
                self.sock.sendall(frame)
            except OSError:
                pass  # the client went away; its reader notices

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def serve(self) -> None:
        server = self.server
        try:
            header = frames.recv_header(self.sock)
            if header.type != frames.HELLO:
                server._violation(f"{header.name()} before HELLO")
                return
            hello = frames.recv_message(self.sock, header, dc_pb2.DataHello)
            self.session_id = hello.session_id
            if len(hello.session_id) != 16 or hello.protocol_version != 1:
                server._violation(f"bad HELLO {hello}")
            if not server._join(self, hello):
                return
            while True:
                header = frames.recv_header(self.sock)
                if header.type == frames.REQUEST:
                    request = frames.recv_message(self.sock, header, dc_pb2.DataRequest)
                    server._on_request(self, header, request)
                elif header.type == frames.CHUNK:
                    server._on_chunk(self, header, bytes(frames.recv_exactly(self.sock,
                                                                             header.length)))
                elif header.type == frames.CANCEL:
                    with server._lock:
                        server._pending.pop((self.session_id, header.request_id), None)
                else:
                    server._violation(f"unexpected {header.name()} from the client")
                    return
        except (OSError, frames.ProtocolError):
            return
        finally:
            self.close()
