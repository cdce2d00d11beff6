from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitJobRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: bytes
    def __init__(self, request: _Optional[bytes] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job", "after")
    JOB_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    job: str
    after: int
    def __init__(self, job: _Optional[str] = ..., after: _Optional[int] = ...) -> None: ...

class FetchTensorRequest(_message.Message):
    __slots__ = ("job", "name")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    job: str
    name: str
    def __init__(self, job: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Error(_message.Message):
    __slots__ = ("kind", "message", "node", "op")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    node: str
    op: str
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., node: _Optional[str] = ..., op: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "state", "done", "total", "error", "created", "updated", "plan", "json")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    done: int
    total: int
    error: Error
    created: float
    updated: float
    plan: str
    json: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., created: _Optional[float] = ..., updated: _Optional[float] = ..., plan: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("id", "at", "kind", "job", "task", "node", "data")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    id: int
    at: float
    kind: str
    job: str
    task: str
    node: str
    data: str
    def __init__(self, id: _Optional[int] = ..., at: _Optional[float] = ..., kind: _Optional[str] = ..., job: _Optional[str] = ..., task: _Optional[str] = ..., node: _Optional[str] = ..., data: _Optional[str] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("shape", "dtype", "nbytes")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    nbytes: int
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., nbytes: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: TensorHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[TensorHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("id", "shape", "dtype", "nbytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    nbytes: int
    def __init__(self, id: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., nbytes: _Optional[int] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "address", "pid", "health", "running", "memory_capacity", "memory_free", "json")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    pid: int
    health: str
    running: int
    memory_capacity: int
    memory_free: int
    json: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., pid: _Optional[int] = ..., health: _Optional[str] = ..., running: _Optional[int] = ..., memory_capacity: _Optional[int] = ..., memory_free: _Optional[int] = ..., json: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...
