"""Names in the cache: scopes, their version fields, entry keys, partition names (pure).

**Versions.** Every cached entry records the versions of the scopes it depends on, read
before its upstream call started; it is served only while those versions are unchanged.
Versions are fields of a few hashes:

* the catalog hash ``{g}``: ``catalog`` (database lists), ``tables`` (reads spanning
  databases), ``functions``, ``privileges``;
* one hash per database ``{d:..}``: ``db`` (the database object and its table lists);
* one hash per table ``{t:..}``: ``table``, ``partset`` (which partitions exist), ``parts``
  (partition contents as a whole), ``pgen`` (all partitions at once), ``stats`` (table
  statistics), and ``p:<partition>`` per partition.

Each hash also holds ``epoch``, a random token created with the hash. Dropping, creating or
renaming a table replaces its epoch, which kills every entry of that table at once; and if
Redis ever evicts a hash, the new one gets a new epoch, so entries filled under the old one
can never match again (a counter restarting at 0 could).

**Slots.** The hash tag in braces makes every key of one table, of one database, or of the
catalog land in one Redis Cluster slot, so the common hit (one table) is one round trip.

**Catalogs.** A client names a table's catalog inside the database string (``@spark#db``,
Hive 3 and later), in a separate field of a ``_req`` struct (``catName``, which a write may
leave out where a read sends it, or the other way round), or not at all (the metastore's
default catalog, ``metastore.catalog.default``, which need not be ``hive``). So the version
tags leave the catalog out: a database or table name has one set of versions whatever the
catalog, and a write spelled any way invalidates a read spelled any other. The price is
over-invalidation between catalogs holding the same names; the tags of the catalog ``hive``
are those the proxy has always used. Entries themselves stay apart: their keys hold the
request's bytes, catalog and all (listings: :attr:`TableRef.catalog` in their key).

**Spellings.** The metastore trims and lower-cases database and table names, and its
database compares partition names loosely (trailing blanks). Versions are named as the
metastore resolves names (:func:`hms_identifier`), and a read naming anything whose
resolution the proxy cannot be certain of (:func:`certain_identifier`,
:func:`certain_partition_name`) is never cached: the metastore answers it every time.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

EPOCH = "epoch"
DEFAULT_CATALOG = "hive"


def _digest(*parts: str | bytes, size: int = 8) -> str:
    h = hashlib.blake2b(digest_size=size)
    for part in parts:
        h.update(part.encode("utf-8") if isinstance(part, str) else part)
        h.update(b"\x00")
    return h.hexdigest()


# What Java's String.trim() takes from both ends: every character up to U+0020.
_TRIMMED = "".join(map(chr, range(0x21)))


def java_trim(name: str) -> str:
    """``name`` as Java's String.trim() leaves it."""
    return name.strip(_TRIMMED)


def hms_identifier(name: str) -> str:
    """A catalog, database or table name as the metastore looks it up: trimmed and in lower
    case (HiveStringUtils.normalizeIdentifier: ``trim().toLowerCase()``), so that ``'T '``
    names the table ``t``. Python's lower case is Java's only for names whose trimmed form
    is :func:`certain_identifier`: callers do not rely on it for others."""
    return java_trim(name).lower()


def certain_identifier(name: str) -> bool:
    """Whether the proxy knows for certain what the metastore makes of ``name``: printable
    ASCII without blanks (``!`` to ``~``). Then trim() takes nothing and Python's lower
    case is Java's; beyond ASCII the two need not agree (Java's follows its own Unicode
    version and the JVM's locale; U+212A KELVIN SIGN lowers to an ASCII ``k``). A read
    naming anything else is never cached; a write naming anything else once trimmed
    invalidates more (see :mod:`.invalidation`)."""
    return name.isascii() and name.isprintable() and " " not in name


