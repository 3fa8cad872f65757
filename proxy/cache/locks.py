"""HMS locks as the cache sees them: what a ``lock`` fences, and how fences are written (pure).

Iceberg's commit on the HMS (Java Iceberg, Trino, pyiceberg) is ``lock(table)`` ->
``get_table`` -> compare ``metadata_location`` with the base it built on -> ``alter_table``
-> ``unlock``. The comparison is the whole concurrency control, so the ``get_table`` made
inside the lock must be the HMS's own answer: a cached one, older than a commit another
writer made around the proxy, lets a commit on a stale base through and silently drops the
other writer's acknowledged commit. So a ``lock`` **fences** what its components name,
before it is forwarded: every proxy sharing the store stops serving and filling reads that
depend on it until the fence ends, and it is invalidated at once (so the retry that follows
a refused commit reads the HMS too).

What a component fences:

* a **table** (``TABLE`` level, or ``PARTITION`` level, which names its table): the table's
  object, i.e. every read depending on its ``table`` version: ``get_table*``,
  ``get_table_objects_by_name*``, fields, schema, constraints, table statistics. Its
  partitions stay cached: no lock-based writer compares cached partition objects (Hive ACID,
  which takes partition locks, relies on write ids), and Hive ACID readers take a
  ``SHARED_READ`` lock on every partition they read, which would otherwise switch partition
  caching off for every ACID query;
* a **database** (``DB`` level): the database object and its table lists (its ``db``
  version); the tables in it keep their own entries (a writer of a table locks the table).

Fences live as fields of a version hash's fence hash (``<versions key>:f``), next to the
write fences (``proxy.cache.engine``), each field a deadline in Unix seconds:

* ``L:<fence id>:<version field>``: the fence itself;
* ``G:<fence id>``: its lock was granted (the ``lock`` or a ``check_lock`` said ACQUIRED).

A proxy of an older version reads every field there as a write fence of the whole hash,
which fences more, never less. An alter or drop of the table through the proxy ends the
fences of granted locks only: a lock still waiting belongs to a writer that has not read
yet, and another writer may commit around the proxy before it is granted.

A fence ends at ``unlock`` of its lock id, at the end of its lock's transaction
(``commit_txn``/``abort_txn``), when the metastore refuses the lock, at an alter or drop of
the table once granted, or at its deadline (``--lock-fence-seconds``, 300 s by default as
Hive's ``hive.txn.timeout``, extended by ``check_lock`` and ``heartbeat`` of the lock).
``unlock`` may come through another proxy than ``lock`` (Java Iceberg and Trino send lock,
read, alter and unlock on different pooled connections), so the lock id's fences are
recorded in the store (:class:`LockRecord`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy import idl
from proxy.cache.keys import Bump, DatabaseRef, Naming, TableRef
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError

# Calls whose replies open, keep or end a lock's fence. All pass through untouched.
LOCK_METHODS = frozenset(
    {"lock", "check_lock", "unlock", "heartbeat", "commit_txn", "abort_txn", "abort_txns"}
)

# LockState values (hive_metastore.thrift).
ACQUIRED, WAITING, ABORT, NOT_ACQUIRED = 1, 2, 3, 4
# LockLevel.DB: a component that names a database only.
LEVEL_DB = 1

# Pseudo-field of a look-up's versions: the version fields lock fences cover, comma-joined.
LOCKED = "\x00locked"

LOCK_PREFIX = "L:"
GRANTED_PREFIX = "G:"


@dataclass(frozen=True, slots=True)
class Fence:
    """Reads depending on ``field`` of the version hash ``key`` are neither served nor filled."""

    key: str
    field: str


@dataclass(frozen=True, slots=True)
class LockPlan:
    """What one ``lock`` request fences and invalidates before it is forwarded."""

    fences: tuple[Fence, ...]
    bumps: tuple[Bump, ...]
    txnid: int | None
    tables: tuple[TableRef, ...]


def plan(request: Any, naming: Naming) -> LockPlan | None:
    """The fences of a decoded ``lock_args``; ``None`` if its components name nothing."""
    rqst = getattr(request, "rqst", None)
    components = getattr(rqst, "component", None)
    if not isinstance(components, list):
        return None
    fences: dict[Fence, None] = {}
    bumps: dict[Bump, None] = {}
    tables: dict[TableRef, None] = {}
    for component in components:
        db = getattr(component, "dbname", None)
        table = getattr(component, "tablename", None)
        if not isinstance(db, str) or not db:
            continue
        if isinstance(table, str) and table and getattr(component, "level", None) != LEVEL_DB:
            ref = TableRef.of(db, table)
            key = naming.versions(ref.tag)
            fences[Fence(key, "table")] = None
            bumps[Bump(key, "table", "table")] = None
            tables[ref] = None
        else:
            key = naming.versions(DatabaseRef.of(db).tag)
            fences[Fence(key, "db")] = None
            bumps[Bump(key, "db", "database")] = None
    if not fences:
        return None
    txnid = getattr(rqst, "txnid", None)
    return LockPlan(
        tuple(fences),
        tuple(bumps),
        txnid if isinstance(txnid, int) and txnid > 0 else None,
        tuple(tables),
    )


def lock_field(fence_id: str, fence: Fence) -> str:
    return f"{LOCK_PREFIX}{fence_id}:{fence.field}"


def granted_field(fence_id: str) -> str:
    return f"{GRANTED_PREFIX}{fence_id}"


def fence_items(fence_id: str, fences: Iterable[Fence]) -> list[tuple[str, str]]:
    """(version key, fence field) of each fence."""
    return [(f.key, lock_field(fence_id, f)) for f in fences]


def granted_items(fence_id: str, fences: Iterable[Fence]) -> list[tuple[str, str]]:
    return [(key, granted_field(fence_id)) for key in dict.fromkeys(f.key for f in fences)]


@dataclass(frozen=True, slots=True)
class FenceState:
    """What the fence fields of one version hash say now."""

    write: bool  # a write is under way: nothing of the hash is served or filled
    locked: frozenset[str]  # version fields lock fences cover


def read_fences(fields: Mapping[str, float], now: float) -> FenceState:
    """Classify the fields of a fence hash (name -> deadline) at time ``now``."""
    write = False
    locked: set[str] = set()
    for name, deadline in fields.items():
        if deadline <= now or name.startswith(GRANTED_PREFIX):
            continue
        if name.startswith(LOCK_PREFIX):
            locked.add(name.rsplit(":", 1)[1])
        else:
            write = True  # a write fence (its intent id), or a name of a newer version
    return FenceState(write, frozenset(locked))


def granted_fence_fields(fields: Iterable[str]) -> list[str]:
    """The fields of granted locks' fences (and their grant marks) among ``fields``."""
    names = list(fields)
    granted = {n[len(GRANTED_PREFIX) :] for n in names if n.startswith(GRANTED_PREFIX)}
    out = []
    for name in names:
        prefix, _, rest = name.partition(":")
        if prefix + ":" in (LOCK_PREFIX, GRANTED_PREFIX) and rest.split(":", 1)[0] in granted:
            out.append(name)
    return out


