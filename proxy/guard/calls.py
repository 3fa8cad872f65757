"""What a call that returns partition objects asks for, read from its arguments.

Only the calls that return partition *objects* are costed: a partition is ~1-5 KB on the
wire and a row (or several) in each of five tables of the metastore's database, and the
HMS's own ``hive.metastore.limit.partition.request`` guards these calls. Partition names
are ~50 bytes each and come from one query: not costed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from proxy import catalog, idl
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message


class Shape(Enum):
    WHOLE = "whole"  # every partition of the table, up to the cap
    NAMES = "names"  # the partitions named: exactly that many
    FILTER = "filter"  # those a filter string selects: the HMS can count them first
    SOME = "some"  # selected some other way (an expression, values): at most the table's


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """One call for partition objects. ``cap``: the most it asks for (``max_parts``; -1:
    no cap); ``names``: how many it names (``NAMES``); ``filter``: the filter (``FILTER``)."""

    method: str
    db: str
    table: str
    shape: Shape
    cap: int = -1
    names: int = 0
    filter: str = ""

    @property
    def where(self) -> str:
        return f"{self.db}.{self.table}"


# method -> (where its arguments are, under which attribute; its shape; the cap's and the
# filter's or names' attribute there)
_READS: dict[str, tuple[str | None, Shape, str | None, str | None]] = {
    "get_partitions": (None, Shape.WHOLE, "max_parts", None),
    "get_partitions_with_auth": (None, Shape.WHOLE, "max_parts", None),
    "get_partitions_pspec": (None, Shape.WHOLE, "max_parts", None),
    "get_partitions_req": ("req", Shape.WHOLE, "maxParts", None),
    "get_partitions_by_filter": (None, Shape.FILTER, "max_parts", "filter"),
    "get_part_specs_by_filter": (None, Shape.FILTER, "max_parts", "filter"),
    "get_partitions_by_filter_req": ("req", Shape.FILTER, "maxParts", "filter"),
    "get_partitions_by_names": (None, Shape.NAMES, None, "names"),
    "get_partitions_by_names_req": ("req", Shape.NAMES, None, "names"),
    "get_partitions_by_expr": ("req", Shape.SOME, "maxParts", None),
    "get_partitions_spec_by_expr": ("req", Shape.SOME, "maxParts", None),
    "get_partitions_ps": (None, Shape.SOME, "max_parts", None),
    "get_partitions_ps_with_auth": (None, Shape.SOME, "max_parts", None),
    "get_partitions_ps_with_auth_req": ("req", Shape.SOME, "maxParts", None),
    "get_partitions_with_specs": ("request", Shape.SOME, None, None),
}
PARTITION_READS = frozenset(_READS)


def partition_read(message: Message) -> PartitionRead | None:
    """What ``message`` asks for, if it is a call for partition objects whose table its
    arguments name; ``None`` otherwise (or if they do not decode: the metastore answers
    those)."""
    name = message.header.name
    how = _READS.get(name)
    if how is None:
        return None
    try:
        args = idl.decode_args(name, message.body)
    except (ProtocolError, KeyError):
        return None
    under, shape, cap_attr, what_attr = how
    spec = catalog.lookup(name)
    assert spec is not None and spec.targets  # (every one names its table)
    target = spec.targets[0]
    db = _first(catalog.resolve(target.db, args)) if target.db else None
    table = _first(catalog.resolve(target.table, args)) if target.table else None
    if not isinstance(db, str) or not isinstance(table, str):
        return None
    holder: Any = getattr(args, under) if under is not None else args
    cap = getattr(holder, cap_attr, None) if cap_attr is not None else None
    cap = cap if isinstance(cap, int) and cap >= 0 else -1
    if shape is Shape.NAMES:
        names = getattr(holder, what_attr or "", None) or []
        return PartitionRead(name, db, table, shape, cap, names=len(names))
    if shape is Shape.FILTER:
        text = getattr(holder, what_attr or "", None)
        if not isinstance(text, str):
            return PartitionRead(name, db, table, Shape.SOME, cap)
        return PartitionRead(name, db, table, shape, cap, filter=text)
    return PartitionRead(name, db, table, shape, cap)


def table_named(message: Message) -> str | None:
    """``db.table`` that a call names, for an error message (``None``: it names none, or
    its arguments do not decode)."""
    spec = catalog.lookup(message.header.name)
    if spec is None or not spec.targets:
        return None
    target = spec.targets[0]
    try:
        args = idl.decode_args(message.header.name, message.body)
    except (ProtocolError, KeyError):
        return None
    db = _first(catalog.resolve(target.db, args)) if target.db else None
    table = _first(catalog.resolve(target.table, args)) if target.table else None
    if isinstance(db, str) and isinstance(table, str):
        return f"{db}.{table}"
    return db if isinstance(db, str) else None


def _first(values: list[Any]) -> Any:
    return values[0] if values else None
