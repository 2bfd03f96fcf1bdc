"""What the soak's clients send: small random valid problems (with their float64 reference
answers) and malformed requests (with the status codes they must get)."""
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import grpc
import numpy as np

import attnserve
from attnserve import attention_pb2 as pb2
from attnserve import reference
from attnserve.tensors import from_tensor, to_tensor
from cases import DTYPES, LSE_TOLERANCE, TOLERANCE, backward_references, gradient_error, \
    rel_error

# Server limits the soak runs with: small, so that the over-limit requests stay cheap to build.
# Saved contexts expire after CONTEXT_TTL_S, so that a soak of a minute sees contexts expire
# under their backward.
CONTEXT_TTL_S = 4
BASE_LIMITS = {"max_total_tokens": 2048, "max_batch": 64, "max_head_dim": 256,
               "max_message_bytes": 4 << 20, "context_ttl_seconds": CONTEXT_TTL_S}
# Device memory running requests may hold: above the largest ordinary soak request (an fp32
# backward of 256 tokens and heads x dim 1024 holds about 9 MiB) and below two of the memory
# phase's requests (MEMORY_HOG_SHAPE), so those wait for each other; the oversized one alone
# needs more than all of it. Messages may then be 16 MiB, for the oversized request to reach
# the handler's memory check rather than gRPC's size limit.
MEMORY_BUDGET = 20 << 20
# An unread answer is cancelled by the server this long after it was computed.
ANSWER_TIMEOUT_S = 3

# The soak's optional phases:
#   gpu     GPU dtypes (fp16/bf16 mostly) checked with GPU kernels' tolerances
#   memory  a small device memory budget and groups of large requests that exceed it together
#           (they wait for memory) or alone (RESOURCE_EXHAUSTED)
#   unread  clients that send a call and stop reading (the server's answer timeout frees them)
#   faults  device faults injected into some server lifetimes: UNAVAILABLE naming the fault
#           is an allowed answer
KNOWN_FEATURES = ("gpu", "memory", "unread", "faults")
FEATURES_ENV = "ATTNSERVE_SOAK_FEATURES"


def configure(features) -> None:
    """Sets the phases on (FEATURES, SERVER_LIMITS, dtypes and tolerances). soak.py calls it
    and puts the features in the environment, where its client processes and victims (which
    import this module afresh) find them."""
    global FEATURES, SERVER_LIMITS, DTYPE_WEIGHTS, FORWARD_TOLERANCE, BACKWARD_TOLERANCE
    global OUT_LSE_TOLERANCE
    features = frozenset(features)
    unknown = features - set(KNOWN_FEATURES)
    if unknown:
        raise ValueError(f"unknown soak features {sorted(unknown)}; known: {KNOWN_FEATURES}")
    FEATURES = features
    SERVER_LIMITS = dict(BASE_LIMITS)
    if "memory" in FEATURES:
        # Two lanes on the CPU device (a GPU has two by default), so requests contend for
        # memory rather than only queue for the one lane.
        SERVER_LIMITS.update(max_message_bytes=16 << 20, device_memory_bytes=MEMORY_BUDGET,
                             cpu_lanes=2)
    if "unread" in FEATURES:
        SERVER_LIMITS["grpc_answer_timeout_seconds"] = ANSWER_TIMEOUT_S
    # On a GPU the flash/fallback/cuBLAS kernels reorder the sums; these bounds are the ones
    # tests/gpu/test_routing_gpu.py holds every kernel family to. The CPU's reference kernels
    # meet cases.py's tighter ones.
    if "gpu" in FEATURES:
        DTYPE_WEIGHTS = {"bf16": 0.45, "fp16": 0.4, "fp32": 0.15}
        FORWARD_TOLERANCE = {DTYPES["fp32"]: 1e-4, DTYPES["fp16"]: 4e-3,
                             DTYPES["bf16"]: 2.5e-2}
        BACKWARD_TOLERANCE = {dtype: 2 * t for dtype, t in FORWARD_TOLERANCE.items()}
        OUT_LSE_TOLERANCE = 1e-4
    else:
        DTYPE_WEIGHTS = dict.fromkeys(DTYPES, 1 / len(DTYPES))
        FORWARD_TOLERANCE = BACKWARD_TOLERANCE = TOLERANCE
        OUT_LSE_TOLERANCE = LSE_TOLERANCE


configure(filter(None, os.environ.get(FEATURES_ENV, "").split(",")))

INVALID = frozenset({grpc.StatusCode.INVALID_ARGUMENT})
LIMIT = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
OVERFLOW = INVALID | LIMIT
MAX_HEADS_X_DIM = 1024


