"""Redis's invalidation streams, feeding the version mirror (the I/O edge of :mod:`.mirror`).

One connection per Redis node (each primary of a cluster: tracking is per node) turns on
client-side caching in broadcast mode for the deployment's key prefix, redirected to itself,
and subscribes to ``__redis__:invalidate`` (RESP2: no push messages needed, and the stream
and its tracking live and die together: a dropped connection is a lost stream, never a
silent one). Redis then names every key under the prefix that changes, expires, is evicted
or is flushed, in the order the changes happened.

Every ``beat`` seconds this proxy sets a short-lived key of its own on each node, through
its ordinary look-up connection, and notes when; the key's invalidation coming back through
the node's stream proves the stream delivers, and how late (the mirror trusts it only within
``--redis-tracking-max-lag``). A stream that cannot be opened is retried with a backoff;
until then the mirror serves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.cache import resp
from proxy.cache.mirror import VersionMirror
from proxy.metrics import Metrics
from proxy.retry import Backoff
from proxy.tasks import background

log = logging.getLogger(__name__)

CHANNEL = b"__redis__:invalidate"
BEAT_LIFE_MS = 5000

Place = tuple[str, int] | str
Opener = Callable[[Place], Awaitable[resp.RespConnection]]
# Sends commands over the ordinary look-up connection of a place (raises on failure).
Sender = Callable[[Place, list[resp.Command]], Awaitable[list[Any]]]


@dataclass(eq=False)
class _Generation:
    """The streams of one start: tasks of an earlier one, cancelled, touch only theirs."""

    places: list[Place]
    beat_tags: list[str]
    conns: list[resp.RespConnection | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.conns = [None] * len(self.places)


class InvalidationStreams:
    def __init__(
        self,
        mirror: VersionMirror,
        prefix: str,
        metrics: Metrics,
        *,
        beat: float,
        timeout: float,
    ) -> None:
        self.mirror = mirror
        self.prefix = prefix
        self.metrics = metrics
        self.beat = beat
        self.timeout = timeout
        self._token = os.urandom(6).hex()
        self._count = 0
        self._gen = _Generation([], [])
        self._tasks: set[asyncio.Task[Any]] = set()
        self._said_down = False
        # Keys someone waits to hear invalidated (see heard()).
        self._awaited: dict[str, list[asyncio.Future[bool]]] = {}

    @property
    def places(self) -> list[Place]:
        return list(self._gen.places)

    def start(
        self, places: Sequence[Place], beat_tags: Sequence[str], opener: Opener, sender: Sender
    ) -> None:
        """Track ``places`` (the nodes); ``beat_tags[i]``: a hash tag stored on place i."""
        self.stop()
        gen = self._gen = _Generation(list(places), list(beat_tags))
        self.mirror.reset(len(gen.places))
        for i, place in enumerate(gen.places):
            self._spawn(self._keep_stream(gen, i, place, opener))
        self._spawn(self._beats(gen, sender))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = background(work, "the redis invalidation stream")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        for conn in self._gen.conns:
            if conn is not None:
                conn.close()
        self._gen = _Generation([], [])
        self.mirror.reset(0)
        self._state()

    # -- one stream ------------------------------------------------------------------------

    async def _keep_stream(self, gen: _Generation, i: int, place: Place, opener: Opener) -> None:
        backoff = Backoff(base=0.2, cap=5.0)
        while True:
            lost = asyncio.get_running_loop().create_future()
            try:
                conn = await self._open(place, opener, lost)
            except (OSError, TimeoutError, resp.RespError, resp.Disconnected) as exc:
                self.metrics.tracking_resyncs.labels("connect_failed").inc()
                if not self._said_down:
                    self._said_down = True
                    log.warning(
                        "cache: redis invalidation stream to %s failed (%s); hits read "
                        "versions from redis until it is back",
                        _name(place),
                        str(exc) or type(exc).__name__,
                    )
                await asyncio.sleep(backoff.failed())
                continue
            gen.conns[i] = conn
            self.mirror.subscribed(i)
            backoff.succeeded()
            if self._said_down:
                self._said_down = False
                log.info("cache: redis invalidation stream to %s is back", _name(place))
            try:
                await lost
            finally:
                gen.conns[i] = None
                conn.close()
            self.mirror.lost(i)
            self.metrics.tracking_resyncs.labels("stream_lost").inc()
            self._state()
            log.debug("cache: redis invalidation stream to %s lost", _name(place))

    async def _open(
        self, place: Place, opener: Opener, lost: asyncio.Future[None]
    ) -> resp.RespConnection:
        conn = await opener(place)
        try:
            async with asyncio.timeout(max(self.timeout, 1.0)):
                (cid,) = await asyncio.gather(*conn.send([("CLIENT", "ID")]))
                if isinstance(cid, resp.RespError):
                    raise cid
                replies = await asyncio.gather(
                    *conn.send(
                        [
                            (
                                "CLIENT",
                                "TRACKING",
                                "ON",
                                "REDIRECT",
                                int(cid),
                                "BCAST",
                                "PREFIX",
                                self.prefix,
                            ),
                            ("SUBSCRIBE", CHANNEL),
                        ]
                    )
                )
        except BaseException:
            conn.close()
            raise
        for reply in replies:
            if isinstance(reply, resp.RespError):
                conn.close()
                raise reply

        def pushed(message: Any) -> None:
            # ["message", channel, [key, ...]] or, for a flush, ["message", channel, None]
            if isinstance(message, list) and len(message) == 3 and message[0] == b"message":
                self.mirror.invalidated(message[2], time.monotonic())
                if self._awaited:
                    self._wake(message[2])

        def gone() -> None:
            if not lost.done():
                lost.set_result(None)
            self._wake(None, heard=False)

        conn.on_push = pushed
        conn.on_lost = gone
        if conn.closed:
            gone()
        return conn

    # -- hearing one's own change -------------------------------------------------------------

    def listen(self, keys: Sequence[str]) -> Hearing:
        """Start listening for the invalidations of ``keys``, before this proxy changes them
        (Redis may write the invalidation before the change's reply: one listened for only
        after the reply would be missed). See :meth:`Hearing.heard`."""
        loop = asyncio.get_running_loop()
        hearing = Hearing(self, tracking=any(c is not None for c in self._gen.conns))
        for key in keys if hearing.tracking else ():
            future: asyncio.Future[bool] = loop.create_future()
            self._awaited.setdefault(key, []).append(future)
            hearing.waits.append((key, future))
        return hearing

    def _unlisten(self, key: str, future: asyncio.Future[bool]) -> None:
        waiting = self._awaited.get(key)
        if waiting is not None and future in waiting:
            waiting.remove(future)
            if not waiting:
                del self._awaited[key]

    def _wake(self, keys: Sequence[bytes] | None, heard: bool = True) -> None:
        """Wake who listens for ``keys`` (``None``: everyone: a flush, heard; or a lost
        stream, not heard)."""
        if keys is None:
            names = list(self._awaited)
        else:
            names = [k.decode("utf-8", "surrogateescape") for k in keys]
        for name in names:
            for future in self._awaited.pop(name, ()):
                if not future.done():
                    future.set_result(heard)

    # -- beats -----------------------------------------------------------------------------

    async def _beats(self, gen: _Generation, sender: Sender) -> None:
        while True:
            await asyncio.sleep(self.beat)
            self._state()
            sends = []
            for i, place in enumerate(gen.places):
                if gen.conns[i] is None:
                    continue
                self._count += 1
                key = f"{self.prefix}{{{gen.beat_tags[i]}}}:beat:{self._token}:{self._count}"
                self.mirror.expect(key, i, time.monotonic())
                sends.append(sender(place, [("SET", key, "1", "PX", BEAT_LIFE_MS)]))
            # A beat that fails is simply not seen back: the mirror stops trusting the stream.
            for outcome in await asyncio.gather(*sends, return_exceptions=True):
                if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                    raise outcome

    def _state(self) -> None:
        now = time.monotonic()
        self.metrics.tracking_up.set(1 if self.mirror.trusted(now) else 0)
        for lag in self.mirror.lags:
            self.metrics.tracking_lag.observe(lag)
        self.mirror.lags.clear()
        self.metrics.mirror_bytes.set(self.mirror.bytes)

    async def close(self) -> None:
        tasks = list(self._tasks)
        self.stop()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Hearing:
    """Invalidations listened for (see :meth:`InvalidationStreams.listen`)."""

    def __init__(self, streams: InvalidationStreams, *, tracking: bool) -> None:
        self.streams = streams
        self.tracking = tracking  # False: no stream was up, nothing can be heard
        self.waits: list[tuple[str, asyncio.Future[bool]]] = []

    async def heard(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until every key listened for has been heard back.
        Redis writes a change's invalidation to every tracking connection in the same turn
        of its loop, so once this proxy hears it, every other proxy's copy is on its way
        too. ``False``: not heard in time, a stream was lost, or none was tracking."""
        try:
            if not self.tracking:
                return False
            async with asyncio.timeout(timeout):
                return all(await asyncio.gather(*(f for _, f in self.waits)))
        except TimeoutError:
            return False
        finally:
            self.close()

    def close(self) -> None:
        for key, future in self.waits:
            self.streams._unlisten(key, future)
        self.waits.clear()


def _name(place: Place) -> str:
    return place if isinstance(place, str) else f"{place[0]}:{place[1]}"
