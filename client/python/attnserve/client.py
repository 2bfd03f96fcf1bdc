"""The numpy client: packs arrays into attnserve.v1 requests and unpacks the responses."""
import json
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import grpc
import numpy as np

from ._proto.attnserve.v1 import attention_pb2 as pb2
from ._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc
from .errors import AttentionError
from .security import Security
from .tensors import from_tensor, to_tensor

DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
# gRPC caps a retry policy at 5 attempts; more are silently treated as 5.
MAX_RETRIES = 4
SERVICE = "attnserve.v1.AttentionService"


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


@dataclass(frozen=True)
class Execution:
    """Where and how the server ran a request."""
    device: str
    kernel: str
    queue_us: int
    compute_us: int
    batched_requests: int

    @classmethod
    def from_proto(cls, message: pb2.Execution) -> "Execution":
        return cls(message.device, message.kernel, message.queue_us, message.compute_us,
                   message.batched_requests)


@dataclass(frozen=True)
class ForwardResult:
    out: np.ndarray  # [total_q, num_heads, head_dim], dtype of q
    lse: np.ndarray  # [num_heads, total_q] float32; +inf for rows that see no key
    execution: Execution


@dataclass(frozen=True)
class BackwardResult:
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    execution: Execution


def _offsets(values, name: str) -> list:
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(f"{name}: expected a 1-D sequence of integers, got {array.dtype} "
                        f"with shape {array.shape}")
    # Python ints: protobuf itself rejects values outside int32 rather than wrapping them.
    return array.astype(np.int64).tolist()


def attention_options(softmax_scale: Optional[float] = None, causal: bool = False,
                      window_size: Tuple[int, int] = (-1, -1),
                      softcap: float = 0.0) -> pb2.AttentionOptions:
    """flash_attn_varlen_func's keyword arguments as the wire's AttentionOptions."""
    options = pb2.AttentionOptions(softmax_scale=softmax_scale or 0.0, causal=causal,
                                   softcap=softcap)
    left, right = window_size
    # -1 means unbounded, which the wire says by leaving the optional field out.
    if left != -1:
        options.window_left = left
    if right != -1:
        options.window_right = right
    return options


def forward_request(q, k, v, cu_seqlens_q, cu_seqlens_k, **options) -> pb2.ForwardRequest:
    return pb2.ForwardRequest(
        q=to_tensor(q, "q"), k=to_tensor(k, "k"), v=to_tensor(v, "v"),
        cu_seqlens_q=_offsets(cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k=_offsets(cu_seqlens_k, "cu_seqlens_k"),
        options=attention_options(**options))


def backward_request(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                     deterministic: bool = False, **options) -> pb2.BackwardRequest:
    return pb2.BackwardRequest(
        dout=to_tensor(dout, "dout"), q=to_tensor(q, "q"), k=to_tensor(k, "k"),
        v=to_tensor(v, "v"), out=to_tensor(out, "out"), lse=to_tensor(lse, "lse"),
        cu_seqlens_q=_offsets(cu_seqlens_q, "cu_seqlens_q"),
        cu_seqlens_k=_offsets(cu_seqlens_k, "cu_seqlens_k"),
        options=attention_options(**options), deterministic=deterministic)


class Client:
    """A connection to attnserve. Thread-safe; use one per process and share it.

    target is any gRPC target: "host:port", or "dns:///host:port" (every address the name
    resolves to, e.g. a Kubernetes headless service) or "ipv4:10.0.0.1:8001,10.0.0.2:8001", over
    which calls are spread with load_balancing ("round_robin"; "pick_first" for one server at a
    time). timeout is the default deadline in seconds for every call, retries included (None: no
    deadline); each call can override it. Calls failing with UNAVAILABLE are retried up to
    `retries` times (at most 4) with exponential backoff. Failed calls raise AttentionError.
    Arrays in results are read-only views of the response bytes (copy them to modify in place).

    Security (see attnserve.security): tls_ca_file (PEM CA of the server's certificate; tls=True
    alone uses the system's roots), tls_cert_file + tls_key_file (a client certificate, for
    mTLS), server_name (the name the server's certificate carries, when not the target's host),
    token (sent as "authorization: Bearer <token>" on every call), or a whole `security`;
    `credentials` (grpc.ChannelCredentials) replaces the TLS settings.
    """

    def __init__(self, target: str = "localhost:8001", timeout: Optional[float] = None, *,
                 retries: int = MAX_RETRIES, load_balancing: str = "round_robin",
                 tls: bool = False, tls_ca_file: Optional[str] = None,
                 tls_cert_file: Optional[str] = None, tls_key_file: Optional[str] = None,
                 server_name: Optional[str] = None, token: Optional[str] = None,
                 security: Optional[Security] = None,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 options: Sequence[Tuple[str, object]] = ()):
        if not 0 <= retries <= MAX_RETRIES:
            raise ValueError(f"retries must be in [0, {MAX_RETRIES}], got {retries}")
        if security is not None and (tls or tls_ca_file or tls_cert_file or tls_key_file
                                     or server_name or token):
            raise ValueError("pass either security or its parts (tls*, server_name, token)")
        if security is None:
            security = Security(tls=tls, tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
                                tls_key_file=tls_key_file, server_name=server_name, token=token)
        self.target = target
        self.security = security
        self._metadata = security.call_metadata()
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

    def _call(self, method, request, timeout):
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout,
                          metadata=self._metadata)
        except grpc.RpcError as error:
            raise AttentionError(error.code(), error.details()) from error

    def forward(self, q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=None, causal=False,
                window_size=(-1, -1), softcap=0.0, *, timeout=None) -> ForwardResult:
        """flash_attn_varlen_func's forward: out and lse for packed q [total_q, H, D],
        k and v [total_k, H_k, D] (float16, float32 or bfloat16, all the same dtype)."""
        request = forward_request(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                  softmax_scale=softmax_scale, causal=causal,
                                  window_size=window_size, softcap=softcap)
        response = self._call(self.stub.Forward, request, timeout)
        return ForwardResult(out=from_tensor(response.out, "out"),
                             lse=from_tensor(response.lse, "lse"),
                             execution=Execution.from_proto(response.execution))

    def backward(self, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale=None,
                 causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False, *,
                 timeout=None) -> BackwardResult:
        """Gradients dq, dk, dv given dout and the forward's out and lse (float32)."""
        request = backward_request(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                   deterministic=deterministic, softmax_scale=softmax_scale,
                                   causal=causal, window_size=window_size, softcap=softcap)
        response = self._call(self.stub.Backward, request, timeout)
        return BackwardResult(dq=from_tensor(response.dq, "dq"),
                              dk=from_tensor(response.dk, "dk"),
                              dv=from_tensor(response.dv, "dv"),
                              execution=Execution.from_proto(response.execution))

    def server_info(self, *, timeout=None) -> pb2.ServerInfo:
        """Version, devices, kernel families and limits, as the attnserve.v1.ServerInfo proto."""
        return self._call(self.stub.GetServerInfo, pb2.GetServerInfoRequest(), timeout)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