@dataclass
class Problem:
    """A valid request and what a correct answer is checked against."""
    rpc: str  # "Forward" or "Backward"
    dtype: np.dtype
    request: object
    check: Callable[[object], Optional[str]]  # response -> None, or why it is wrong
    describe: str
    # The same call through attnserve.Client: client.forward(*args, **options) (or backward),
    # and its ForwardResult/BackwardResult -> None, or why it is wrong.
    args: tuple = ()
    options: dict = field(default_factory=dict)
    check_result: Callable[[object], Optional[str]] = lambda result: "no check"


def _random_options(rng, dim):
    options = {}
    if rng.random() < 0.5:
        options["causal"] = True
    if rng.random() < 0.3:
        options["window_size"] = (int(rng.integers(-1, 16)), int(rng.integers(-1, 8)))
    if rng.random() < 0.15:
        options["softcap"] = float(rng.choice([5.0, 30.0]))
    if rng.random() < 0.2:
        options["softmax_scale"] = float(rng.uniform(0.5, 2.0) / math.sqrt(dim))
    return options


def _random_shape(rng):
    """Small on purpose: the numpy reference on a shared 2-core machine must keep up."""
    batch = int(rng.integers(1, 5))
    seqlens_q = rng.integers(0, 65, batch)
    same = rng.random() < 0.5
    seqlens_k = seqlens_q if same else rng.integers(0, 65, batch)
    dim = int(rng.choice([16, 32, 64, 128]))
    # GQA / MQA as often as plain MHA; heads * dim <= 1024 keeps the largest backward (fp32,
    # six tensors) under the soak's 4 MiB message limit.
    heads_k = int(rng.choice([1, 2, 4]))
    groups = [g for g in (1, 2, 4) if heads_k * g * dim <= MAX_HEADS_X_DIM]
    heads = heads_k * int(rng.choice(groups))
    cu = lambda lens: np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return cu(seqlens_q), cu(seqlens_k), heads, heads_k, dim


def forward_error(dtype, ref_out, ref_lse, out, lse) -> Optional[str]:
    """Why out and lse are not the reference's, or None."""
    if out.dtype != dtype or out.shape != ref_out.shape:
        return f"out is {out.dtype}{out.shape}"
    if lse.dtype != np.float32 or lse.shape != ref_lse.shape:
        return f"lse is {lse.dtype}{lse.shape}"
    masked = np.isposinf(ref_lse)
    if not np.array_equal(np.isposinf(lse), masked):
        return "lse +inf rows differ"
    out_error = rel_error(out, ref_out)
    lse_error = rel_error(lse[~masked], ref_lse[~masked]) if (~masked).any() else 0.0
    if not out_error <= FORWARD_TOLERANCE[dtype] or not lse_error <= OUT_LSE_TOLERANCE:
        return f"out error {out_error:.2e}, lse error {lse_error:.2e}"
    return None


def backward_error(dtype, refs, grads) -> Optional[str]:
    """Why grads (dq, dk, dv) are not the reference's, or None; refs is backward_references'
    (the reference gradients and their term scales)."""
    for name, ref, scale, actual in zip(("dq", "dk", "dv"), *refs, grads):
        if actual.dtype != dtype or actual.shape != ref.shape:
            return f"{name} is {actual.dtype}{actual.shape}"
        error = gradient_error(actual, ref, scale)
        if not error <= BACKWARD_TOLERANCE[dtype]:
            return f"{name} error {error:.2e}"
    return None


def _check_forward(dtype, ref_out, ref_lse):
    return lambda response: forward_error(dtype, ref_out, ref_lse,
                                          from_tensor(response.out, "out"),
                                          from_tensor(response.lse, "lse"))


def _check_backward(dtype, refs):
    return lambda response: backward_error(
        dtype, refs, [from_tensor(getattr(response, name), name) for name in ("dq", "dk", "dv")])


