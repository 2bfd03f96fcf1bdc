"""Forward and Backward of CUDA tensors through CUDA shared memory, for a server on this host.

The server speaks Triton's CUDA shared memory extension on its gRPC port when started with
--allow_shared_memory: a client registers device memory by its CUDA IPC handle, names it in
ModelInfer requests of attention_forward / attention_backward, and the server's kernels read the
inputs where they lie and write the outputs back into it (server/engine/cuda_resident.cc). The
client keeps one buffer per GPU, registered once and grown when a call needs more; a call copies
its inputs in (device to device), waits for the copies, asks, and copies the outputs out. No
byte crosses PCIe or a socket. The protocol has no saved contexts, so a backward sends q, k, v,
out and lse again, which costs device-to-device copies only.

Imported only where torch is (the torch drop-in's CUDA tensors).
"""
import os
import threading
import uuid
from typing import Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np
import torch

from ._proto.attnserve.v1 import attention_pb2 as pb2
from ._proto.attnserve.v1 import attention_pb2_grpc as pb2_grpc
from ._proto.inference import grpc_service_pb2 as oip
from ._proto.inference import grpc_service_pb2_grpc as oip_grpc
from .errors import AttentionError
from .shared_memory import _NEVER, _REFUSED, HOUSEKEEPING_TIMEOUT_S
from .shared_memory_call import SharedMemoryUnavailable, infer_error

# Tensors start at multiples of this within a buffer (the server's kernels load whole rows).
ALIGNMENT = 256
# Buffers grow in steps of this, so a call a little larger than the last reuses the buffer.
GRANULE = 64 << 20
DATATYPES = {torch.float16: "FP16", torch.bfloat16: "BF16", torch.float32: "FP32"}


def _normalized_uuid(uuid) -> str:
    """A GPU UUID as 32 lowercase hex digits, from nvidia-smi's "GPU-xxxxxxxx-..." (the
    server's) or torch's spelling of it."""
    text = str(uuid).lower()
    text = text[4:] if text.startswith("gpu-") else text
    digits = "".join(c for c in text if c in "0123456789abcdef")
    return digits if len(digits) == 32 else ""  # not a spelling we know: no UUID


