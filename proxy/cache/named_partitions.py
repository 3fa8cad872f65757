"""The partitions a call names, read from its decoded arguments (pure).

Both halves of planning read them: a read depends on the versions of the partitions it names
(:mod:`.planner`), a write bumps them (:mod:`.invalidation`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from proxy import catalog
from proxy.cache.keys import PartitionNameError, parse_partition_name


def _all_text(values: list[Any]) -> bool:
    """Whether every value is text (thriftpy2 hands out bytes that are not UTF-8, which the
    metastore would read with replacement characters: no key of ours can name them)."""
    return all(isinstance(v, str) for v in values)


def partition_values(refs: Iterable[str], args: Any) -> list[tuple[str, ...]] | None:
    """Every partition the references name, as value tuples; ``None`` if one is unclear."""
    out: list[tuple[str, ...]] = []
    for ref in refs:
        kind, path = ref.split(":", 1)
        found = catalog.resolve(path, args)
        if kind == "values":
            # An empty list names no partition (fire_listener_event on an unpartitioned
            # table): the caller then treats the table's partitions as a whole.
            for v in found:
                if isinstance(v, list) and v:
                    if not _all_text(v):
                        return None
                    out.append(tuple(v))
        elif kind == "objects":
            for obj in found:
                values = getattr(obj, "values", None)
                if not isinstance(values, list) or not _all_text(values):
                    return None
                out.append(tuple(values))
        else:  # name / names
            names = [n for item in found for n in (item if isinstance(item, list) else [item])]
            for name in names:
                if not isinstance(name, str):
                    return None
                try:
                    out.append(parse_partition_name(name)[1])
                except PartitionNameError:
                    return None
    return out
