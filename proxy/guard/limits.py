"""Per-user and per-address rate limits: token buckets in calls/s and partitions/s,
configured by group in a TOML file (``--limits-file``) that is read again when it changes.

::

    [default]                     # whoever is in no group (no key: no limit)
    calls_per_second = 200

    [groups.adhoc]
    users = ["alice", "bob"]      # as they authenticated, else as their set_ugi said
    addresses = ["10.1.0.0/16"]   # clients with no user, by address
    calls_per_second = 20         # each member's own bucket
    partitions_per_second = 50000
    burst_seconds = 2             # a bucket holds this many seconds of its rate (1)
    count_hits = false            # hits from the cache count too (false)

Each tenant (a user, else a client address) has buckets of its own, filled at its group's
rates; a call that finds one empty is refused with a MetaException saying which limit, and
counted (``hmsproxy_refused_calls_total``). What is counted: the calls that go to the
metastore, and the partitions they fetch (as costed before they go, :mod:`.counts`); with
``count_hits`` every read, hits included. Writes and lock calls are never refused by a
rate: refusing an ``unlock`` or a commit's ``alter_table`` half way through a commit would
strand a lock or a half-made change, and writes are rare next to reads.

A call bigger than a bucket holds (a fetch of more partitions than ``burst_seconds``
allows) passes when the bucket is full, and leaves it in debt: it is not refused forever,
and the tenant waits longer before the next.

A file that does not parse is reported in the log and the limits in force stay as they
were; a file that goes away lifts every limit.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.memo import BoundedMemo

log = logging.getLogger(__name__)

CHECK_EVERY = 2.0  # seconds between looks at the file's modification time
TENANTS_KEPT = 100_000  # buckets kept; one evicted is full again when next used
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Rule:
    """What each member of ``group`` may do (0: no limit)."""

    group: str = "default"
    calls_per_second: float = 0.0
    partitions_per_second: float = 0.0
    burst_seconds: float = 1.0
    count_hits: bool = False

    @property
    def limits(self) -> bool:
        return bool(self.calls_per_second or self.partitions_per_second)


NO_LIMIT = Rule()


@dataclass(frozen=True, slots=True)
class Group:
    rule: Rule
    users: frozenset[str]
    networks: tuple[Network, ...]


class LimitsError(ValueError):
    pass


def parse(text: str) -> tuple[Rule, tuple[Group, ...]]:
    """The default rule and the groups a limits file gives (raises LimitsError)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LimitsError(f"not TOML: {exc}") from exc
    unknown = set(data) - {"default", "groups"}
    if unknown:
        raise LimitsError(f"unknown sections {sorted(unknown)} (default, groups)")
    default = _rule("default", data.get("default", {}))
    groups = []
    sections = data.get("groups") or {}
    if not isinstance(sections, dict):
        raise LimitsError("groups: a table of groups expected ([groups.NAME])")
    for name, body in sections.items():
        if name == "default":
            raise LimitsError("groups.default: the name of the rule for no group ([default])")
        if not isinstance(body, dict):
            raise LimitsError(f"groups.{name}: a table expected")
        body = dict(body)
        users = body.pop("users", [])
        addresses = body.pop("addresses", [])
        if not _strings(users) or not _strings(addresses):
            raise LimitsError(f"groups.{name}: users and addresses are lists of strings")
        try:
            networks = tuple(ipaddress.ip_network(a, strict=False) for a in addresses)
        except ValueError as exc:
            raise LimitsError(f"groups.{name}: {exc}") from exc
        groups.append(Group(_rule(name, body), frozenset(users), networks))
    return default, tuple(groups)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _rule(name: str, body: Any) -> Rule:
    if not isinstance(body, dict):
        raise LimitsError(f"{name}: a table expected")
    allowed = {"calls_per_second", "partitions_per_second", "burst_seconds", "count_hits"}
    unknown = set(body) - allowed
    if unknown:
        raise LimitsError(f"{name}: unknown keys {sorted(unknown)} ({', '.join(sorted(allowed))})")
    values: dict[str, Any] = {}
    for key in ("calls_per_second", "partitions_per_second", "burst_seconds"):
        if key in body:
            value = body[key]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0:
                raise LimitsError(f"{name}.{key}: a number, 0 or more")
            values[key] = float(value)
    if values.get("burst_seconds", 1.0) <= 0:
        raise LimitsError(f"{name}.burst_seconds: more than 0")
    if "count_hits" in body:
        if not isinstance(body["count_hits"], bool):
            raise LimitsError(f"{name}.count_hits: true or false")
        values["count_hits"] = body["count_hits"]
    return Rule(name, **values)