def _split(db: str) -> tuple[str, str]:
    """(catalog, database) as a database string spells them (the catalog ``""`` if none)."""
    if db.startswith("@") and "#" in db:
        catalog, _, name = db[1:].partition("#")
        return catalog, "" if name == "!" else name
    return "", db


def split_catalog(db: str) -> tuple[str, str]:
    """Hive 3 clients (and Presto with a catalog) send ``@cat#db``; others the bare name.

    Both names as the metastore looks them up (:func:`hms_identifier`): it stores them
    trimmed and in lower case.
    """
    catalog, name = _split(db)
    return hms_identifier(catalog) or DEFAULT_CATALOG, hms_identifier(name)


def database_part(db: str) -> str:
    """A database string's database name as sent (``@cat#db``: ``db``). The catalog's
    spelling does not matter to what the cache holds: versions leave it out (see the
    module's docstring), and entries' keys hold the request's bytes."""
    return _split(db)[1]


@dataclass(frozen=True, slots=True)
class Bump:
    """A change to one version field, as a write's invalidation: the stores apply it, the
    planner makes it (here, below both, so the store interface needs no planner types)."""

    key: str  # the version hash
    field: str  # EPOCH: replace the token; otherwise increment
    scope: str  # metrics label


@dataclass(frozen=True, slots=True)
class TableRef:
    catalog: str  # as the database string says, for names shown and listings' keys
    db: str
    table: str

    @classmethod
    def of(cls, db: str, table: str) -> TableRef:
        catalog, name = split_catalog(db)
        return cls(catalog, name, hms_identifier(table))

    @property
    def tag(self) -> str:
        """The table's versions: the same in every catalog (see the module's docstring)."""
        if len(self.db) + len(self.table) <= MEMO_LONGEST:
            return _remembered_table_tag(self.db, self.table)
        return _table_tag(self.db, self.table)

    @property
    def database(self) -> DatabaseRef:
        return DatabaseRef(self.catalog, self.db)


@dataclass(frozen=True, slots=True)
class DatabaseRef:
    catalog: str
    db: str

    @classmethod
    def of(cls, db: str) -> DatabaseRef:
        return cls(*split_catalog(db))

    @property
    def tag(self) -> str:
        """The database's versions: the same in every catalog."""
        return "d:" + _digest(DEFAULT_CATALOG, self.db)


def _table_tag(db: str, table: str) -> str:
    return "t:" + _digest(DEFAULT_CATALOG, db, table)


CATALOG_TAG = "g"
COORDINATION = ":coord:"


# Partition names and values repeat from request to request (engines ask for overlapping
# sets of one table's partitions): their parses and fields are remembered, for names short
# enough, and of few enough parts, that the memos' size stays bounded by their entries (a
# client chooses the names): at most MEMO_NAMES x ~2 KB each, however the names are made.
MEMO_NAMES = 8192
MEMO_LONGEST = 128
MEMO_PARTS = 16


def partition_field(values: Sequence[str]) -> str:
    """The version field of one partition, from its values (not its name: writes name
    partitions by values, and values need no table schema to compare)."""
    key = tuple(values)
    if len(key) <= MEMO_PARTS and sum(map(len, key)) <= MEMO_LONGEST:
        return _remembered_field(key)
    return _field_of(key)


def _field_of(values: tuple[str, ...]) -> str:
    return "p:" + _field_digest(_values_text(values))


def _values_text(values: Sequence[str]) -> str:
    """What a partition's version field is the digest of."""
    return json.dumps(list(values), ensure_ascii=False)


def _field_digest(text: str | bytes) -> str:
    """A partition's version field without its ``p:``, from :func:`_values_text`."""
    return _digest(text, size=12)


_remembered_field = functools.lru_cache(maxsize=MEMO_NAMES)(_field_of)
_remembered_table_tag = functools.lru_cache(maxsize=MEMO_NAMES)(_table_tag)


class PartitionNameError(ValueError):
    """Not a partition name the proxy can map to values with certainty."""


