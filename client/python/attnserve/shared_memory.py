"""Forward and Backward through POSIX shared memory, for a server on this host.

The server speaks Triton's system shared memory extension on its gRPC port (the Open Inference
Protocol's inference.GRPCInferenceService), when started with --allow_shared_memory. The client
owns a shared-memory object, registers it once, copies a call's inputs into it and names them in
a ModelInfer request of attention_forward / attention_backward; the server reads them in place
and writes the outputs into the same object, from which they are copied into the caller's
arrays. Compared with the data channel over loopback TCP, input bytes are copied once by the
client and read in place by the server, outputs copied once by each, and none passes through
the kernel's socket buffers.

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

# Tensors start at multiples of this, so the server's kernels read aligned rows.
ALIGNMENT = 64
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


class SharedMemoryUnavailable(Exception):
    """This call cannot go through shared memory; `permanent` when no later call can either."""

    def __init__(self, reason: str, permanent: bool):
        super().__init__(reason)
        self.permanent = permanent


def _aligned(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


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


class Layout:
    """Where each tensor of one call lies in a region: inputs, then outputs, each aligned."""

    def __init__(self, inputs: Sequence[Tuple[str, np.ndarray]],
                 outputs: Sequence[Tuple[str, np.ndarray]]):
        self.offsets: Dict[str, Tuple[int, int]] = {}
        end = 0
        for name, array in (*inputs, *outputs):
            self.offsets[name] = (end, array.nbytes)
            end = _aligned(end + array.nbytes)
        self.byte_size = max(end, ALIGNMENT)

    def parameters(self, region: Region, name: str) -> Dict[str, oip.InferParameter]:
        offset, byte_count = self.offsets[name]
        return {"shared_memory_region": oip.InferParameter(string_param=region.name),
                "shared_memory_offset": oip.InferParameter(int64_param=offset),
                "shared_memory_byte_size": oip.InferParameter(int64_param=byte_count)}


def request_parameters(options: pb2.AttentionOptions,
                       deterministic: Optional[bool]) -> Dict[str, oip.InferParameter]:
    """The native AttentionOptions as DESIGN.md's OIP request parameters. Values the native
    wire leaves at their defaults (scale 0, softcap 0, unbounded windows) are left out."""
    parameters = {"causal": oip.InferParameter(bool_param=options.causal)}
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
        """One ModelInfer of `model`: `inputs` (name, OIP datatype, wire array) through a region,
        `inline` INT32 arrays in the request, the server's `outputs` written into the given
        arrays (C-contiguous, of the expected shapes and dtypes)."""
        layout = Layout([(name, array) for name, _, array in inputs], outputs)
        if os.getpid() != self._owner_pid:
            raise SharedMemoryUnavailable("the regions belong to the parent process",
                                          permanent=True)
        region = self._acquire(layout.byte_size)
        stale = False  # the server no longer knows the region
        try:
            request = oip.ModelInferRequest(model_name=model, parameters=parameters)
            for name, datatype, array in inputs:
                offset, byte_count = layout.offsets[name]
                region.view(offset, byte_count)[:] = array.reshape(-1).view(np.uint8)
                request.inputs.add(name=name, datatype=datatype, shape=array.shape,
                                   parameters=layout.parameters(region, name))
            for name, array in inline:
                wire = array.astype("<i4")
                if not np.array_equal(wire, array):  # as protobuf refuses them natively
                    raise ValueError(f"{name}: values outside the int32 range")
                request.inputs.add(name=name, datatype="INT32", shape=array.shape)
                request.raw_input_contents.append(wire.tobytes())
            for name, _ in outputs:
                request.outputs.add(name=name, parameters=layout.parameters(region, name))
            try:
                response = self._stub.ModelInfer(request, timeout=timeout,
                                                 metadata=self._metadata)
            except grpc.RpcError as error:
                stale = "no shared memory region" in (error.details() or "")
                raise _infer_error(error) from error
            answered = {output.name: output for output in response.outputs}
            for name, array in outputs:
                _check_output(answered.get(name), array, region.name, name)
                offset, byte_count = layout.offsets[name]
                array.reshape(-1).view(np.uint8)[:] = region.view(offset, byte_count)
        finally:
            self._release(region, keep=not stale)

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


def _infer_error(error: grpc.RpcError) -> Exception:
    """SharedMemoryUnavailable for answers about shared memory itself, else the AttentionError
    every other path raises. A region the server forgot (swept after its idle timeout, lost in
    a restart) and a server out of reach (which the other paths retry) fail this call only;
    shared memory turned off or regions refused fail every later one too."""
    details = error.details() or ""
    if (error.code() == grpc.StatusCode.UNAVAILABLE
            or "no shared memory region" in details):
        return SharedMemoryUnavailable(f"ModelInfer: {error.code().name}: {details}",
                                       permanent=False)
    if (error.code() == grpc.StatusCode.FAILED_PRECONDITION
            or error.code() == grpc.StatusCode.INVALID_ARGUMENT
            and ".shared_memory_" in details):
        return SharedMemoryUnavailable(f"ModelInfer: {error.code().name}: {details}",
                                       permanent=True)
    return AttentionError(error.code(), details)


def _check_output(output, expected: np.ndarray, region: str, name: str) -> None:
    """The server wrote `name` into the region with the shape the caller's array has."""
    if (output is None or output.parameters["shared_memory_region"].string_param != region
            or tuple(output.shape) != expected.shape):
        shape = None if output is None else list(output.shape)
        raise AttentionError(grpc.StatusCode.INTERNAL,
                             f"{name}: the server answered shape {shape} outside region "
                             f"{region!r}; expected {list(expected.shape)} in it")
