"""Forward and Backward through POSIX shared memory, for a server on this host.

The server speaks Triton's system shared memory extension on its gRPC port (the Open Inference
Protocol's inference.GRPCInferenceService), when started with --allow_shared_memory. The client
owns a shared-memory object, registers it once, copies a call's inputs into it and names them in
a ModelInfer request of attention_forward / attention_backward; the server reads them in place
and writes the outputs into the same object, from which they are copied into the caller's
arrays. Compared with the data channel over loopback TCP, input bytes are copied once by the
client and read in place by the server, outputs copied once by each, and none passes through
the kernel's socket buffers. How one call uses its region (copies on several threads, large
calls as a pipeline of chunks of sequences) is shared_memory_call.py's.

One region serves one call at a time; concurrent calls (forward_async) each take a region of a
small pool, created on demand, so the client's threads never wait for each other.
"""
import os
import threading
import uuid
from typing import Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

from ._proto.attnserve.v1 import attention_pb2 as pb2
from ._proto.inference import grpc_service_pb2 as oip
from ._proto.inference import grpc_service_pb2_grpc as oip_grpc
from .errors import AttentionError
from .shared_memory_call import InferCall, SharedMemoryUnavailable

# Regions are sized in whole MiB: a call a little larger than the last reuses the region.
GRANULE = 1 << 20
# Deadline of the bookkeeping calls (register, unregister) that run outside a caller's call.
HOUSEKEEPING_TIMEOUT_S = 5.0

DATATYPES = {pb2.DTYPE_FLOAT16: "FP16", pb2.DTYPE_BFLOAT16: "BF16", pb2.DTYPE_FLOAT32: "FP32"}

# Register answers that say this server will never map this client's memory: shared memory
# off (FAILED_PRECONDITION), an object it cannot open (another container's /dev/shm:
# INVALID_ARGUMENT), no inference service at all. Its region limit (RESOURCE_EXHAUSTED) is
# not among them: other clients' regions come and go.
_NEVER = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
          grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND)

# Register answers about the caller, not shared memory: raised as any call's would be.
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class Region:
    """One POSIX shared-memory object of this process, registered with the server as `name`."""

    def __init__(self, byte_size: int):
        self.name = f"attnserve-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        self.memory = SharedMemory(name=self.name, create=True, size=byte_size)
        self.byte_size = byte_size
        try:
            # tmpfs allocates pages on first touch; past /dev/shm's size (64 MiB in a default
            # Docker container) that touch is a SIGBUS. Reserving them now fails cleanly.
            os.posix_fallocate(self.memory._fd, 0, byte_size)
        except OSError as error:
            self.destroy()
            raise SharedMemoryUnavailable(f"cannot reserve {byte_size} bytes of shared memory: "
                                          f"{error}", permanent=False) from error

    @property
    def key(self) -> str:
        return "/" + self.memory.name

    def view(self, offset: int, byte_count: int) -> np.ndarray:
        return np.frombuffer(self.memory.buf, np.uint8, byte_count, offset)

    def destroy(self) -> None:
        """Unmaps and unlinks the object. unlink() also takes it off the stdlib's
        resource_tracker, which would otherwise warn of a leak at exit; the tracker stays the
        safety net that unlinks it if this process dies first."""
        self.memory.close()
        try:
            self.memory.unlink()
        except FileNotFoundError:  # already gone (someone cleaned /dev/shm): untrack it
            resource_tracker.unregister(self.memory._name, "shared_memory")


def oip_can_carry(options: pb2.AttentionOptions, dropout_seed: int) -> bool:
    """Whether the OIP models can run these options: they take no ALiBi, and dropout only with
    the caller's seed (an OIP answer has no place for one the server would pick)."""
    return not options.HasField("alibi_slopes") and (not options.dropout_p or dropout_seed != 0)


def request_parameters(options: pb2.AttentionOptions, deterministic: Optional[bool],
                       dropout_seed: int = 0) -> Dict[str, oip.InferParameter]:
    """The native AttentionOptions as DESIGN.md's OIP request parameters. Values the native
    wire leaves at their defaults (scale 0, softcap 0, unbounded windows) are left out."""
    parameters = {"causal": oip.InferParameter(bool_param=options.causal)}
    if options.dropout_p:
        parameters["dropout_p"] = oip.InferParameter(double_param=options.dropout_p)
        # int64 on OIP: the uint64 seed's bits.
        signed = dropout_seed - (1 << 64) if dropout_seed >= 1 << 63 else dropout_seed
        parameters["dropout_seed"] = oip.InferParameter(int64_param=signed)
    if options.softmax_scale:
        parameters["softmax_scale"] = oip.InferParameter(double_param=options.softmax_scale)
    if options.softcap:
        parameters["softcap"] = oip.InferParameter(double_param=options.softcap)
    for side in ("window_left", "window_right"):
        if options.HasField(side):
            parameters[side] = oip.InferParameter(int64_param=getattr(options, side))
    if deterministic is not None:
        parameters["deterministic"] = oip.InferParameter(bool_param=deterministic)
    return parameters


