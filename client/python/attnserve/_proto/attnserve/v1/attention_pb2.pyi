from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_FLOAT32: DType

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class AttentionOptions(_message.Message):
    __slots__ = ("softmax_scale", "causal", "window_left", "window_right", "softcap", "dropout_p", "alibi_slopes")
    SOFTMAX_SCALE_FIELD_NUMBER: _ClassVar[int]
    CAUSAL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_LEFT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_RIGHT_FIELD_NUMBER: _ClassVar[int]
    SOFTCAP_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_P_FIELD_NUMBER: _ClassVar[int]
    ALIBI_SLOPES_FIELD_NUMBER: _ClassVar[int]
    softmax_scale: float
    causal: bool
    window_left: int
    window_right: int
    softcap: float
    dropout_p: float
    alibi_slopes: Tensor
    def __init__(self, softmax_scale: _Optional[float] = ..., causal: bool = ..., window_left: _Optional[int] = ..., window_right: _Optional[int] = ..., softcap: _Optional[float] = ..., dropout_p: _Optional[float] = ..., alibi_slopes: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "options", "keep_context", "dropout_seed")
    Q_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    V_FIELD_NUMBER: _ClassVar[int]
    CU_SEQLENS_Q_FIELD_NUMBER: _ClassVar[int]
    CU_SEQLENS_K_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    KEEP_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_SEED_FIELD_NUMBER: _ClassVar[int]
    q: Tensor
    k: Tensor
    v: Tensor
    cu_seqlens_q: _containers.RepeatedScalarFieldContainer[int]
    cu_seqlens_k: _containers.RepeatedScalarFieldContainer[int]
    options: AttentionOptions
    keep_context: bool
    dropout_seed: int
    def __init__(self, q: _Optional[_Union[Tensor, _Mapping]] = ..., k: _Optional[_Union[Tensor, _Mapping]] = ..., v: _Optional[_Union[Tensor, _Mapping]] = ..., cu_seqlens_q: _Optional[_Iterable[int]] = ..., cu_seqlens_k: _Optional[_Iterable[int]] = ..., options: _Optional[_Union[AttentionOptions, _Mapping]] = ..., keep_context: bool = ..., dropout_seed: _Optional[int] = ...) -> None: ...

class ForwardResponse(_message.Message):
    __slots__ = ("out", "lse", "execution", "context_id", "context_address", "dropout_seed")
    OUT_FIELD_NUMBER: _ClassVar[int]
    LSE_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_SEED_FIELD_NUMBER: _ClassVar[int]
    out: Tensor
    lse: Tensor
    execution: Execution
    context_id: str
    context_address: str
    dropout_seed: int
    def __init__(self, out: _Optional[_Union[Tensor, _Mapping]] = ..., lse: _Optional[_Union[Tensor, _Mapping]] = ..., execution: _Optional[_Union[Execution, _Mapping]] = ..., context_id: _Optional[str] = ..., context_address: _Optional[str] = ..., dropout_seed: _Optional[int] = ...) -> None: ...

class BackwardRequest(_message.Message):
    __slots__ = ("dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k", "options", "deterministic", "context_id", "keep_context", "dropout_seed")
    DOUT_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    V_FIELD_NUMBER: _ClassVar[int]
    OUT_FIELD_NUMBER: _ClassVar[int]
    LSE_FIELD_NUMBER: _ClassVar[int]
    CU_SEQLENS_Q_FIELD_NUMBER: _ClassVar[int]
    CU_SEQLENS_K_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_SEED_FIELD_NUMBER: _ClassVar[int]
    dout: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    out: Tensor
    lse: Tensor
    cu_seqlens_q: _containers.RepeatedScalarFieldContainer[int]
    cu_seqlens_k: _containers.RepeatedScalarFieldContainer[int]
    options: AttentionOptions
    deterministic: bool
    context_id: str
    keep_context: bool
    dropout_seed: int
    def __init__(self, dout: _Optional[_Union[Tensor, _Mapping]] = ..., q: _Optional[_Union[Tensor, _Mapping]] = ..., k: _Optional[_Union[Tensor, _Mapping]] = ..., v: _Optional[_Union[Tensor, _Mapping]] = ..., out: _Optional[_Union[Tensor, _Mapping]] = ..., lse: _Optional[_Union[Tensor, _Mapping]] = ..., cu_seqlens_q: _Optional[_Iterable[int]] = ..., cu_seqlens_k: _Optional[_Iterable[int]] = ..., options: _Optional[_Union[AttentionOptions, _Mapping]] = ..., deterministic: bool = ..., context_id: _Optional[str] = ..., keep_context: bool = ..., dropout_seed: _Optional[int] = ...) -> None: ...

class BackwardResponse(_message.Message):
    __slots__ = ("dq", "dk", "dv", "execution")
    DQ_FIELD_NUMBER: _ClassVar[int]
    DK_FIELD_NUMBER: _ClassVar[int]
    DV_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    dq: Tensor
    dk: Tensor
    dv: Tensor
    execution: Execution
    def __init__(self, dq: _Optional[_Union[Tensor, _Mapping]] = ..., dk: _Optional[_Union[Tensor, _Mapping]] = ..., dv: _Optional[_Union[Tensor, _Mapping]] = ..., execution: _Optional[_Union[Execution, _Mapping]] = ...) -> None: ...

