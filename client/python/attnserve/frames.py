"""The data channel's frames (proto/attnserve/v1/data_channel.proto): a 32-byte little-endian
header, then `length` payload bytes; and the socket loops that move them without copies.

Header: u32 magic "ADP1", u16 type, u16 flags (0), u64 request_id, u64 offset, u64 length.
Control frames (HELLO, REQUEST, ACCEPTED, RESPONSE, ERROR, CANCEL) carry a protobuf message of
at most MAX_MESSAGE_BYTES; CHUNK frames carry raw tensor bytes at `offset` of a request's
payload or a response's tensors.
"""
import socket
import struct
from dataclasses import dataclass
from typing import List, Sequence

from ._proto.attnserve.v1 import data_channel_pb2 as dc_pb2

MAGIC = 0x31504441  # b"ADP1" read as a little-endian u32
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<IHHQQQ")
assert HEADER.size == 32
MAX_MESSAGE_BYTES = 1 << 20
# Buffers per sendmsg; Linux's IOV_MAX is 1024 and a frame never needs more than a handful.
_MAX_IOV = 64

HELLO = dc_pb2.FRAME_HELLO
HELLO_OK = dc_pb2.FRAME_HELLO_OK
REQUEST = dc_pb2.FRAME_REQUEST
ACCEPTED = dc_pb2.FRAME_ACCEPTED
CHUNK = dc_pb2.FRAME_CHUNK
RESPONSE = dc_pb2.FRAME_RESPONSE
ERROR = dc_pb2.FRAME_ERROR
CANCEL = dc_pb2.FRAME_CANCEL


class ProtocolError(Exception):
    """A peer broke the framing rules; the connection cannot be trusted any further."""


class ConnectionClosed(ConnectionError):
    """The peer closed the connection (cleanly or not) in the middle of a frame or between."""


@dataclass(frozen=True)
class Header:
    type: int
    request_id: int
    offset: int
    length: int

    def name(self) -> str:
        return frame_name(self.type)


def frame_name(frame_type: int) -> str:
    try:
        return dc_pb2.FrameType.Name(frame_type)
    except ValueError:
        return f"frame type {frame_type}"


def pack_header(frame_type: int, request_id: int = 0, offset: int = 0, length: int = 0) -> bytes:
    return HEADER.pack(MAGIC, frame_type, 0, request_id, offset, length)


def parse_header(data) -> Header:
    """Checks magic, flags and, for control frames, the length bound."""
    magic, frame_type, flags, request_id, offset, length = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic 0x{magic:08x} (expected 0x{MAGIC:08x})")
    if flags:
        raise ProtocolError(f"{frame_name(frame_type)}: reserved flags 0x{flags:04x} set")
    if frame_type != CHUNK and length > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{frame_name(frame_type)} of request {request_id}: {length} bytes "
                            f"exceed the {MAX_MESSAGE_BYTES}-byte message limit")
    return Header(frame_type, request_id, offset, length)


def message_frame(frame_type: int, message, request_id: int = 0) -> bytes:
    """A control frame: header and serialized message, one bytes object (they are small)."""
    body = message.SerializeToString()
    return pack_header(frame_type, request_id, 0, len(body)) + body


def send_views(sock: socket.socket, views: Sequence) -> None:
    """Sends every byte of `views` (bytes-like objects) in order with scatter-gather sendmsg,
    which releases the GIL and never copies them into one buffer."""
    pending: List[memoryview] = [memoryview(v).cast("B") for v in views if len(v)]
    while pending:
        sent = sock.sendmsg(pending[:_MAX_IOV])
        while pending and sent >= pending[0].nbytes:
            sent -= pending[0].nbytes
            pending.pop(0)
        if sent:
            pending[0] = pending[0][sent:]


def recv_into_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fills `view` from the socket (recv_into releases the GIL and writes in place)."""
    filled, total = 0, view.nbytes
    while filled < total:
        received = sock.recv_into(view[filled:], total - filled)
        if not received:
            raise ConnectionClosed(f"connection closed with {total - filled} of {total} bytes "
                                   "of a frame still to come")
        filled += received


def recv_exactly(sock: socket.socket, count: int) -> bytearray:
    buffer = bytearray(count)
    recv_into_exactly(sock, memoryview(buffer))
    return buffer


def recv_header(sock: socket.socket) -> Header:
    """The next frame's header; ConnectionClosed when the peer closed between frames."""
    return parse_header(recv_exactly(sock, HEADER.size))


def recv_message(sock: socket.socket, header: Header, message_type):
    """Reads and parses the control message a header announced."""
    data = bytes(recv_exactly(sock, header.length))
    message = message_type()
    try:
        message.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError, whose module path varies by runtime
        raise ProtocolError(f"{header.name()} of request {header.request_id}: not a valid "
                            f"{message_type.DESCRIPTOR.name}: {error}") from error
    return message


def skip(sock: socket.socket, count: int) -> None:
    """Reads and drops `count` bytes (chunks of a call abandoned here), in bounded pieces."""
    scratch = memoryview(bytearray(min(count, 1 << 20)))
    while count:
        piece = min(count, scratch.nbytes)
        recv_into_exactly(sock, scratch[:piece])
        count -= piece