class SharedMemoryPath:
    """Registered regions of one client and the calls that go through them."""

    def __init__(self, channel: grpc.Channel, metadata):
        self._stub = oip_grpc.GRPCInferenceServiceStub(channel)
        self._metadata = metadata
        self._lock = threading.Lock()
        self._idle: List[Region] = []  # registered, not in use by a call
        self._busy: List[Region] = []
        self._closed = False
        # A child forked from the owner shares its regions: it must neither write into them
        # nor unregister or unlink them (at its exit, say) under the owner's feet.
        self._owner_pid = os.getpid()

    def ensure_registered(self) -> None:
        """Registers a first (small) region unless one is: the server's answer tells whether
        this client may use shared memory at all."""
        with self._lock:
            if self._idle or self._busy:
                return
        self._release(self._acquire(GRANULE))

    def call(self, model: str, inputs: Sequence[Tuple[str, str, np.ndarray]],
             inline: Sequence[Tuple[str, np.ndarray]], outputs: Sequence[Tuple[str, np.ndarray]],
             parameters: Dict[str, oip.InferParameter], timeout: Optional[float]) -> None:
        """One call of `model` through a region (shared_memory_call.py): `inputs` (name, OIP
        datatype, wire array) copied in, `inline` the INT32 offsets cu_seqlens_q and
        cu_seqlens_k in the request, the server's `outputs` written into the given arrays
        (C-contiguous, of the expected shapes and dtypes)."""
        if os.getpid() != self._owner_pid:
            raise SharedMemoryUnavailable("the regions belong to the parent process",
                                          permanent=True)
        call = InferCall(self._stub, self._metadata, model, inputs, dict(inline), outputs,
                         parameters, timeout)
        region = self._acquire(call.layout.byte_size)
        try:
            call.run(region)
        finally:
            self._release(region, keep=call.region_free)

    def _acquire(self, byte_size: int) -> Region:
        """A registered region of at least byte_size bytes, for this caller alone: an idle one,
        re-registered larger when it is too small, else a new one."""
        with self._lock:
            if self._closed:
                raise SharedMemoryUnavailable("the client is closed", permanent=True)
            region = max(self._idle, key=lambda r: r.byte_size, default=None)
            if region is not None:
                self._idle.remove(region)
                if region.byte_size >= byte_size:
                    self._busy.append(region)
                    return region
        if region is not None:
            self._drop(region)
        region = Region(-(-byte_size // GRANULE) * GRANULE)
        try:
            self._stub.SystemSharedMemoryRegister(
                oip.SystemSharedMemoryRegisterRequest(name=region.name, key=region.key,
                                                      offset=0, byte_size=region.byte_size),
                timeout=HOUSEKEEPING_TIMEOUT_S, metadata=self._metadata)
        except grpc.RpcError as error:
            region.destroy()
            if error.code() in _REFUSED:  # the call itself would be refused the same way
                raise AttentionError(error.code(), error.details()) from error
            raise SharedMemoryUnavailable(
                f"SystemSharedMemoryRegister: {error.code().name}: {error.details()}",
                permanent=error.code() in _NEVER) from error
        with self._lock:
            self._busy.append(region)
            closed = self._closed
        if closed:  # close() ran meanwhile: it did not see this region
            self._release(region)
            raise SharedMemoryUnavailable("the client is closed", permanent=True)
        return region

    def _release(self, region: Region, keep: bool = True) -> None:
        with self._lock:
            self._busy.remove(region)
            if keep and not self._closed:
                self._idle.append(region)
                return
        self._drop(region)

    def _drop(self, region: Region) -> None:
        """Unregisters (best effort: a server gone or restarted has no mapping left to free,
        and one that missed this unregisters after its idle timeout) and unlinks."""
        try:
            self._stub.SystemSharedMemoryUnregister(
                oip.SystemSharedMemoryUnregisterRequest(name=region.name),
                timeout=HOUSEKEEPING_TIMEOUT_S, metadata=self._metadata)
        except grpc.RpcError:
            pass
        region.destroy()

    def close(self) -> None:
        """Unregisters and unlinks every region; a call still running drops its own at its
        end. In a forked child, does nothing: the regions are the parent's."""
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for region in idle:
            self._drop(region)