# The metastore finds a partition by its name (PART_NAME; by values, it makes the name first:
# Warehouse.makePartName), and the database compares names as its collation says: Derby and
# MySQL ignore trailing blanks (PAD SPACE), so ``ds=1 `` finds ``ds=1``; MySQL keeps the
# column in latin1, where other characters become ``?``. Names of printable ASCII that do not
# end with a blank are matched exactly (Derby; MySQL, whose Hive schema collates latin1_bin;
# PostgreSQL; Oracle. Not SQL Server under a case-insensitive collation, its default).


def loose_partition_name(name: str) -> bool:
    """Whether the database may match ``name`` to a partition of another name (its
    trailing blanks ignored): a write naming it may change a partition of another name."""
    return name.endswith(" ")


def certain_partition_name(name: str) -> bool:
    """Whether the partition the database matches to ``name`` is the one of exactly that
    name: printable ASCII (as Hive writes names: other characters below 0x80 escaped), not
    ending with a blank. A read naming any other is never cached."""
    return name.isascii() and name.isprintable() and not name.endswith(" ")


def certain_partition_values(values: Sequence[str]) -> bool:
    """:func:`certain_partition_name` of the name the metastore makes of ``values`` (it
    escapes what is below 0x20 and 0x7f, and the name ends with the last value)."""
    return all(v.isascii() for v in values) and not loose_partition_values(values)


def loose_partition_values(values: Sequence[str]) -> bool:
    """:func:`loose_partition_name` of the name the metastore makes of ``values``."""
    return bool(values) and values[-1].endswith(" ")


def _unescape(text: str) -> str:
    if "%" not in text:
        return text
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "%" and _is_hex(text[i + 1 : i + 3]):
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _is_hex(pair: str) -> bool:
    return len(pair) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in pair)