@dataclass(frozen=True, slots=True)
class LockRecord:
    """What a lock id fenced, kept in the store so that any proxy can end it."""

    fence_id: str
    fences: tuple[Fence, ...]
    txnid: int | None = None

    def size(self) -> int:
        """Bytes this record keeps alive, roughly."""
        return 200 + sum(len(f.key) + len(f.field) + 120 for f in self.fences)

    def encode(self) -> bytes:
        return json.dumps(
            {"f": self.fence_id, "k": [[f.key, f.field] for f in self.fences], "t": self.txnid}
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> LockRecord | None:
        try:
            raw = json.loads(data)
            fences = tuple(Fence(str(k), str(f)) for k, f in raw["k"])
            txnid = raw.get("t")
            return cls(str(raw["f"]), fences, int(txnid) if txnid is not None else None)
        except (ValueError, KeyError, TypeError):
            return None


def lock_key(naming: Naming, lockid: int) -> str:
    return naming.coordination(f"lock:{lockid}")


def txn_key(naming: Naming, txnid: int) -> str:
    return naming.coordination(f"txn:{txnid}")


@dataclass(frozen=True, slots=True)
class LockAnswer:
    """A ``lock`` or ``check_lock`` reply, as far as fences need it."""

    lockid: int | None
    state: int | None  # None: a declared exception or an error, not a LockResponse


def read_lock_reply(method: str, message_type: int, body: bytes) -> LockAnswer:
    """The lock id and state of a ``lock``/``check_lock`` reply (decoded: a few bytes)."""
    if message_type != MessageType.REPLY:
        return LockAnswer(None, None)
    try:
        result = idl.decode_result(method, body)
    except ProtocolError:
        return LockAnswer(None, None)
    success = getattr(result, "success", None)
    lockid = getattr(success, "lockid", None)
    state = getattr(success, "state", None)
    if not isinstance(lockid, int) or not isinstance(state, int):
        return LockAnswer(None, None)
    return LockAnswer(lockid, state)


def lock_ids_of(method: str, request: Any) -> tuple[list[int], list[int]]:
    """(lock ids, transaction ids) a ``check_lock``/``unlock``/``heartbeat``/``commit_txn``/
    ``abort_txn``/``abort_txns`` request names."""
    rqst = getattr(request, "rqst", None) or getattr(request, "ids", None)
    locks: list[int] = []
    txns: list[int] = []
    lockid = getattr(rqst, "lockid", None)
    if isinstance(lockid, int) and lockid > 0:
        locks.append(lockid)
    if method in ("commit_txn", "abort_txn", "heartbeat"):
        txnid = getattr(rqst, "txnid", None)
        if isinstance(txnid, int) and txnid > 0:
            txns.append(txnid)
    if method == "abort_txns":
        txns.extend(t for t in getattr(rqst, "txn_ids", None) or () if isinstance(t, int))
    return locks, txns
