from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InvalidateRequest(_message.Message):
    __slots__ = ("database", "table", "partitions")
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    database: str
    table: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionValues]
    def __init__(self, database: _Optional[str] = ..., table: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionValues, _Mapping]]] = ...) -> None: ...

class PartitionValues(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class InvalidateReply(_message.Message):
    __slots__ = ("scopes",)
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    scopes: int
    def __init__(self, scopes: _Optional[int] = ...) -> None: ...

class FlushAllRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushAllReply(_message.Message):
    __slots__ = ("keys_removed",)
    KEYS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    keys_removed: int
    def __init__(self, keys_removed: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MethodStats(_message.Message):
    __slots__ = ("method", "hits", "negative_hits", "misses", "bypasses", "hit_ratio")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    BYPASSES_FIELD_NUMBER: _ClassVar[int]
    HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    method: str
    hits: int
    negative_hits: int
    misses: int
    bypasses: int
    hit_ratio: float
    def __init__(self, method: _Optional[str] = ..., hits: _Optional[int] = ..., negative_hits: _Optional[int] = ..., misses: _Optional[int] = ..., bypasses: _Optional[int] = ..., hit_ratio: _Optional[float] = ...) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("methods", "hit_ratio", "entries", "bytes", "store", "store_available", "notification_leader", "last_event_id", "partitions_hit", "partitions_missed")
    METHODS_FIELD_NUMBER: _ClassVar[int]
    HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    STORE_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_LEADER_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_HIT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_MISSED_FIELD_NUMBER: _ClassVar[int]
    methods: _containers.RepeatedCompositeFieldContainer[MethodStats]
    hit_ratio: float
    entries: int
    bytes: int
    store: str
    store_available: bool
    notification_leader: bool
    last_event_id: int
    partitions_hit: int
    partitions_missed: int
    def __init__(self, methods: _Optional[_Iterable[_Union[MethodStats, _Mapping]]] = ..., hit_ratio: _Optional[float] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ..., store: _Optional[str] = ..., store_available: _Optional[bool] = ..., notification_leader: _Optional[bool] = ..., last_event_id: _Optional[int] = ..., partitions_hit: _Optional[int] = ..., partitions_missed: _Optional[int] = ...) -> None: ...

class WarmRequest(_message.Message):
    __slots__ = ("database", "table", "partition_filter", "batch_size")
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FILTER_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    database: str
    table: str
    partition_filter: str
    batch_size: int
    def __init__(self, database: _Optional[str] = ..., table: _Optional[str] = ..., partition_filter: _Optional[str] = ..., batch_size: _Optional[int] = ...) -> None: ...

class WarmProgress(_message.Message):
    __slots__ = ("partitions_total", "partitions_done", "stage")
    PARTITIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_DONE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    partitions_total: int
    partitions_done: int
    stage: str
    def __init__(self, partitions_total: _Optional[int] = ..., partitions_done: _Optional[int] = ..., stage: _Optional[str] = ...) -> None: ...
