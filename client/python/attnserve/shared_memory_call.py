"""One Forward or Backward through a registered shared-memory region: one ModelInfer, or for a
large call a pipeline of ModelInfers of its chunks of sequences (shared_memory_chunks.py).

The pipeline is driven by events, so the copy threads never wait: every chunk's input copies
are queued at once, in order; the last copy of a chunk sends its request; the answer queues
the chunk's output copies. So the threads copy chunk i + 1 in while the server works on chunk
i, and copy chunk i out between later chunks' inputs, and only the first chunk's copy and the
last chunk's server time and copy-out are not hidden behind other work.
"""
import threading
import time
from concurrent import futures
from typing import Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from ._proto.inference import grpc_service_pb2 as oip
from . import parallel_copy
from .errors import AttentionError
from .shared_memory_chunks import HEAD_MAJOR, Chunk, chunk_shape, plan_chunks

# Tensors start at multiples of this, so the server's kernels read aligned rows.
ALIGNMENT = 64


class SharedMemoryUnavailable(Exception):
    """This call cannot go through shared memory; `permanent` when no later call can either."""

    def __init__(self, reason: str, permanent: bool):
        super().__init__(reason)
        self.permanent = permanent


def aligned(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


class Layout:
    """Where each tensor of one call lies in a region, each aligned: inputs, then outputs;
    token-major tensors whole (a chunk's rows are a slice of them), head-major ones (lse) one
    area per chunk when the call is cut into several."""

    def __init__(self, tensors: Sequence[Tuple[str, np.ndarray]], chunks: Sequence[Chunk]):
        self.single = len(chunks) == 1
        self._areas: Dict[Tuple[str, int], int] = {}
        end = 0
        for name, array in tensors:
            pieces = ([(index, array.dtype.itemsize * array.shape[0] * (c.q_stop - c.q_start))
                       for index, c in enumerate(chunks)]
                      if name in HEAD_MAJOR and not self.single else [(0, array.nbytes)])
            for index, byte_count in pieces:
                self._areas[(name, index)] = end
                end = aligned(end + byte_count)
        self.byte_size = max(end, ALIGNMENT)

    def place(self, name: str, array: np.ndarray, index: int, chunk: Chunk):
        """(offset, byte count, shape) of `name`'s part in chunk `index`'s call."""
        if self.single:
            return self._areas[(name, 0)], array.nbytes, array.shape
        shape = chunk_shape(name, array, chunk)
        byte_count = array.dtype.itemsize * int(np.prod(shape))
        if name in HEAD_MAJOR:
            return self._areas[(name, index)], byte_count, shape
        row_bytes = byte_count // shape[0] if shape[0] else 0
        return self._areas[(name, 0)] + chunk.rows(name)[0] * row_bytes, byte_count, shape


class InferCall:
    """One call of `model`: `inputs` (name, OIP datatype, wire array) copied into the region,
    `offsets` (cu_seqlens_q, cu_seqlens_k) inline, the server's answers copied into `outputs`.
    After run(), region_free says whether the server is done with the region (false when a
    call ended without the server's answer, which may still write there)."""

    def __init__(self, stub, metadata, model: str, inputs: Sequence[Tuple[str, str, np.ndarray]],
                 offsets: Dict[str, np.ndarray], outputs: Sequence[Tuple[str, np.ndarray]],
                 parameters: Dict[str, oip.InferParameter], timeout: Optional[float]):
        self._stub, self._metadata, self._model = stub, metadata, model
        self._inputs, self._outputs, self._parameters = inputs, outputs, parameters
        self._offsets = {name: np.asarray(array) for name, array in offsets.items()}
        for name, array in self._offsets.items():
            if not np.array_equal(array.astype("<i4"), array):  # as protobuf refuses natively
                raise ValueError(f"{name}: values outside the int32 range")
        tensors = [(name, array) for name, _, array in inputs] + list(outputs)
        # A chunk's sequences are numbered from 0 in its request, and the dropout mask is keyed
        # by the sequence's index: with dropout the call goes whole.
        dropout = "dropout_p" in parameters and parameters["dropout_p"].double_param > 0
        self.chunks = (plan_chunks(dict(tensors), self._offsets["cu_seqlens_q"],
                                   self._offsets["cu_seqlens_k"], splittable=not dropout))
        self.layout = Layout(tensors, self.chunks)
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self.region_free = True
        self._region = None
        self._done = threading.Condition()
        self._unfinished = 0
        self._failure: Optional[Exception] = None

    def run(self, region) -> None:
        self._region = region
        if len(self.chunks) == 1:
            self._run_one()
        else:
            self._run_pipeline()

    # --- one request ----------------------------------------------------------------------

    def _run_one(self) -> None:
        chunk = self.chunks[0]
        _copy_all(self._input_copies(0, chunk))
        try:
            response = self._stub.ModelInfer(self._request(0, chunk), timeout=self._remaining(),
                                             metadata=self._metadata)
        except grpc.RpcError as error:
            self.region_free = _finished_with(error)
            raise infer_error(error) from error
        _copy_all(self._output_copies(0, chunk, response))

    # --- a pipeline of chunks -------------------------------------------------------------

    def _run_pipeline(self) -> None:
        self._unfinished = len(self.chunks)
        for index, chunk in enumerate(self.chunks):
            try:
                self._queue_inputs(index, chunk)
            except Exception as error:  # noqa: BLE001 (raised below, once nothing runs)
                # The chunks queued so far still run and end; the rest never start. Waiting
                # for them keeps the region in use until no copy or call touches it.
                self._fail(error.with_traceback(None))
                with self._done:
                    self._unfinished -= len(self.chunks) - index
                break
        with self._done:
            while self._unfinished > 0:
                self._done.wait()
        if self._failure is not None:
            raise self._failure

    def _queue_inputs(self, index, chunk) -> None:
        """Queues the chunk's input copies (in a function of its own, so that no frame of an
        exception run() raises holds a view of the region, which could then not be unmapped)."""
        copies = _sliced(self._input_copies(index, chunk))
        left = [len(copies)]
        queued = []
        try:
            while copies:  # popped, so that this frame holds no view once the copies are done
                queued.append(parallel_copy.submit(self._copy_in, index, chunk, left,
                                                   list(copies.pop())))
        except BaseException:
            # This chunk will not be sent (its count never reaches 0): its copies already
            # queued must end before the caller lets the region go.
            copies.clear()
            futures.wait(queued)
            raise

    def _copy_in(self, index, chunk, left, pair) -> None:
        if self._failure is None:
            self._copy_pair(pair)
        else:
            pair.clear()
        with self._done:
            left[0] -= 1
            if left[0]:
                return
        self._send(index, chunk)

    def _send(self, index, chunk) -> None:
        """The chunk's inputs are in: its request goes out, unless the call failed."""
        if self._failure is not None:
            self._chunk_done()
            return
        try:
            future = self._stub.ModelInfer.future(self._request(index, chunk),
                                                  timeout=self._remaining(),
                                                  metadata=self._metadata)
        except Exception as error:  # noqa: BLE001
            self._fail(error)
            self._chunk_done()
            return
        future.add_done_callback(lambda answer: self._answered(index, chunk, answer))

    def _answered(self, index, chunk, answer) -> None:
        """On gRPC's thread: queues the chunk's output copies, or records its error."""
        try:
            response = answer.result()
            copies = [] if self._failure is not None else _sliced(
                self._output_copies(index, chunk, response))
        except grpc.RpcError as error:
            self._fail(infer_error(error), region_free=_finished_with(error))
            copies = []
        except Exception as error:  # noqa: BLE001
            self._fail(error.with_traceback(None))
            copies = []
        if not copies:
            self._chunk_done()
            return
        left = [len(copies)]
        while copies:  # popped, so that this frame holds no view once the copies are done
            parallel_copy.submit(self._copy_out, left, list(copies.pop()))

    def _copy_out(self, left, pair) -> None:
        self._copy_pair(pair)
        with self._done:
            left[0] -= 1
            if left[0]:
                return
        self._chunk_done()

    def _copy_pair(self, pair: list) -> None:
        """Copies pair = [destination, source] and empties it: once the last copy of a call
        counts down, run() returns and the region may be unmapped, so no task (nor the pool's
        record of its arguments) may still hold a view of it."""
        destination, source = pair
        pair.clear()
        try:
            np.copyto(destination, source)
        except Exception as error:  # noqa: BLE001 (raised by run() on the caller's thread)
            self._fail(error.with_traceback(None))  # its frames hold views of the region

    def _fail(self, error: Exception, region_free: bool = True) -> None:
        with self._done:
            if self._failure is None:
                self._failure = error
            self.region_free = self.region_free and region_free

    def _chunk_done(self) -> None:
        with self._done:
            self._unfinished -= 1
            self._done.notify_all()

    # --- requests and copies --------------------------------------------------------------

    def _remaining(self) -> Optional[float]:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def _request(self, index: int, chunk: Chunk) -> oip.ModelInferRequest:
        request = oip.ModelInferRequest(model_name=self._model, parameters=self._parameters)
        for name, datatype, array in self._inputs:
            offset, byte_count, shape = self.layout.place(name, array, index, chunk)
            request.inputs.add(name=name, datatype=datatype, shape=shape,
                               parameters=self._placement(offset, byte_count))
        for name in ("cu_seqlens_q", "cu_seqlens_k"):
            wire = (self._offsets[name] if self.layout.single
                    else getattr(chunk, name)).astype("<i4")
            request.inputs.add(name=name, datatype="INT32", shape=wire.shape)
            request.raw_input_contents.append(wire.tobytes())
        for name, array in self._outputs:
            offset, byte_count, _ = self.layout.place(name, array, index, chunk)
            request.outputs.add(name=name, parameters=self._placement(offset, byte_count))
        return request

    def _placement(self, offset: int, byte_count: int) -> Dict[str, oip.InferParameter]:
        return {"shared_memory_region": oip.InferParameter(string_param=self._region.name),
                "shared_memory_offset": oip.InferParameter(int64_param=offset),
                "shared_memory_byte_size": oip.InferParameter(int64_param=byte_count)}

    def _in_region(self, name: str, array: np.ndarray, index: int, chunk: Chunk) -> np.ndarray:
        offset, byte_count, shape = self.layout.place(name, array, index, chunk)
        return self._region.view(offset, byte_count).view(array.dtype).reshape(shape)

    def _input_copies(self, index, chunk) -> List[Tuple[np.ndarray, np.ndarray]]:
        return [(self._in_region(name, array, index, chunk),
                 _part(array, name, chunk, self.layout.single))
                for name, _, array in self._inputs]

    def _output_copies(self, index, chunk, response) -> List[Tuple[np.ndarray, np.ndarray]]:
        """(caller's array, region) pairs of the chunk's outputs, once the answer says the
        server wrote each where it was asked to."""
        answered = {output.name: output for output in response.outputs}
        copies = []
        for name, array in self._outputs:
            source = self._in_region(name, array, index, chunk)
            _check_output(answered.get(name), source.shape, self._region.name, name)
            copies.append((_part(array, name, chunk, self.layout.single), source))
        return copies


def _part(array: np.ndarray, name: str, chunk: Chunk, single: bool) -> np.ndarray:
    """The caller's array restricted to the chunk (a view)."""
    if single:
        return array
    start, stop = chunk.rows(name)
    return array[:, start:stop] if name in HEAD_MAJOR else array[start:stop]


def _copy_all(copies: List[Tuple[np.ndarray, np.ndarray]]) -> None:
    """destination[...] = source for each pair: contiguous bytes on several threads, else
    numpy's copy. (In a function of its own so that no frame an exception keeps holds a view
    of the region, which could then not be unmapped.)"""
    for destination, source in copies:
        if destination.flags.c_contiguous and source.flags.c_contiguous:
            parallel_copy.copy_bytes(destination.reshape(-1).view(np.uint8),
                                     source.reshape(-1).view(np.uint8))
        else:
            np.copyto(destination, source)


def _sliced(copies) -> List[Tuple[np.ndarray, np.ndarray]]:
    """The copies cut into the slices the copy threads take one each."""
    slices = []
    for destination, source in copies:
        if not (destination.flags.c_contiguous and source.flags.c_contiguous):
            slices.append((destination, source))
            continue
        to, of = destination.reshape(-1).view(np.uint8), source.reshape(-1).view(np.uint8)
        slices.extend((to[a:b], of[a:b]) for a, b in parallel_copy.byte_slices(to.nbytes))
    return slices


def infer_error(error: grpc.RpcError) -> Exception:
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


def _check_output(output, expected: Sequence[int], region: str, name: str) -> None:
    """The server wrote `name` into the region with the expected shape."""
    if (output is None or output.parameters["shared_memory_region"].string_param != region
            or tuple(output.shape) != tuple(expected)):
        shape = None if output is None else list(output.shape)
        raise AttentionError(grpc.StatusCode.INTERNAL,
                             f"{name}: the server answered shape {shape} outside region "
                             f"{region!r}; expected {list(expected)} in it")


# Answers the server gives before or instead of computing: it no longer touches the region.
# After any other (a deadline the client enforced, a lost connection) it may still write there.
_ANSWERED_AND_DONE = frozenset((
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED))


def _finished_with(error: grpc.RpcError) -> bool:
    """Whether the server is done with the region after this error: it answered, and the
    region is one it still knows (a forgotten one must not be used again either)."""
    return (error.code() in _ANSWERED_AND_DONE
            and "no shared memory region" not in (error.details() or ""))
