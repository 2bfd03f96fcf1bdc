"""An in-process AttentionService whose failures and delays a test scripts, to check what the
client does about them (retries, deadlines), which the real server cannot be made to do on cue.
Forward answers with the float64 reference of plain attention (options ignored), rounded to the
request's dtype."""
import threading
import time
from concurrent import futures

import grpc

from attnserve import attention_pb2 as pb2
from attnserve import attention_pb2_grpc as pb2_grpc
from attnserve import reference
from attnserve.tensors import from_tensor, to_tensor


class FakeAttentionServer(pb2_grpc.AttentionServiceServicer):
    """Fails the first `failures` Forward calls with `code`, then answers them after `delay_s`.
    `calls` counts every Forward that reached it, failed ones included."""

    def __init__(self, failures: int = 0, code=grpc.StatusCode.UNAVAILABLE,
                 delay_s: float = 0.0):
        self.failures, self.code, self.delay_s = failures, code, delay_s
        self.calls = 0
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20)])
        pb2_grpc.add_AttentionServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"

    def __enter__(self) -> "FakeAttentionServer":
        self._server.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.stop(grace=None)

    def Forward(self, request, context):
        with self._lock:
            self.calls += 1
            fail = self.calls <= self.failures
        if fail:
            context.abort(self.code, f"scripted failure {self.calls} of {self.failures}")
        time.sleep(self.delay_s)
        q = from_tensor(request.q, "q")
        out, lse = reference.attention_forward(
            q, from_tensor(request.k, "k"), from_tensor(request.v, "v"),
            request.cu_seqlens_q, request.cu_seqlens_k)
        return pb2.ForwardResponse(out=to_tensor(out.astype(q.dtype), "out"),
                                   lse=to_tensor(lse.astype("float32"), "lse"))