class _Bucket:
    """One tenant's buckets: tokens for calls and for partitions, and when they were
    last filled."""

    __slots__ = ("calls", "partitions", "stamp")

    def __init__(self, rule: Rule, now: float) -> None:
        self.calls = rule.calls_per_second * rule.burst_seconds
        self.partitions = rule.partitions_per_second * rule.burst_seconds
        self.stamp = now

    def take(self, rule: Rule, calls: int, partitions: int, now: float) -> str | None:
        """Take ``calls`` (0 or 1) and ``partitions``; the reason it may not, if it may
        not."""
        elapsed = max(0.0, now - self.stamp)
        self.stamp = now
        burst = rule.burst_seconds
        rate_calls, parts = rule.calls_per_second, rule.partitions_per_second
        if rate_calls:
            self.calls = min(rate_calls * burst, self.calls + elapsed * rate_calls)
        if parts:
            self.partitions = min(parts * burst, self.partitions + elapsed * parts)
        # (A bucket smaller than one call, below 1 call/s, lets a call through when full.)
        if calls and rate_calls and self.calls < min(1.0, rate_calls * burst):
            return "calls_rate"
        # (More than the bucket holds passes when it is full, into debt.)
        if parts and partitions and self.partitions < min(partitions, parts * burst):
            return "partitions_rate"
        if rate_calls:
            self.calls -= calls
        if parts:
            self.partitions -= partitions
        return None


class Limits:
    """The rules of ``--limits-file`` and every tenant's buckets."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.default = NO_LIMIT
        self.groups: tuple[Group, ...] = ()
        self._buckets: BoundedMemo[str, tuple[Rule, _Bucket]] = BoundedMemo(
            TENANTS_KEPT, TENANTS_KEPT * 256
        )
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the file read
        self._next_look = 0.0
        self.active = False  # any rule limits anything
        self.counts_hits = False  # any rule counts hits
        self.watchers: list[Callable[[], None]] = []  # told when the rules change
        if self.path is not None:
            self.reload(initial=True)

    def reload(self, *, initial: bool = False) -> None:
        """Read the file again if it changed (raises LimitsError at start-up only)."""
        assert self.path is not None
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            if initial:
                raise LimitsError(f"{self.path}: {exc.strerror}") from exc
            if self._seen is not None:
                log.warning("limits file %s is gone: no limits from now on", self.path)
                self._install(NO_LIMIT, ())
                self._seen = None
            return
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return
        try:
            default, groups = parse(self.path.read_text())
        except (OSError, UnicodeDecodeError, LimitsError) as exc:
            if initial:
                raise LimitsError(f"{self.path}: {exc}") from exc
            log.error("limits file %s not applied, the limits in force stay: %s", self.path, exc)
            self._seen = seen
            return
        self._seen = seen
        self._install(default, groups)
        log.info(
            "limits: %d groups from %s%s",
            len(groups),
            self.path,
            "" if initial else " (read again: it changed)",
        )

    def _install(self, default: Rule, groups: tuple[Group, ...]) -> None:
        self.default, self.groups = default, groups
        rules = [default, *(g.rule for g in groups)]
        self.active = any(r.limits for r in rules)
        self.counts_hits = any(r.limits and r.count_hits for r in rules)
        self._buckets.clear()  # (rates changed: every tenant starts with a full bucket)
        for watcher in self.watchers:
            watcher()

    def look(self, now: float) -> None:
        """Read the file again if it changed, at most every CHECK_EVERY seconds."""
        if self.path is not None and now >= self._next_look:
            self._next_look = now + CHECK_EVERY
            self.reload()

    def rule(self, user: str | None, address: str) -> Rule:
        """The rule of a user (by name), or of a client with no user (by address)."""
        if user is not None:
            for group in self.groups:
                if user in group.users:
                    return group.rule
            return self.default
        try:
            ip = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            return self.default
        for group in self.groups:
            if any(ip in network for network in group.networks):
                return group.rule
        return self.default

    def take(self, tenant: str, rule: Rule, partitions: int, *, calls: int = 1) -> str | None:
        """Charge ``calls`` (one, or none: charged before) and ``partitions`` of ``tenant``
        under ``rule``; the reason it is refused (``calls_rate``, ``partitions_rate``), or
        ``None``."""
        if not rule.limits:
            return None
        now = time.monotonic()
        held = self._buckets.get(tenant)
        if held is None or held[0] is not rule:
            held = (rule, _Bucket(rule, now))
            self._buckets.put(tenant, held, len(tenant) + 96)
        return held[1].take(rule, calls, partitions, now)