def parse_partition_name(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``ds=2024-01-01/region=eu`` -> (keys, values), undoing Hive's path escaping.

    Hive writes partition column names in lower case and escapes ``/``, ``=``, ``%`` and
    other special characters in values as ``%XX``, so the split is unambiguous. Anything
    else (empty parts, upper-case keys, a name not escaped as Hive escapes it) raises
    PartitionNameError: the caller does not guess (a read naming it is not cached, a write
    invalidates all of the table's partitions).
    """
    if len(name) <= MEMO_LONGEST and name.count("/") < MEMO_PARTS:
        return _remembered_parse(name)
    return _parse(name)


def _parse(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    keys, values = [], []
    for part in name.split("/"):
        key, sep, value = part.partition("=")
        if not sep or not key or key != key.lower():
            raise PartitionNameError(name)
        keys.append(_unescape(key))
        values.append(_unescape(value))
    # The metastore matches a name as written (PART_NAME), and writes it escaped its own
    # way: a name escaped otherwise (``%64`` for ``d``, ``%2f``) names none of its
    # partitions, though it unescapes to one's values.
    if partition_name(keys, values) != name:
        raise PartitionNameError(name)
    return tuple(keys), tuple(values)


_remembered_parse = functools.lru_cache(maxsize=MEMO_NAMES)(_parse)  # errors are not kept


def columns_and_tail(raw: bytes) -> tuple[str, str] | None:
    """A partition name as a request's bytes carry it -> (its columns, as
    :func:`partition_columns` writes them; its version field without the ``p:``, the tail
    of its entries' keys, see :meth:`Naming.partition_entries`), as the planner makes them;
    remembered if the name is short. ``None`` for a name that is not UTF-8 or does not
    parse (not remembered)."""
    known = _TAILS.get(raw)
    if known is not None:
        return known
    known = _columns_and_tail(raw)
    if len(raw) <= MEMO_LONGEST and known is not None:
        if len(_TAILS) >= MEMO_NAMES:  # the older half goes
            for old in list(itertools.islice(_TAILS, MEMO_NAMES // 2)):
                del _TAILS[old]
        _TAILS[raw] = known
    return known


def _columns_and_tail(raw: bytes) -> tuple[str, str] | None:
    parts = name_parts(raw)
    if parts is None:
        return None
    return parts[0], _field_digest(parts[1])


def py_name_parts(raw: bytes) -> tuple[str, bytes] | None:
    """A partition name as a request's bytes carry it -> (its columns, as
    :func:`partition_columns` writes them; the UTF-8 of its values' text, whose digest is
    its version field); ``None`` for a name that is not UTF-8, does not parse, or is not
    :func:`certain_partition_name` (no partition's entries are kept for it). The reference
    for its C twin (``_names.c``), which :func:`name_parts` is where it is built."""
    try:
        text = raw.decode("utf-8")
        columns, values = parse_partition_name(text)
    except (UnicodeDecodeError, PartitionNameError):
        return None
    if not certain_partition_name(text):
        return None
    return partition_columns(columns), _values_text(values).encode("utf-8")


name_parts: Callable[[bytes], tuple[str, bytes] | None] = py_name_parts
try:  # C twin (see _names.c): a new name in one step, not ~10 us of Python
    from proxy.cache._names import configure as _c_configure
    from proxy.cache._names import name_parts as _c_name_parts
except ImportError:  # pragma: no cover - only where the extension could not be built
    pass
else:
    _c_configure(py_name_parts)  # (for names of other bytes than ASCII)
    name_parts = _c_name_parts


# name -> (columns, tail), for names of at most MEMO_LONGEST bytes
_TAILS: dict[bytes, tuple[str, str]] = {}


@dataclass(frozen=True, slots=True)
class Naming:
    """Key names under one prefix (several proxies' deployments can share one Redis)."""

    prefix: str = "hmsc:1:"

    def versions(self, tag: str) -> str:
        return f"{self.prefix}{{{tag}}}:v"

    def entry(self, tag: str, method: str, *parts: str | bytes) -> str:
        return f"{self.prefix}{{{tag}}}:e:{method}:{_digest(*parts, size=16)}"

    def partition_entry(self, tag: str, variant: str, values: Sequence[str]) -> str:
        return self.partition_entries(tag, variant) + partition_field(values)[2:]

    def partition_entries(self, tag: str, variant: str) -> str:
        """What every partition entry of ``tag`` and ``variant`` starts with; the rest is
        its version field without the ``p:``."""
        return f"{self.prefix}{{{tag}}}:p:{variant}:"

    def dictionary(self, tag: str, dict_id: str) -> str:
        return f"{self.prefix}{{{tag}}}:z:{dict_id}"

    def coordination(self, name: str) -> str:
        """Keys proxies coordinate through (the follower's lease and position); a flush
        leaves them alone, or the follower would lose its place with every flush it makes."""
        return f"{self.prefix}{{{CATALOG_TAG}}}{COORDINATION}{name}"

    @property
    def pattern(self) -> str:
        return f"{self.prefix}*"


def digest(*parts: str | bytes) -> str:
    return _digest(*parts, size=16)


def escape_path_name(text: str) -> str:
    """Hive's partition-path escaping (FileUtils.escapePathName)."""
    special = set("\"#%'*/:=?\\\x7f{[]^")
    out = []
    for ch in text:
        if ord(ch) < 0x20 or ch in special:
            out.append(f"%{ord(ch):02X}")
        else:
            out.append(ch)
    return "".join(out) or "__HIVE_DEFAULT_PARTITION__"


def partition_columns(keys: Sequence[str]) -> str:
    """A name's columns as it writes them (escaped: one never holds the ``/`` between)."""
    return "/".join(escape_path_name(k) for k in keys)


def partition_name(keys: list[str], values: list[str]) -> str:
    return "/".join(
        f"{escape_path_name(k.lower())}={escape_path_name(v)}"
        for k, v in zip(keys, values, strict=True)
    )
