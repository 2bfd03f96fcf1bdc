"""A CUDA shared memory region made with torch, as a co-located client makes one: a device
buffer whose IPC handle is registered with the server (Triton's CUDA shared memory extension),
tensors copied in at aligned offsets, ModelInfer inputs and outputs naming them. Shared by the
GPU test (tests/gpu/test_cuda_shared_memory_gpu.py) and bench/cuda_ipc_bench.py."""
import grpc
import torch

from attnserve._proto.inference import grpc_service_pb2 as oip
from attnserve._proto.inference import grpc_service_pb2_grpc as oip_grpc
from attnserve.cuda_shared_memory import ipc_handle

ALIGNMENT = 256
OIP_DTYPES = {torch.bfloat16: "BF16", torch.float16: "FP16", torch.float32: "FP32",
              torch.int32: "INT32"}


class CudaRegion:
    def __init__(self, target: str, name: str, byte_size: int, device: int = 0):
        self.channel = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        self.stub = oip_grpc.GRPCInferenceServiceStub(self.channel)
        self.name = name
        self.buffer = torch.empty(byte_size, dtype=torch.uint8, device=f"cuda:{device}")
        # The handle names the caching allocator's whole block: the buffer starts `base` in.
        self.handle, self.base = ipc_handle(self.buffer)
        self.device = device
        self.used = 0
        self.places = {}

    def register(self):
        self.register_as(self.name, self.base + self.buffer.numel())

    def register_as(self, name: str, byte_size: int):
        self.stub.CudaSharedMemoryRegister(oip.CudaSharedMemoryRegisterRequest(
            name=name, raw_handle=self.handle, device_id=self.device, byte_size=byte_size))

    def unregister(self):
        self.stub.CudaSharedMemoryUnregister(
            oip.CudaSharedMemoryUnregisterRequest(name=self.name))

    def place(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A tensor shaped like `like` at the region's next aligned offset (kept by name)."""
        nbytes = like.numel() * like.element_size()
        at = self.used
        self.used = (at + nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        assert self.used <= self.buffer.numel(), "region too small"
        view = self.buffer[at:at + nbytes].view(like.dtype).view(like.shape)
        self.places[name] = (view, at, nbytes)
        return view

    def parameters(self, name: str):
        _, at, nbytes = self.places[name]
        return {"shared_memory_region": oip.InferParameter(string_param=self.name),
                "shared_memory_offset": oip.InferParameter(int64_param=self.base + at),
                "shared_memory_byte_size": oip.InferParameter(int64_param=nbytes)}

    def input(self, name: str):
        view = self.places[name][0]
        return oip.ModelInferRequest.InferInputTensor(
            name=name, datatype=OIP_DTYPES[view.dtype], shape=list(view.shape),
            parameters=self.parameters(name))

    def output(self, name: str):
        return oip.ModelInferRequest.InferRequestedOutputTensor(
            name=name, parameters=self.parameters(name))

    def infer(self, model: str, inputs, outputs, offsets, options=None):
        """ModelInfer with `inputs` and `outputs` (names placed in the region) and the offsets
        inline (raw_input_contents: one per input outside shared memory, in order); returns the
        response."""
        request = oip.ModelInferRequest(model_name=model)
        for key, value in (options or {}).items():
            param = (oip.InferParameter(bool_param=value) if isinstance(value, bool)
                     else oip.InferParameter(double_param=value))
            request.parameters[key].CopyFrom(param)
        request.inputs.extend(self.input(n) for n in inputs)
        for name, values in offsets.items():
            request.inputs.append(oip.ModelInferRequest.InferInputTensor(
                name=name, datatype="INT32", shape=[len(values)]))
            request.raw_input_contents.append(
                torch.tensor(values, dtype=torch.int32).numpy().tobytes())
        request.outputs.extend(self.output(n) for n in outputs)
        return self.stub.ModelInfer(request, timeout=120)

    def close(self):
        try:
            self.unregister()
        except grpc.RpcError:
            pass
        self.channel.close()