def valid_problem(rng, rpc: str, shape=None, dtype_name=None, options=None) -> Problem:
    """A random problem; shape (cu_q, cu_k, heads, heads_k, dim), dtype_name and options (the
    attention's keyword arguments) fix those."""
    cu_q, cu_k, heads, heads_k, dim = shape or _random_shape(rng)
    dtype_name = dtype_name or str(rng.choice(list(DTYPE_WEIGHTS),
                                              p=list(DTYPE_WEIGHTS.values())))
    dtype = DTYPES[dtype_name]
    options = _random_options(rng, dim) if options is None else options
    randn = lambda tokens, h: rng.standard_normal((tokens, h, dim)).astype(dtype)
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    q, k, v = randn(total_q, heads), randn(total_k, heads_k), randn(total_k, heads_k)
    out, lse = reference.attention_forward(q, k, v, cu_q, cu_k, **options)
    describe = (f"{rpc} {dtype_name} cu_q={cu_q.tolist()} cu_k={cu_k.tolist()} "
                f"heads={heads}/{heads_k} dim={dim} {options}")
    if rpc == "Forward":
        request = attnserve.forward_request(q, k, v, cu_q, cu_k, **options)
        return Problem(rpc, dtype, request, _check_forward(dtype, out, lse), describe,
                       (q, k, v, cu_q, cu_k), options,
                       lambda result: forward_error(dtype, out, lse, result.out, result.lse))
    # The backward gets the reference forward (rounded as a client would hold it) and is
    # checked against the reference backward from exactly those out and lse.
    out, lse = out.astype(dtype), lse.astype(np.float32)
    dout = randn(total_q, heads)
    refs = backward_references(dout, q, k, v, out, lse, cu_q, cu_k, **options)
    request = attnserve.backward_request(dout, q, k, v, out, lse, cu_q, cu_k, **options)
    return Problem(rpc, dtype, request, _check_backward(dtype, refs), describe,
                   (dout, q, k, v, out, lse, cu_q, cu_k), options,
                   lambda result: backward_error(dtype, refs, (result.dq, result.dk, result.dv)))


# The memory phase's Forwards: 2048 tokens in sequences of 64 (a cheap reference), 8 heads of
# 128, bf16: q, k, v and out of 4 MiB each hold about 16.1 MiB of the device budget, so two
# never run at once; a 12 MiB message.
MEMORY_HOG_SHAPE = (np.arange(0, 2049, 64, dtype=np.int32),) * 2 + (8, 8, 128)


def memory_hog(rng) -> Problem:
    """A Forward that holds most of MEMORY_BUDGET while it runs (checked like any other)."""
    return valid_problem(rng, "Forward", MEMORY_HOG_SHAPE, "bf16")


def memory_oversized(rng):
    """A valid Backward that needs more device memory than MEMORY_BUDGET in all (about 24 MiB:
    dout, q, k, v, out and the three gradients of 3 MiB each, within a 15 MiB message): it
    must be refused RESOURCE_EXHAUSTED at admission, never run."""
    cu = np.arange(0, 2049, 64, dtype=np.int32)
    make = lambda: rng.standard_normal((2048, 6, 128)).astype(DTYPES["bf16"])
    return attnserve.backward_request(make(), make(), make(), make(), make(),
                                      np.zeros((6, 2048), np.float32), cu, cu)


def unread_request(rng) -> bytes:
    """A small valid Forward, serialized: it must fit one HTTP/2 DATA frame (16 KiB) of
    raw_http2.start_unread_call."""
    tokens = int(rng.integers(1, 33))
    cu = np.array([0, tokens], np.int32)
    return valid_problem(rng, "Forward", (cu, cu, 2, 1, 32), "fp16").request.SerializeToString()


def context_backward(rng, forward: Problem, forward_result):
    """A Backward after `forward` kept its context: the arguments of client.backward (the
    full inputs, which the client resends when the context is gone) and the check of its
    answer, against the reference backward from the out and lse the server returned (which
    the context holds)."""
    q, k, v, cu_q, cu_k = forward.args
    out, lse = forward_result.out, forward_result.lse
    dout = rng.standard_normal(out.shape).astype(forward.dtype)
    refs = backward_references(dout, q, k, v, out, lse, cu_q, cu_k, **forward.options)
    return ((dout, q, k, v, out, lse, cu_q, cu_k),
            lambda result: backward_error(forward.dtype, refs,
                                          (result.dq, result.dk, result.dv)))


def data_payload(problem: Problem):
    """A Forward as the data channel carries it: the request with shape-only tensors, and the
    payload bytes (q, k, v back to back)."""
    request = type(problem.request)()
    request.CopyFrom(problem.request)
    payload = b"".join(getattr(request, name).data for name in ("q", "k", "v"))
    for name in ("q", "k", "v"):
        getattr(request, name).data = b""
    return request, payload


# ---- malformed requests: (name, expected codes, reaches the handler, mutation) ----------------

def _tensor_fields(request):
    names = ["q", "k", "v"]
    if isinstance(request, pb2.BackwardRequest):
        names += ["dout", "out", "lse"]
    return names


