"""TLS on a data channel connection: an ssl.SSLSocket that the connection's reader and sender
threads use at once.

OpenSSL forbids two threads in one SSL object at a time, even a read beside a write, and
CPython's ssl module (before 3.13) does not serialize them: a recv_into beside a send can
corrupt the connection or crash the process. So the socket is non-blocking, every SSL call
holds a lock and never blocks, and the threads wait for the socket outside it, so sending and
receiving still overlap on the wire. Bytes go to and from the caller's buffers as over plain
TCP: SSL_write reads the memoryview, SSL_read writes into it.
"""
import select
import socket
import ssl
import threading
from typing import Optional, Sequence

# Bytes per SSL_write: the reader waits for the lock at most this much encryption.
_WRITE_STEP = 256 << 10
# Leading buffers smaller than a TLS record are joined into one write (a frame header and a
# small payload go out as one record, not two).
_COALESCE_BYTES = 16 << 10


class TlsSocket:
    """The calls frames.py and data_channel.py make on a socket, over TLS."""

    def __init__(self, sock: ssl.SSLSocket, timeout: Optional[float]):
        self._sock = sock
        self._lock = threading.Lock()
        self._timeout = timeout
        sock.setblocking(False)

    def settimeout(self, timeout: Optional[float]) -> None:
        self._timeout = timeout

    def _wait(self, error: ssl.SSLError) -> None:
        events = select.POLLIN if isinstance(error, ssl.SSLWantReadError) else select.POLLOUT
        poller = select.poll()
        poller.register(self._sock.fileno(), events)
        if not poller.poll(None if self._timeout is None else int(self._timeout * 1000)):
            raise socket.timeout("timed out")

    def recv_into(self, view: memoryview, nbytes: int = 0) -> int:
        while True:
            with self._lock:
                try:
                    return self._sock.recv_into(view, nbytes)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as error:
                    pending = error
            self._wait(pending)

    def sendmsg(self, buffers: Sequence[memoryview]) -> int:
        """Sends from the first buffers (joined when small); how many bytes went."""
        data = buffers[0]
        if data.nbytes < _COALESCE_BYTES and len(buffers) > 1:
            joined, size = [], 0
            for buffer in buffers:
                if size + buffer.nbytes > _COALESCE_BYTES:
                    break
                joined.append(buffer)
                size += buffer.nbytes
            data = memoryview(b"".join(joined)) if len(joined) > 1 else data
        # The same bytes are offered again after SSLWantWriteError, as OpenSSL requires.
        data = data[:_WRITE_STEP]
        while True:
            with self._lock:
                try:
                    return self._sock.send(data)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as error:
                    pending = error
            self._wait(pending)

    def shutdown(self, how: int) -> None:
        # The TCP socket's shutdown, which wakes a thread waiting on it; SSLSocket.shutdown
        # would also drop the SSL object under a thread that is using it.
        socket.socket.shutdown(self._sock, how)

    def close(self) -> None:
        self._sock.close()


def connect_tls(sock: socket.socket, context: ssl.SSLContext, server_name: str,
                timeout: Optional[float]) -> TlsSocket:
    """The TLS handshake on the connected `sock` (checking the server's certificate for
    `server_name`, also sent as SNI), within `timeout`."""
    sock.settimeout(timeout)
    return TlsSocket(context.wrap_socket(sock, server_hostname=server_name), timeout)
