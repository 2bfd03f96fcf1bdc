from . import attention_pb2 as _attention_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FrameType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FRAME_UNSPECIFIED: _ClassVar[FrameType]
    FRAME_HELLO: _ClassVar[FrameType]
    FRAME_HELLO_OK: _ClassVar[FrameType]
    FRAME_REQUEST: _ClassVar[FrameType]
    FRAME_ACCEPTED: _ClassVar[FrameType]
    FRAME_CHUNK: _ClassVar[FrameType]
    FRAME_RESPONSE: _ClassVar[FrameType]
    FRAME_ERROR: _ClassVar[FrameType]
    FRAME_CANCEL: _ClassVar[FrameType]
FRAME_UNSPECIFIED: FrameType
FRAME_HELLO: FrameType
FRAME_HELLO_OK: FrameType
FRAME_REQUEST: FrameType
FRAME_ACCEPTED: FrameType
FRAME_CHUNK: FrameType
FRAME_RESPONSE: FrameType
FRAME_ERROR: FrameType
FRAME_CANCEL: FrameType

class DataHello(_message.Message):
    __slots__ = ("protocol_version", "session_id", "token")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    session_id: bytes
    token: str
    def __init__(self, protocol_version: _Optional[int] = ..., session_id: _Optional[bytes] = ..., token: _Optional[str] = ...) -> None: ...

class DataHelloOk(_message.Message):
    __slots__ = ("max_chunk_bytes", "max_connections_per_session", "max_requests_per_session", "max_inline_bytes")
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CONNECTIONS_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUESTS_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    MAX_INLINE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_chunk_bytes: int
    max_connections_per_session: int
    max_requests_per_session: int
    max_inline_bytes: int
    def __init__(self, max_chunk_bytes: _Optional[int] = ..., max_connections_per_session: _Optional[int] = ..., max_requests_per_session: _Optional[int] = ..., max_inline_bytes: _Optional[int] = ...) -> None: ...

class DataRequest(_message.Message):
    __slots__ = ("forward", "backward", "payload_bytes", "chunk_bytes", "timeout_ms", "priority", "inline_payload")
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    INLINE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    forward: _attention_pb2.ForwardRequest
    backward: _attention_pb2.BackwardRequest
    payload_bytes: int
    chunk_bytes: int
    timeout_ms: int
    priority: str
    inline_payload: bool
    def __init__(self, forward: _Optional[_Union[_attention_pb2.ForwardRequest, _Mapping]] = ..., backward: _Optional[_Union[_attention_pb2.BackwardRequest, _Mapping]] = ..., payload_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., priority: _Optional[str] = ..., inline_payload: bool = ...) -> None: ...

class DataAccepted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DataResponse(_message.Message):
    __slots__ = ("code", "message", "forward", "backward", "payload_bytes")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    forward: _attention_pb2.ForwardResponse
    backward: _attention_pb2.BackwardResponse
    payload_bytes: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., forward: _Optional[_Union[_attention_pb2.ForwardResponse, _Mapping]] = ..., backward: _Optional[_Union[_attention_pb2.BackwardResponse, _Mapping]] = ..., payload_bytes: _Optional[int] = ...) -> None: ...

class DataError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
