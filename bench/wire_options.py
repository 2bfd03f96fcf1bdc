#!/usr/bin/env python3
"""Candidate transports for tensor bytes, measured side by side on loopback in one run.

Why: the bulk data path (proto/attnserve/v1/data_channel.proto) was chosen between chunked gRPC
streams and a data channel negotiated over gRPC by measuring them (issue 24). Each row moves
--mib MiB one way from a client to a sink that only receives, and reports GB/s (10^9 bytes/s):

  raw TCP, 1 / N connections      Python sockets: sendall of a memoryview, recv_into a buffer
  gRPC unary, one message          grpcio, one request of --mib MiB (what the API does today)
  gRPC stream, chunks, 1 / N       grpcio client streaming, --chunk_mib MiB messages, over 1 or N
                                   channels at once
  UCX stream, 1 connection         ucx_perftest stream_bw over TCP (when --ucx_root points at an
                                   unpacked libucx0 + ucx-utils; the GPU machine has no UCX)

    python bench/wire_options.py --mib 1024 --connections 4 [--ucx_root DIR]
"""
import argparse
import os
import socket
import subprocess
import threading
import time
from concurrent import futures

import grpc

MIB = 1 << 20
SINK_METHOD = "/bench.Sink/Take"


def _sink_server(connections: int, total: int):
    """A listening socket whose accepted connections each receive total/connections bytes."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.listen(connections)
    done = threading.Barrier(connections + 1)

    def serve():
        conn, _ = listener.accept()
        buffer = memoryview(bytearray(8 * MIB))
        left = total // connections
        while left:
            got = conn.recv_into(buffer[:min(left, len(buffer))])
            if not got:
                break
            left -= got
        conn.close()
        done.wait()

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    return listener.getsockname()[1], done


def raw_tcp(total: int, connections: int) -> float:
    port, done = _sink_server(connections, total)
    part = memoryview(bytearray(os.urandom(MIB)) * (total // connections // MIB))
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    start = time.perf_counter()
    senders = [threading.Thread(target=s.sendall, args=(part,)) for s in socks]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    done.wait()
    elapsed = time.perf_counter() - start
    for s in socks:
        s.close()
    return total / elapsed / 1e9


def _grpc_sink():
    """A grpcio server with a unary and a client-streaming method that drop what they get."""
    def take_unary(request, context):
        return b""

    def take_stream(request_iterator, context):
        for _ in request_iterator:
            pass
        return b""

    handler = grpc.method_handlers_generic_handler("bench.Sink", {
        "Take": grpc.unary_unary_rpc_method_handler(take_unary),
        "TakeStream": grpc.stream_unary_rpc_method_handler(take_stream),
    })
    options = [("grpc.max_receive_message_length", (2 << 30) - 1)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=options)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _channel(port: int) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{port}",
                                 options=[("grpc.max_send_message_length", (2 << 30) - 1)])


def grpc_unary(total: int) -> float:
    server, port = _grpc_sink()
    channel = _channel(port)
    take = channel.unary_unary(SINK_METHOD)
    payload = os.urandom(MIB) * (total // MIB)
    take(b"x")  # connect first
    start = time.perf_counter()
    take(payload)
    elapsed = time.perf_counter() - start
    channel.close()
    server.stop(0)
    return total / elapsed / 1e9


def grpc_stream(total: int, chunk: int, channels: int) -> float:
    server, port = _grpc_sink()
    chans = [_channel(port) for _ in range(channels)]
    chunk_bytes = os.urandom(chunk)
    per_channel = total // channels // chunk

    def send(channel):
        channel.stream_unary("/bench.Sink/TakeStream")(iter([chunk_bytes] * per_channel))

    for channel in chans:
        channel.stream_unary("/bench.Sink/TakeStream")(iter([b"x"]))
    start = time.perf_counter()
    threads = [threading.Thread(target=send, args=(c,)) for c in chans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    for channel in chans:
        channel.close()
    server.stop(0)
    return per_channel * chunk * channels / elapsed / 1e9


def ucx_stream(total: int, chunk: int, root: str) -> float:
    lib = os.path.join(root, "usr/lib/x86_64-linux-gnu")
    env = dict(os.environ, LD_LIBRARY_PATH=lib, UCX_MODULE_DIR=os.path.join(lib, "ucx"),
               UCX_TLS="tcp,self")
    perftest = [os.path.join(root, "usr/bin/ucx_perftest"), "-p", "13377", "-t", "stream_bw",
                "-s", str(chunk), "-n", str(total // chunk)]
    server = subprocess.Popen(perftest, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    client = subprocess.run(perftest + ["127.0.0.1"], env=env, capture_output=True, text=True,
                            timeout=120)
    server.wait(timeout=30)
    final = [line for line in client.stdout.splitlines() if line.startswith("Final:")]
    if not final:
        raise RuntimeError(f"ucx_perftest printed no result: {client.stdout}{client.stderr}")
    return float(final[0].split()[6]) * 1e6 / 1e9  # "overall" MB/s (10^6) -> GB/s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="bytes moved per row, MiB")
    parser.add_argument("--chunk_mib", type=int, default=4)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many per row")
    parser.add_argument("--ucx_root", default="", help="unpacked libucx0 + ucx-utils debs")
    args = parser.parse_args()
    total, chunk, n = args.mib * MIB, args.chunk_mib * MIB, args.connections
    rows = [
        ("raw TCP, 1 connection", lambda: raw_tcp(total, 1)),
        (f"raw TCP, {n} connections", lambda: raw_tcp(total, n)),
        (f"gRPC unary, one {args.mib} MiB message", lambda: grpc_unary(total)),
        (f"gRPC stream, {args.chunk_mib} MiB messages, 1 channel",
         lambda: grpc_stream(total, chunk, 1)),
        (f"gRPC stream, {args.chunk_mib} MiB messages, {n} channels",
         lambda: grpc_stream(total, chunk, n)),
    ]
    if args.ucx_root:
        rows.append((f"UCX stream_bw (TCP), {args.chunk_mib} MiB messages, 1 connection",
                     lambda: ucx_stream(total, chunk, args.ucx_root)))
    print(f"| transport ({args.mib} MiB one way, loopback, best of {args.repeats}) | GB/s |")
    print("|---|---|")
    for name, measure in rows:
        best = max(measure() for _ in range(args.repeats))
        print(f"| {name} | {best:.2f} |", flush=True)


if __name__ == "__main__":
    main()
