"""A gRPC client on a raw socket that never reads: it opens one call with a stream window of 0,
so the server can compute the answer but never send it (a client that stops reading)."""
import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, HEADERS, DATA = 4, 1, 0
END_STREAM, END_HEADERS = 0x1, 0x4
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def _length(value):  # an HPACK integer with a 7-bit prefix, Huffman off
    if value < 127:
        return bytes([value])
    out, value = [127], value - 127
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    return bytes(out + [value])


def _literal(name, value):  # literal header field without indexing, new name
    return b"\x00" + _length(len(name)) + name + _length(len(value)) + value


def start_unread_call(port, method, message):
    """Sends one unary call of `message` (serialized bytes) and returns the socket, which the
    caller keeps open without reading; close it to end the call."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    block = b"".join(_literal(n, v) for n, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()),
        (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
        (b"te", b"trailers")])
    body = b"\x00" + struct.pack(">I", len(message)) + message
    sock.sendall(PREFACE
                 + frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 0))
                 + frame(HEADERS, END_HEADERS, 1, block)
                 + frame(DATA, END_STREAM, 1, body))
    return sock
