"""The fast paths change nothing but speed: a randomised workload (tests/unit/differential.py),
run once with them on and once with ``--fast-paths off`` (every connection served by a task,
every call the ordinary, awaited way), on the embedded store, gets the same bytes for every
call, the same metric counts and the same calls to the metastore."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.differential import assert_same, served


@pytest.mark.parametrize("client_transport", ["buffered", "framed"])
@pytest.mark.parametrize("cache_scope", ["shared", "user"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_fast_paths_give_the_same_bytes_and_counts_as_the_ordinary_way(
    client_transport: str, cache_scope: str, seed: int
) -> None:
    options = {"client_transport": client_transport, "cache_scope": cache_scope}
    calls = 160

    async def run() -> None:
        fast = await served("on", seed, calls, **options)
        ordinary = await served("off", seed, calls, **options)
        assert_same(fast, ordinary)

    asyncio.run(run())
