"""How a cached reply is stored: a fingerprint of its versions, flags, and the bytes (pure).

Layout: ``magic(1) flags(1) expires(4) fingerprint(16) [dictionary id(8)] payload``. The
fingerprint is a digest of the version values the entry was filled under, in plan order; a
reader computes it from the current values and serves the entry only on equality. ``expires``
(Unix seconds) lets a proxy keep a decoded copy no longer than Redis keeps the entry, without
asking Redis for its TTL.

Payloads above a few hundred bytes are zlib-compressed. Partition objects are compressed
against a per-table dictionary (another partition of the same table), because what makes a
partition large (its columns, formats, serde) repeats from partition to partition, and zlib
cannot see that repetition inside one partition alone.
"""

from __future__ import annotations

import hashlib
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = 0xC1
NEGATIVE = 1  # a cached NoSuchObjectException
COMPRESSED = 2
DICTIONARY = 4
ABSENT = 8  # a partition the HMS does not have
ICEBERG = 16  # holds an Iceberg table object (served only while --cache-iceberg-tables allows)
_KEPT = NEGATIVE | ABSENT | ICEBERG  # flags that describe the reply, not its encoding
HEADER = 22
_EXPIRES = struct.Struct(">I")
DICT_ID = 8
COMPRESS_ABOVE = 200
# Level 1 costs a third of level 6 and loses little on Thrift; large replies are compressed
# once per fill but decompressed on every first hit in a proxy.
LEVEL = 1


def fingerprint(values: Sequence[bytes | None]) -> bytes:
    """Digest of the version values, in plan order (a missing field counts as ``-``)."""
    h = hashlib.blake2b(digest_size=16)
    for value in values:
        if value is None:
            value = b"-"
        h.update(value)
        h.update(b"\x00")
    return h.digest()


VIEW_ABOVE = 64 * 1024  # stored values bigger than this are read through a view

# A reply's bytes as the cache holds them: a view into the stored value where it was not
# compressed (no copy per hit), new bytes where it was.
Payload = bytes | memoryview


@dataclass(frozen=True, slots=True)
class Entry:
    fingerprint: bytes
    flags: int
    payload: Payload  # the reply message (or the partition struct), uncompressed
    expires_at: float = 0.0  # Unix time

    @property
    def ttl(self) -> float:
        """Seconds left to live."""
        return self.expires_at - time.time()

    @property
    def negative(self) -> bool:
        return bool(self.flags & NEGATIVE)

    @property
    def absent(self) -> bool:
        return bool(self.flags & ABSENT)

    @property
    def iceberg(self) -> bool:
        return bool(self.flags & ICEBERG)


def encode(
    fp: bytes,
    flags: int,
    payload: bytes,
    ttl: float,
    *,
    compress: bool = True,
    dictionary: tuple[bytes, bytes] | None = None,
) -> bytes:
    """``dictionary``: (id, bytes) to compress against."""
    flags &= _KEPT
    expires = _EXPIRES.pack(int(time.time() + ttl))
    head = b""
    if compress and len(payload) > COMPRESS_ABOVE:
        if dictionary is not None:
            dict_id, zdict = dictionary
            c = zlib.compressobj(6, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
            body = c.compress(payload) + c.flush()
            flags |= COMPRESSED | DICTIONARY
            head = dict_id
        else:
            c = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
            body = c.compress(payload) + c.flush()
            flags |= COMPRESSED
        if len(body) + len(head) >= len(payload):  # incompressible: keep it plain
            flags &= ~(COMPRESSED | DICTIONARY)
            body, head = payload, b""
    else:
        body = payload
    return bytes((MAGIC, flags)) + expires + fp + head + body


class EntryError(ValueError):
    """A stored value this version cannot read (corrupt, or from another format)."""


def dictionary_id(value: bytes) -> bytes | None:
    """The dictionary a stored value needs, if any."""
    if len(value) >= HEADER + DICT_ID and value[0] == MAGIC and value[1] & DICTIONARY:
        return value[HEADER : HEADER + DICT_ID]
    return None


def decode(value: bytes, zdict: bytes | None = None) -> Entry:
    if len(value) < HEADER or value[0] != MAGIC:
        raise EntryError("not a cache entry")
    flags = value[1]
    (expires,) = _EXPIRES.unpack_from(value, 2)
    fp = value[6:HEADER]
    # A big uncompressed reply (the embedded store does not compress) is served from a view,
    # not a copy (12 MB of partitions: a millisecond a hit). A small one is copied: a view
    # costs more than its bytes, and would keep the whole stored value alive in the L1.
    body: Payload = memoryview(value)[HEADER:] if len(value) > VIEW_ABOVE else value[HEADER:]
    try:
        if flags & DICTIONARY:
            if zdict is None:
                raise EntryError("dictionary missing")
            d = zlib.decompressobj(-15, zdict)
            body = d.decompress(body[DICT_ID:]) + d.flush()
        elif flags & COMPRESSED:
            body = zlib.decompress(body, -15)
    except zlib.error as exc:
        raise EntryError(str(exc)) from exc
    return Entry(fp, flags & _KEPT, body, float(expires))


# zlib uses the last 32 KiB of a dictionary and nothing before them.
DICTIONARY_WINDOW = 32 * 1024


def new_dictionary(sample: bytes) -> tuple[bytes, bytes]:
    """(id, bytes) of a dictionary made from one partition's bytes."""
    sample = sample[-DICTIONARY_WINDOW:]
    return hashlib.blake2b(sample, digest_size=DICT_ID).digest(), sample
