from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileInfo(_message.Message):
    __slots__ = ("path", "size", "modification_time_ms")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODIFICATION_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    modification_time_ms: int
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., modification_time_ms: _Optional[int] = ...) -> None: ...

class FileListing(_message.Message):
    __slots__ = ("location", "partition_values", "files", "from_cache", "sealed")
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_VALUES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    FROM_CACHE_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    location: str
    partition_values: _containers.RepeatedScalarFieldContainer[str]
    files: _containers.RepeatedCompositeFieldContainer[FileInfo]
    from_cache: bool
    sealed: bool
    def __init__(self, location: _Optional[str] = ..., partition_values: _Optional[_Iterable[str]] = ..., files: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., from_cache: _Optional[bool] = ..., sealed: _Optional[bool] = ...) -> None: ...

class ListPartitionFilesRequest(_message.Message):
    __slots__ = ("database", "table", "partition_values", "recursive")
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_VALUES_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    database: str
    table: str
    partition_values: _containers.RepeatedScalarFieldContainer[str]
    recursive: bool
    def __init__(self, database: _Optional[str] = ..., table: _Optional[str] = ..., partition_values: _Optional[_Iterable[str]] = ..., recursive: _Optional[bool] = ...) -> None: ...

class ListTableFilesRequest(_message.Message):
    __slots__ = ("database", "table", "partition_filter", "recursive")
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FILTER_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    database: str
    table: str
    partition_filter: str
    recursive: bool
    def __init__(self, database: _Optional[str] = ..., table: _Optional[str] = ..., partition_filter: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class TableListing(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[FileListing]
    def __init__(self, partitions: _Optional[_Iterable[_Union[FileListing, _Mapping]]] = ...) -> None: ...

class PlanSplitsRequest(_message.Message):
    __slots__ = ("database", "table", "partition_filter", "engine", "max_initial_splits", "max_initial_split_size", "max_split_size", "max_partition_bytes", "open_cost_in_bytes", "spark_parallelism", "small_file_threshold", "target_file_size")
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FILTER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MAX_INITIAL_SPLITS_FIELD_NUMBER: _ClassVar[int]
    MAX_INITIAL_SPLIT_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SPLIT_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_PARTITION_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPEN_COST_IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPARK_PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    SMALL_FILE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    database: str
    table: str
    partition_filter: str
    engine: str
    max_initial_splits: int
    max_initial_split_size: int
    max_split_size: int
    max_partition_bytes: int
    open_cost_in_bytes: int
    spark_parallelism: int
    small_file_threshold: int
    target_file_size: int
    def __init__(self, database: _Optional[str] = ..., table: _Optional[str] = ..., partition_filter: _Optional[str] = ..., engine: _Optional[str] = ..., max_initial_splits: _Optional[int] = ..., max_initial_split_size: _Optional[int] = ..., max_split_size: _Optional[int] = ..., max_partition_bytes: _Optional[int] = ..., open_cost_in_bytes: _Optional[int] = ..., spark_parallelism: _Optional[int] = ..., small_file_threshold: _Optional[int] = ..., target_file_size: _Optional[int] = ...) -> None: ...

class SizeBucket(_message.Message):
    __slots__ = ("label", "files", "bytes")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    label: str
    files: int
    bytes: int
    def __init__(self, label: _Optional[str] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class SplitPlan(_message.Message):
    __slots__ = ("engine", "splits", "partitions", "files", "bytes", "histogram", "small_files", "small_file_threshold", "compacted_files", "compacted_splits")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    SMALL_FILES_FIELD_NUMBER: _ClassVar[int]
    SMALL_FILE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FILES_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_SPLITS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    splits: int
    partitions: int
    files: int
    bytes: int
    histogram: _containers.RepeatedCompositeFieldContainer[SizeBucket]
    small_files: int
    small_file_threshold: int
    compacted_files: int
    compacted_splits: int
    def __init__(self, engine: _Optional[str] = ..., splits: _Optional[int] = ..., partitions: _Optional[int] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ..., histogram: _Optional[_Iterable[_Union[SizeBucket, _Mapping]]] = ..., small_files: _Optional[int] = ..., small_file_threshold: _Optional[int] = ..., compacted_files: _Optional[int] = ..., compacted_splits: _Optional[int] = ...) -> None: ...
