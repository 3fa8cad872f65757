"""The audit log: one JSON line per call, to stdout or a file rotated by size.

::

    {"time":"2026-12-06T21:05:03.123Z","user":"alice","address":"10.1.2.3",
     "method":"get_partitions_by_names","db":"sales","table":"events","partitions":100,
     "bytes":118034,"outcome":"ok","cache":"hit","ms":0.041}

``user``: as the client authenticated, else as its ``set_ugi`` said (``null``: neither);
``address``: the client's host; ``db`` and ``table``: what the call names (``null``: none,
or a call across databases); ``partitions``: how many partition objects the reply holds
(``null``: not a call for partitions); ``bytes``: the reply's size; ``outcome``: as
``hmsproxy_requests_total`` says it; ``cache``: ``hit`` (answered from the cache), ``miss``
(a cacheable read not answered from it: its outcome says how it went) or ``none`` (not one
the cache answers); ``ms``:
from the whole request to its reply written. Nothing else from a call is written: no
argument values beyond the names, no tokens, no filters (they can hold literals).

Cheap enough to leave on: a line is made with the C string encoder and a time prefix
kept per second, kept in memory and written in one system call per second or per
256 KiB (a stop writes what is left); measured in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import IO

from proxy.guard.calls import PARTITION_READS
from proxy.wire.binary import TType, parse_header

log = logging.getLogger(__name__)

FLUSH_BYTES = 256 * 1024
FLUSH_SECONDS = 1.0
_quote = json.encoder.encode_basestring  # (the C one)


def quoted(text: str | None) -> str:
    return "null" if text is None else _quote(text)


# Their replies hold partition specs (a table's partitions grouped), not partitions.
_SPECS = frozenset(
    {
        "get_partitions_pspec",
        "get_part_specs_by_filter",
        "get_partitions_spec_by_expr",
        "get_partitions_with_specs",
    }
)


def partitions_in(method: str, reply: bytes | memoryview) -> int | None:
    """How many partition objects a reply to ``method`` holds, from its first bytes (its
    result's list, or the list first in its result's struct); ``None``: not a call for
    partitions (or one answered in specs), or an exception."""
    if method not in PARTITION_READS or method in _SPECS:
        return None
    header = parse_header(reply, 0, min(len(reply), 4096))
    if header is None:
        return None
    at = header.length
    body = reply[at : at + 16]
    if len(body) < 8 or body[1:3] != b"\x00\x00":
        return None  # (not the success field: an exception)
    if body[0] == TType.STRUCT:  # a response struct: its first field's list
        if len(body) < 11 or body[3] != TType.LIST:
            return None
        body = body[3:]
    elif body[0] != TType.LIST:
        return None
    return int.from_bytes(body[4:8], "big", signed=True)


class AuditLog:
    """Where the lines go: ``stdout``, or a file rotated past ``max_bytes`` keeping
    ``backups`` old ones (``audit.log.1`` the newest)."""

    def __init__(self, target: str, max_bytes: int, backups: int) -> None:
        self.path = None if target == "stdout" else Path(target)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lines: list[str] = []
        self._held = 0
        self._second = -1
        self._prefix = ""
        self._file: IO[bytes] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.written = 0  # lines
        self._quiet_until = 0.0
        if self.path is not None:
            self._file = open(self.path, "ab")  # noqa: SIM115  # (open for the proxy's life)

    def record(
        self,
        user: str | None,
        address: str | None,
        method: str,
        db: str | None,
        table: str | None,
        partitions: int | None,
        size: int,
        outcome: str,
        cache: str,
        took: float,
    ) -> None:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime('{"time":"%Y-%m-%dT%H:%M:%S', time.gmtime(second))
        line = (
            f'{self._prefix}.{int((now - second) * 1000):03d}Z","user":{quoted(user)},'
            f'"address":{quoted(address)},"method":{quoted(method)},"db":{quoted(db)},'
            f'"table":{quoted(table)},"partitions":'
            f'{"null" if partitions is None else partitions},"bytes":{size},'
            f'"outcome":"{outcome}","cache":"{cache}","ms":{took * 1000:.3f}}}\n'
        )
        self._lines.append(line)
        self._held += len(line)
        if self._held >= FLUSH_BYTES:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._timer = loop.call_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._lines:
            return
        data = "".join(self._lines).encode()
        self.written += len(self._lines)
        self._lines.clear()
        self._held = 0
        try:
            if self.path is None:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
                return
            if self._file is None:  # (a rotation failed: opened again, or lines are lost)
                self._file = open(self.path, "ab")  # noqa: SIM115
            self._file.write(data)
            self._file.flush()
            if self._file.tell() >= self.max_bytes:
                self._rotate()
        except (OSError, ValueError) as exc:  # (a full disk must not stop the proxy)
            self._lost(len(data), exc)

    def _lost(self, size: int, exc: Exception) -> None:
        """Lines could not be written: said in the log at most once a minute."""
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + 60
            log.error("audit log: lines lost (%d bytes): %s", size, exc)

    def _rotate(self) -> None:
        assert self.path is not None and self._file is not None
        self._file.close()
        self._file = None  # (opened again at the next write, whatever happens here)
        for n in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.backups:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
