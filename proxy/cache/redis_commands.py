"""What the Redis store sends, as data (pure): command shapes, fence keys, the scripts
that make the follower's lease safe, and how a fence hash reads back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.cache import resp
from proxy.cache.keys import EPOCH, Bump
from proxy.cache.store import new_epoch

# One command for a pipeline: (method name, positional arguments, keyword arguments).
Op = tuple[str, tuple[Any, ...], dict[str, Any]]

FENCE_SUFFIX = ":f"


def fence_key(versions_key: str) -> str:
    """The write and lock fences of a version hash: same hash tag, so same slot."""
    return versions_key + FENCE_SUFFIX


def fence_fields(flat: list[Any] | None) -> dict[str, float]:
    """An HGETALL reply of a fence hash: field name -> deadline (unreadable ones: none)."""
    out: dict[str, float] = {}
    items = flat or []
    for name, value in zip(items[::2], items[1::2], strict=False):
        try:
            key = name.decode() if isinstance(name, bytes) else str(name)
            out[key] = float(value)
        except (ValueError, UnicodeDecodeError):
            continue
    return out


def op(name: str, *args: Any, **kwargs: Any) -> Op:
    return name, args, kwargs


def bump_commands(bumps: Sequence[Bump], version_ttl: int) -> list[resp.Command]:
    """The invalidation of ``bumps``: a new epoch, or one more on a counter, and the hash
    kept alive as long as versions are."""
    commands: list[resp.Command] = []
    for b in bumps:
        if b.field == EPOCH:
            commands.append(("HSET", b.key, EPOCH, new_epoch()))
        else:
            commands.append(("HINCRBY", b.key, b.field, 1))
        commands.append(("EXPIRE", b.key, version_ttl))
    return commands


def as_ops(commands: Sequence[resp.Command]) -> list[Op]:
    """Commands of the lean connection as redis-py pipeline calls (the same commands)."""
    return [op(str(name).lower(), *args) for name, *args in commands]


# The follower's lease: taken when free, kept by its holder, never taken from another.
LEASE = (
    "local v = redis.call('GET', KEYS[1]) "
    "if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end "
    "if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end "
    "return 0"
)
# A write only the lease's holder may make (the follower's position).
IF_LEADER = (
    "if redis.call('GET', KEYS[2]) == ARGV[2] then "
    "redis.call('SET', KEYS[1], ARGV[1]) return 1 end return 0"
)
RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end"