class Execution(_message.Message):
    __slots__ = ("device", "kernel", "queue_us", "compute_us", "batched_requests", "code_path")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_US_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_US_FIELD_NUMBER: _ClassVar[int]
    BATCHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CODE_PATH_FIELD_NUMBER: _ClassVar[int]
    device: str
    kernel: str
    queue_us: int
    compute_us: int
    batched_requests: int
    code_path: str
    def __init__(self, device: _Optional[str] = ..., kernel: _Optional[str] = ..., queue_us: _Optional[int] = ..., compute_us: _Optional[int] = ..., batched_requests: _Optional[int] = ..., code_path: _Optional[str] = ...) -> None: ...

class ReleaseContextRequest(_message.Message):
    __slots__ = ("context_id",)
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    context_id: str
    def __init__(self, context_id: _Optional[str] = ...) -> None: ...

class ReleaseContextResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: bool = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceInfo(_message.Message):
    __slots__ = ("name", "model", "compute_capability", "memory_total_bytes", "memory_free_bytes", "kernel_families", "native_compute_capability", "routes", "shared_memory_per_block", "out_of_service", "fault", "uuid")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    NATIVE_COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    OUT_OF_SERVICE_FIELD_NUMBER: _ClassVar[int]
    FAULT_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    compute_capability: str
    memory_total_bytes: int
    memory_free_bytes: int
    kernel_families: _containers.RepeatedScalarFieldContainer[str]
    native_compute_capability: str
    routes: _containers.RepeatedCompositeFieldContainer[KernelRoute]
    shared_memory_per_block: int
    out_of_service: bool
    fault: str
    uuid: str
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., compute_capability: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_free_bytes: _Optional[int] = ..., kernel_families: _Optional[_Iterable[str]] = ..., native_compute_capability: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[KernelRoute, _Mapping]]] = ..., shared_memory_per_block: _Optional[int] = ..., out_of_service: bool = ..., fault: _Optional[str] = ..., uuid: _Optional[str] = ...) -> None: ...

class KernelRoute(_message.Message):
    __slots__ = ("family", "direction", "dtypes", "min_head_dim", "max_head_dim", "head_dim_multiple", "reason", "dropout", "alibi")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    DTYPES_FIELD_NUMBER: _ClassVar[int]
    MIN_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    MAX_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_MULTIPLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_FIELD_NUMBER: _ClassVar[int]
    ALIBI_FIELD_NUMBER: _ClassVar[int]
    family: str
    direction: str
    dtypes: _containers.RepeatedScalarFieldContainer[DType]
    min_head_dim: int
    max_head_dim: int
    head_dim_multiple: int
    reason: str
    dropout: bool
    alibi: bool
    def __init__(self, family: _Optional[str] = ..., direction: _Optional[str] = ..., dtypes: _Optional[_Iterable[_Union[DType, str]]] = ..., min_head_dim: _Optional[int] = ..., max_head_dim: _Optional[int] = ..., head_dim_multiple: _Optional[int] = ..., reason: _Optional[str] = ..., dropout: bool = ..., alibi: bool = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_message_bytes", "max_total_tokens", "max_head_dim", "max_num_heads", "max_batch", "max_concurrent_requests", "max_deadline_seconds", "context_memory_bytes", "context_ttl_seconds", "max_request_compute_seconds")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_total_tokens: int
    max_head_dim: int
    max_num_heads: int
    max_batch: int
    max_concurrent_requests: int
    max_deadline_seconds: int
    context_memory_bytes: int
    context_ttl_seconds: int
    max_request_compute_seconds: float
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., max_head_dim: _Optional[int] = ..., max_num_heads: _Optional[int] = ..., max_batch: _Optional[int] = ..., max_concurrent_requests: _Optional[int] = ..., max_deadline_seconds: _Optional[int] = ..., context_memory_bytes: _Optional[int] = ..., context_ttl_seconds: _Optional[int] = ..., max_request_compute_seconds: _Optional[float] = ...) -> None: ...

class DataChannelInfo(_message.Message):
    __slots__ = ("port", "address", "protocol_version", "max_chunk_bytes", "max_connections_per_session", "tls")
    PORT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONNECTIONS_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    port: int
    address: str
    protocol_version: int
    max_chunk_bytes: int
    max_connections_per_session: int
    tls: bool
    def __init__(self, port: _Optional[int] = ..., address: _Optional[str] = ..., protocol_version: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ..., max_connections_per_session: _Optional[int] = ..., tls: bool = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "devices", "kernel_families", "limits", "dtypes", "data_channel", "address")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DTYPES_FIELD_NUMBER: _ClassVar[int]
    DATA_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    version: str
    devices: _containers.RepeatedCompositeFieldContainer[DeviceInfo]
    kernel_families: _containers.RepeatedScalarFieldContainer[str]
    limits: ServerLimits
    dtypes: _containers.RepeatedScalarFieldContainer[DType]
    data_channel: DataChannelInfo
    address: str
    def __init__(self, version: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[DeviceInfo, _Mapping]]] = ..., kernel_families: _Optional[_Iterable[str]] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., dtypes: _Optional[_Iterable[_Union[DType, str]]] = ..., data_channel: _Optional[_Union[DataChannelInfo, _Mapping]] = ..., address: _Optional[str] = ...) -> None: ...
