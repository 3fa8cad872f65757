"""What the Redis store sends, checked without Redis (the integration tests run them)."""

from __future__ import annotations

from proxy.cache.keys import EPOCH, Bump
from proxy.cache.redis_commands import as_ops, bump_commands, fence_fields, fence_key


def test_a_bump_is_a_new_epoch_or_one_more_and_the_hash_kept_alive() -> None:
    commands = bump_commands([Bump("k:v", EPOCH, "table"), Bump("k:v", "pgen", "partitions")], 90)
    assert [c[0] for c in commands] == ["HSET", "EXPIRE", "HINCRBY", "EXPIRE"]
    assert (
        commands[0][1:3] == ("k:v", EPOCH)
        and commands[0][3] != bump_commands([Bump("k:v", EPOCH, "table")], 90)[0][3]
    )  # a fresh epoch each time
    assert commands[2] == ("HINCRBY", "k:v", "pgen", 1) and commands[3] == ("EXPIRE", "k:v", 90)
    assert as_ops(commands[2:3]) == [("hincrby", ("k:v", "pgen", 1), {})]


def test_a_fence_hash_reads_back_as_deadlines_and_skips_what_it_cannot_read() -> None:
    assert fence_key("{t}:v") == "{t}:v:f"  # same hash tag: same cluster slot
    flat = [b"w1", b"1700000000.5", b"L:7:e", b"not a number", b"\xff", b"1", "G:7", "12"]
    assert fence_fields(flat) == {"w1": 1700000000.5, "G:7": 12.0}
    assert fence_fields(None) == {}