def _wrong_bytes(rng, request):
    tensor = getattr(request, str(rng.choice(_tensor_fields(request))))
    cut = int(rng.integers(1, 5))
    tensor.data = tensor.data[:-cut] if rng.random() < 0.5 else tensor.data + b"\0" * cut


def _bad_cu(rng, request):
    field = request.cu_seqlens_q if rng.random() < 0.5 else request.cu_seqlens_k
    total = field[-1]
    choice = int(rng.integers(0, 4))
    if choice == 0:
        field[0] = 1                      # does not start at 0
    elif choice == 1:
        field[-1] = total + 1             # ends past the tensor
    elif choice == 2:
        field[:] = [0, total + 3, total]  # decreasing
    else:
        del field[:]                      # empty


def _bad_dtype(rng, request):
    tensor = getattr(request, str(rng.choice(_tensor_fields(request))))
    # UNSPECIFIED, an enum value the proto does not define, or a mismatch with q.
    tensor.dtype = int(rng.choice([pb2.DTYPE_UNSPECIFIED, 7, -1,
                                   pb2.DTYPE_FLOAT16 if tensor.dtype != pb2.DTYPE_FLOAT16
                                   else pb2.DTYPE_FLOAT32]))


def _bad_shape(rng, request):
    tensor = getattr(request, str(rng.choice(["q", "k", "v"])))
    # Negative dims, wrong rank, and dims whose product overflows int64.
    shapes = [[12, -2, -16], [4], [1 << 40, 1 << 40, 8], [3, 2, 16, 1]]
    tensor.shape[:] = shapes[int(rng.integers(0, len(shapes)))]


def _bad_options(rng, request):
    choice = int(rng.integers(0, 3))
    if choice == 0:
        request.options.softcap = -1.0
    elif choice == 1:
        request.options.softmax_scale = float("nan")
    else:
        request.options.window_left = -2


def _over_tokens(rng, request):
    tokens = SERVER_LIMITS["max_total_tokens"] + 1
    for name in ("q", "k", "v"):
        getattr(request, name).CopyFrom(to_tensor(np.ones((tokens, 1, 8), np.float16), name))
    request.cu_seqlens_q[:] = [0, tokens]
    request.cu_seqlens_k[:] = [0, tokens]
    if isinstance(request, pb2.BackwardRequest):
        request.dout.CopyFrom(request.q)
        request.out.CopyFrom(request.q)
        request.lse.CopyFrom(to_tensor(np.ones((1, tokens), np.float32), "lse"))


def _oversize(rng, request):
    # Past --max_message_bytes: gRPC itself refuses it before the handler runs.
    request.q.data = request.q.data + b"\0" * (SERVER_LIMITS["max_message_bytes"] + 1024)


MALFORMED = {
    # name: (codes it must get, whether the server's handler sees it and counts it, mutation)
    "wrong_byte_count": (INVALID, True, _wrong_bytes),
    "bad_cu_seqlens": (INVALID, True, _bad_cu),
    "bad_dtype": (INVALID, True, _bad_dtype),
    "bad_shape": (OVERFLOW, True, _bad_shape),
    "bad_options": (INVALID, True, _bad_options),
    "over_token_limit": (LIMIT, True, _over_tokens),
    "oversize_message": (LIMIT, False, _oversize),
}

# Bytes that are no protobuf at all: the server's handler parses the body itself and answers
# INVALID_ARGUMENT naming the message type.
GARBAGE = ("garbage_bytes", frozenset({grpc.StatusCode.INVALID_ARGUMENT}), True)


def malformed_request(rng, rpc: str, name: str):
    """A small valid request of the rpc with the named defect applied."""
    problem_request = _small_request(rng, rpc)
    MALFORMED[name][2](rng, problem_request)
    return problem_request


def _small_request(rng, rpc):
    # Not checked against anything: it must be refused. Shaped like test_validation's GOOD.
    make = lambda shape, dtype=np.float32: rng.standard_normal(shape).astype(dtype)
    q, k, v = make((12, 2, 16)), make((12, 2, 16)), make((12, 2, 16))
    cu = [0, 5, 12]
    if rpc == "Forward":
        return attnserve.forward_request(q, k, v, cu, cu, causal=True)
    return attnserve.backward_request(make((12, 2, 16)), q, k, v, make((12, 2, 16)),
                                      make((2, 12)), cu, cu, causal=True)


def garbage_bytes(rng) -> bytes:
    # 0xff starts a field with an over-long varint tag, so this never parses.
    return b"\xff\xff\xff" + rng.bytes(int(rng.integers(0, 64)))
