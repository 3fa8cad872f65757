"""The hit decision, as pure functions of a plan, the versions read and what was found.

No I/O here, the way h11 keeps its state machine apart from its connection: the read path
(:mod:`.reads`, :mod:`.partition_reads`) reads versions and entries from the store and the
in-process front, and asks these functions what they mean.

* An entry is served when the fingerprint of the current versions of every scope its plan
  reads equals the one it was filled under, and it has time left to live.
* Nothing is served or filled while a write or a lock fences a scope the plan reads
  (:func:`fenced`): the metastore answers, whatever the cache holds.
* A scope with no epoch yet has never had anything filled under it: a miss, and the fill
  makes the epoch first.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from proxy import iceberg, idl
from proxy.cache import entry as codec
from proxy.cache import locks
from proxy.cache import partitions as parts
from proxy.cache.keys import EPOCH, partition_field
from proxy.cache.plan import ReadPlan, VersionRef, group
from proxy.cache.store import FENCED, Versions
from proxy.wire.binary import MessageType
from proxy.wire.framing import Message


class Result(Enum):
    HIT = "hit"
    NEGATIVE_HIT = "negative_hit"
    MISS = "miss"
    BYPASS = "bypass"  # neither served nor filled: the metastore answers


@dataclass(slots=True)
class Verdict:
    result: Result
    reply: codec.Payload = b""  # the cached reply message, on a hit
    values: list[bytes | None] = field(default_factory=list)  # versions read, plan order
    # Bypassed because a write or a lock fences what the plan reads (values: as read then).
    fenced: bool = False

    @property
    def hit(self) -> bool:
        return self.result in (Result.HIT, Result.NEGATIVE_HIT)


BYPASS = Verdict(Result.BYPASS)


def fenced(refs: Sequence[VersionRef], versions: Versions) -> bool:
    """Whether a write fences any hash ``refs`` read, or a lock fences a field they read."""
    if not any(FENCED in fields or locks.LOCKED in fields for fields in versions.values()):
        return False  # the common case, decided without grouping the refs
    return fenced_fields(group(refs), versions)


def fenced_fields(wanted: Mapping[str, Sequence[str]], versions: Versions) -> bool:
    """:func:`fenced`, given the fields read by hash (as :func:`group` makes them)."""
    for key, fields in versions.items():
        if FENCED in fields:
            return True
        locked = fields.get(locks.LOCKED)
        if locked:
            covered = set(locked.decode().split(","))
            if not covered.isdisjoint(wanted.get(key, ())):
                return True
    return False


def judge(
    refs: Sequence[VersionRef],
    versions: Versions,
    entry: codec.Entry | None,
    *,
    now: float,
    serve_iceberg: bool,
) -> Verdict:
    """What a whole-reply look-up found: ``entry`` is the candidate (the in-process copy,
    or the store's entry decoded), ``None`` if there is none; ``now`` is Unix time."""
    if fenced(refs, versions):  # a write or a lock is under way: neither serve nor fill
        return Verdict(
            Result.BYPASS, values=[versions[r.key].get(r.field) for r in refs], fenced=True
        )
    values = [versions[r.key][r.field] for r in refs]
    if entry is None or any(versions[r.key].get(EPOCH) is None for r in refs):
        return Verdict(Result.MISS, values=values)
    current = _fingerprint(tuple(values)) if len(values) <= 16 else codec.fingerprint(values)
    if entry.fingerprint != current or entry.expires_at <= now:
        return Verdict(Result.MISS, values=values)
    if entry.iceberg and not serve_iceberg:
        return BYPASS
    return Verdict(Result.NEGATIVE_HIT if entry.negative else Result.HIT, entry.payload)


def judge_stale(
    refs: Sequence[VersionRef],
    versions: Versions,
    entry: codec.Entry | None,
    *,
    now: float,
    window: float,
) -> codec.Payload | None:
    """``--stale-if-error``: the reply of an entry past its TTL (by at most ``window``) whose
    versions are still current. Never one a write invalidated or is fencing: stale in time
    only."""
    if entry is None or fenced(refs, versions):
        return None
    current = codec.fingerprint([versions[r.key][r.field] for r in refs])
    if entry.fingerprint != current or entry.expires_at < now - window:
        return None
    return entry.payload


def partition_fingerprint(
    versions: Mapping[str, bytes | None], version_field: str, *, present: bool
) -> bytes:
    """What one partition's entry is filled under: the table's epoch, its partition set's
    generation (an absent partition: the set of names), and the partition's own version."""
    scope = "pgen" if present else "partset"
    return _fingerprint_of(versions.get(EPOCH), versions.get(scope), versions.get(version_field))


# The versions a hit is judged under repeat from hit to hit (they change only with writes):
# their fingerprint is remembered rather than hashed on every hit (for plans of a few
# versions: the memo's size is then bounded by its entries).
@functools.lru_cache(maxsize=8192)
def _fingerprint(values: tuple[bytes | None, ...]) -> bytes:
    return codec.fingerprint(values)


# A hit of 100 partitions judges 100 entries: their fingerprints repeat from hit to hit (the
# versions change only with writes), so they are remembered rather than hashed each time.
@functools.lru_cache(maxsize=32768)
def _fingerprint_of(epoch: bytes | None, scope: bytes | None, own: bytes | None) -> bytes:
    return codec.fingerprint([epoch, scope, own])


# What one remembered fingerprint keeps alive: the lru_cache's link and key, the three
# version values and the digest (~300 bytes, measured with tracemalloc over 32,768 of them).
FINGERPRINT_ENTRY_BYTES = 300


# A whole reply's remembered fingerprint keeps up to 16 values alive: a bound of ~40 bytes a
# value on top of the above (version values are short tokens), not a measurement.
WHOLE_FINGERPRINT_ENTRY_BYTES = FINGERPRINT_ENTRY_BYTES + 16 * 40


def fingerprints_footprint() -> tuple[int, int]:
    """(entries, bytes) of the remembered fingerprints, partitions' and whole replies'
    (both bounded by count)."""
    partitions = _fingerprint_of.cache_info().currsize
    whole = _fingerprint.cache_info().currsize
    return (
        partitions + whole,
        partitions * FINGERPRINT_ENTRY_BYTES + whole * WHOLE_FINGERPRINT_ENTRY_BYTES,
    )


def judge_partition(
    entry: codec.Entry, versions: Mapping[str, bytes | None], version_field: str, now: float
) -> tuple[bool, codec.Payload | None]:
    """(current?, the partition's struct, or ``None`` for one the metastore does not have)."""
    if entry.expires_at <= now:
        return False, None
    present = not entry.absent
    current = entry.fingerprint == partition_fingerprint(versions, version_field, present=present)
    return current, entry.payload if current and present else None


def exception_name(method: str, body: bytes) -> str | None:
    """The declared exception a result carries (``NoSuchObjectException``), if any."""
    if len(body) < 3 or body[0] == 0 or body[1:3] == b"\x00\x00":
        return None
    fid = int.from_bytes(body[1:3], "big", signed=True)
    spec = idl.result_class(method).thrift_spec.get(fid)
    return spec[2].__name__ if spec and len(spec) == 4 and hasattr(spec[2], "__name__") else "?"


def holds_only_named(plan: ReadPlan, body: bytes) -> bool:
    """Whether every partition a reply holds is one its plan depends on by that partition's
    own version: one the request did not name (the database matched a name loosely, the
    metastore reordered a name's columns) would be kept under versions that a write to it
    does not move. Only replies of partition objects are read; others say yes."""
    if plan.method not in parts.PARTITION_REPLIES:
        return True
    held = parts.reply_partition_values(plan.method, body)
    if held is None:
        return False
    named = {ref.field for ref in plan.refs}
    return all(partition_field(values) in named for values in held)


def storable(
    plan: ReadPlan, reply: Message, *, max_bytes: int, serve_iceberg: bool
) -> tuple[int, float] | None:
    """(flags, ttl) to store ``reply`` with, or ``None`` if it must not be stored."""
    if reply.header.type != MessageType.REPLY or len(reply.data) > max_bytes:
        return None
    failure = exception_name(plan.method, reply.body)
    if failure is None:
        if not holds_only_named(plan, reply.body):
            return None
        if iceberg.reply_has_iceberg_table(plan.method, reply.body):
            return (codec.ICEBERG, plan.ttl) if serve_iceberg else None
        return 0, plan.ttl
    if failure == "NoSuchObjectException" and plan.negative_ttl:
        return codec.NEGATIVE, plan.negative_ttl
    return None