def _aligned(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


def ipc_handle(buffer: torch.Tensor) -> Tuple[bytes, int]:
    """The 64 bytes of `buffer`'s cudaIpcMemHandle_t and where the buffer starts in the
    allocation the handle names (torch's caching allocator hands out parts of larger blocks)."""
    _, handle, _, base, *_ = buffer.untyped_storage()._share_cuda_()
    # torch prefixes the handle with its format version and the handle's type ("c": memory
    # from cudaMalloc); expandable segments export another kind, which the server cannot open.
    if len(handle) == 66 and handle[1:2] == b"c":
        handle = handle[2:]
    if len(handle) != 64:
        raise SharedMemoryUnavailable(
            f"this torch exports CUDA memory as a {len(handle)}-byte handle, not a "
            "cudaIpcMemHandle_t (expandable segments?)", permanent=True)
    return handle, base


class CudaBuffer:
    """One device buffer of this process, registered with the server as `name`."""

    def __init__(self, device: torch.device, byte_size: int):
        self.name = f"attnserve-cuda-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        self.memory = torch.empty(byte_size, dtype=torch.uint8, device=device)
        self.handle, self.base = ipc_handle(self.memory)
        self.byte_size = byte_size

    def view(self, offset: int, byte_count: int, like_dtype, shape) -> torch.Tensor:
        return self.memory[offset:offset + byte_count].view(like_dtype).view(shape)

    def parameters(self, offset: int, byte_count: int) -> Dict[str, oip.InferParameter]:
        return {"shared_memory_region": oip.InferParameter(string_param=self.name),
                "shared_memory_offset": oip.InferParameter(int64_param=self.base + offset),
                "shared_memory_byte_size": oip.InferParameter(int64_param=byte_count)}


class CudaSharedMemoryPath:
    """The registered buffers of one client, one per GPU, and the calls that go through them.
    Calls on one GPU take turns (a training step's attention calls come one at a time)."""

    def __init__(self, channel: grpc.Channel, metadata):
        self._stub = oip_grpc.GRPCInferenceServiceStub(channel)
        self._attention = pb2_grpc.AttentionServiceStub(channel)
        self._metadata = metadata
        self._server_ordinals: Optional[Dict[str, int]] = None  # by normalized GPU UUID
        self._lock = threading.Lock()
        self._buffers: Dict[int, CudaBuffer] = {}
        self._turns: Dict[int, threading.Lock] = {}
        self._closed = False
        self._owner_pid = os.getpid()

    def call(self, model: str, inputs: Sequence[Tuple[str, torch.Tensor]],
             inline: Sequence[Tuple[str, np.ndarray]],
             outputs: Sequence[Tuple[str, Tuple[int, ...], torch.dtype]],
             parameters: Dict[str, oip.InferParameter],
             timeout: Optional[float]) -> List[torch.Tensor]:
        """One ModelInfer of `model`: `inputs` (contiguous CUDA tensors of one GPU) through that
        GPU's buffer, `inline` INT32 arrays in the request; returns the `outputs` (name, shape,
        dtype), new tensors on the inputs' GPU."""
        if os.getpid() != self._owner_pid:
            raise SharedMemoryUnavailable("the buffers belong to the parent process",
                                          permanent=True)
        device = inputs[0][1].device
        layout, end = {}, 0
        for name, tensor in inputs:
            layout[name] = (end, tensor.numel() * tensor.element_size())
            end = _aligned(end + layout[name][1])
        for name, shape, dtype in outputs:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            layout[name] = (end, nbytes)
            end = _aligned(end + nbytes)
        with self._turn(device.index):
            buffer = self._buffer(device, max(end, ALIGNMENT))
            request = oip.ModelInferRequest(model_name=model, parameters=parameters)
            for name, tensor in inputs:
                offset, nbytes = layout[name]
                buffer.view(offset, nbytes, tensor.dtype, tensor.shape).copy_(tensor)
                request.inputs.add(name=name, datatype=DATATYPES[tensor.dtype],
                                   shape=tensor.shape, parameters=buffer.parameters(offset, nbytes))
            for name, array in inline:
                request.inputs.add(name=name, datatype="INT32", shape=array.shape)
                request.raw_input_contents.append(array.astype("<i4").tobytes())
            for name, _, _ in outputs:
                request.outputs.add(name=name, parameters=buffer.parameters(*layout[name]))
            # The server's kernels read the buffer from another process: the copies in must be
            # done, not just queued on this process's stream.
            torch.cuda.current_stream(device).synchronize()
            try:
                response = self._stub.ModelInfer(request, timeout=timeout,
                                                 metadata=self._metadata)
            except grpc.RpcError as error:
                if "no shared memory region" in (error.details() or ""):
                    self._forget(device.index)  # the server forgot it: register anew next time
                raise infer_error(error) from error
            answered = {output.name for output in response.outputs}
            results = []
            for name, shape, dtype in outputs:
                if name not in answered:
                    raise AttentionError(grpc.StatusCode.INTERNAL,
                                         f"{name}: missing from the server's answer")
                offset, nbytes = layout[name]
                # The server finished writing before it answered; this copy is ordered after
                # anything later on the stream, and frees the buffer for the next call.
                results.append(buffer.view(offset, nbytes, dtype, shape).clone())
            return results

    def _turn(self, index: int) -> threading.Lock:
        with self._lock:
            return self._turns.setdefault(index, threading.Lock())

    def _buffer(self, device: torch.device, byte_size: int) -> CudaBuffer:
        """The GPU's registered buffer, (re-)registered larger when it is too small."""
        with self._lock:
            if self._closed:
                raise SharedMemoryUnavailable("the client is closed", permanent=True)
            buffer = self._buffers.get(device.index)
        if buffer is not None and buffer.byte_size >= byte_size:
            return buffer
        if buffer is not None:
            self._forget(device.index)
        device_id = self._server_ordinal(device)
        buffer = CudaBuffer(device, -(-byte_size // GRANULE) * GRANULE)
        try:
            self._stub.CudaSharedMemoryRegister(
                oip.CudaSharedMemoryRegisterRequest(
                    name=buffer.name, raw_handle=buffer.handle, device_id=device_id,
                    byte_size=buffer.base + buffer.byte_size),
                timeout=HOUSEKEEPING_TIMEOUT_S, metadata=self._metadata)
        except grpc.RpcError as error:
            if error.code() in _REFUSED:
                raise AttentionError(error.code(), error.details()) from error
            raise SharedMemoryUnavailable(
                f"CudaSharedMemoryRegister: {error.code().name}: {error.details()}",
                permanent=error.code() in _NEVER) from error
        with self._lock:
            self._buffers[device.index] = buffer
        return buffer

    def _server_ordinal(self, device: torch.device) -> int:
        """The server's CUDA ordinal of this GPU. Each process numbers the GPUs it sees (its
        CUDA_VISIBLE_DEVICES), so the GPU's UUID, which the server lists in GetServerInfo,
        decides; by ordinal only where either side cannot tell UUIDs (an older server)."""
        with self._lock:
            ordinals = self._server_ordinals
        if ordinals is None:
            try:
                info = self._attention.GetServerInfo(pb2.GetServerInfoRequest(),
                                                     timeout=HOUSEKEEPING_TIMEOUT_S,
                                                     metadata=self._metadata)
            except grpc.RpcError as error:
                raise SharedMemoryUnavailable(f"GetServerInfo: {error.code().name}: "
                                              f"{error.details()}", permanent=False) from error
            ordinals = {_normalized_uuid(d.uuid): int(d.name.partition(":")[2])
                        for d in info.devices if d.uuid and d.name.startswith("cuda:")}
            with self._lock:
                self._server_ordinals = ordinals
        mine = _normalized_uuid(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
        if not ordinals or not mine:
            return device.index
        if mine not in ordinals:
            raise SharedMemoryUnavailable(f"{device} (UUID {mine}) is not a GPU the server "
                                          "serves", permanent=False)
        return ordinals[mine]

    def _forget(self, index: int) -> None:
        with self._lock:
            buffer = self._buffers.pop(index, None)
        if buffer is not None:
            self._unregister(buffer)

    def _unregister(self, buffer: CudaBuffer) -> None:
        """Best effort: a server gone or restarted has nothing left to close, and one that
        missed this closes the handle after its idle timeout."""
        try:
            self._stub.CudaSharedMemoryUnregister(
                oip.CudaSharedMemoryUnregisterRequest(name=buffer.name),
                timeout=HOUSEKEEPING_TIMEOUT_S, metadata=self._metadata)
        except grpc.RpcError:
            pass

    def close(self) -> None:
        """Unregisters every buffer (in a forked child: nothing, they are the parent's)."""
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            self._closed = True
            buffers, self._buffers = list(self._buffers.values()), {}
        for buffer in buffers:
            self._unregister(buffer)
