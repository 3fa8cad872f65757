"""The partitions a call names, read from its decoded arguments (pure).

Both halves of planning read them: a read depends on the versions of the partitions it names
(:mod:`.planner`), a write bumps them (:mod:`.invalidation`). Either way a partition the
proxy cannot pin down makes the answer ``None``: a read is then not cached, a write
invalidates all of the table's partitions. Which ones it cannot pin down differs: a write
only needs to know which partition the database may match (a name ending with a blank may
match another's, see :mod:`.keys`); a read's entry is kept under the name's partition, so
the name must be one the database matches exactly, and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from proxy import catalog
from proxy.cache.keys import (
    PartitionNameError,
    certain_partition_name,
    certain_partition_values,
    loose_partition_name,
    loose_partition_values,
    parse_partition_name,
)


def _all_text(values: list[Any]) -> bool:
    """Whether every value is text (thriftpy2 hands out bytes that are not UTF-8, which the
    metastore would read with replacement characters: no key of ours can name them)."""
    return all(isinstance(v, str) for v in values)


def partition_values(
    refs: Iterable[str], args: Any, *, read: bool = False
) -> list[tuple[str, ...]] | None:
    """Every partition the references name, as value tuples; ``None`` if one is unclear:
    for a write (``read`` false), one the database may match loosely; for a read, one it
    does not match exactly (see the module's docstring)."""
    judge_values = certain_partition_values if read else _not_loose_values
    judge_name = certain_partition_name if read else _not_loose_name
    out: list[tuple[str, ...]] = []
    for ref in refs:
        kind, path = ref.split(":", 1)
        found = catalog.resolve(path, args)
        if kind == "values":
            # An empty list names no partition (fire_listener_event on an unpartitioned
            # table): the caller then treats the table's partitions as a whole.
            for v in found:
                if isinstance(v, list) and v:
                    if not _all_text(v) or not judge_values(v):
                        return None
                    out.append(tuple(v))
        elif kind == "objects":
            for obj in found:
                values = getattr(obj, "values", None)
                if not isinstance(values, list) or not _all_text(values):
                    return None
                if not judge_values(values):
                    return None
                out.append(tuple(values))
        else:  # name / names
            names = [n for item in found for n in (item if isinstance(item, list) else [item])]
            for name in names:
                if not isinstance(name, str) or not judge_name(name):
                    return None
                try:
                    out.append(parse_partition_name(name)[1])
                except PartitionNameError:
                    return None
    return out


def _not_loose_values(values: list[str]) -> bool:
    return not loose_partition_values(values)


def _not_loose_name(name: str) -> bool:
    return not loose_partition_name(name)
