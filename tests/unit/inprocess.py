"""The proxy's request path in process: a :class:`CallHandler` with the same parts
``proxy/app.py`` gives it (an :class:`UpstreamPool`, here with connections to a
:class:`ScriptedHMS`; a :class:`CacheEngine` on the embedded store, without the status
page, the Iceberg policy and, unless asked, stale-if-error, which ``app.build_cache`` adds
and the integration tests exercise), and a fake client channel that captures what the
client is sent."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from proxy import idl
from proxy.audit import AuditLog
from proxy.cache.engine import CacheEngine
from proxy.cache.planner import Planner, Ttls
from proxy.cache.store import MemoryStore
from proxy.config import Options, load
from proxy.handler import CallHandler, SessionState
from proxy.metrics import Metrics
from proxy.upstream import UpstreamPool
from proxy.wire.framing import Message, MessageReader, Transport
from tests.unit.scripted_hms import ScriptedHMS, split_messages


class Client:
    """A client's side of a session as the handler sees it (a ``ClientChannel``): what it
    is sent is captured. ``hang_up_after``: sends it takes before it hangs up (every later
    send raises ``ConnectionResetError``, as a closed socket's would)."""

    def __init__(
        self, transport: Transport = Transport.BUFFERED, *, hang_up_after: int | None = None
    ) -> None:
        self.transport = transport
        self.data = bytearray()
        self.sends = 0
        self.hang_up_after = hang_up_after
        self.sent = 0
        self.head = b""

    async def send(self, data: bytes) -> None:
        self._take(bytes(data))

    async def send_message(self, head: bytes, rest: memoryview) -> None:
        self._take(self.transport.prefix(len(head) + len(rest)) + head + bytes(rest))

    def _take(self, data: bytes) -> None:
        if self.hang_up_after is not None and self.sends >= self.hang_up_after:
            raise ConnectionResetError("the client hung up")
        self.sends += 1
        self.data += data
        self.sent += len(data)  # (as ClientConnection counts them, for the audit log)
        self.head = data[:256]

    def replies(self) -> list[bytes]:
        return split_messages(bytes(self.data), framed=self.transport is Transport.FRAMED)

    def reply(self) -> bytes:
        """The one reply this client got."""
        (only,) = self.replies()
        return only


def request(method: str, seqid: int, **args: Any) -> Message:
    """A client's call as the server hands it to the handler."""
    return message(idl.encode_call(method, seqid, **args))


def message(data: bytes) -> Message:
    reader = MessageReader(Transport.BUFFERED, 1 << 20)
    reader.feed(data)
    out = reader.next_message()
    assert out is not None and not reader.buffered
    return out


def options(**values: Any) -> Options:
    return load({"upstream": "thrift://hms:9083", **{k: str(v) for k, v in values.items()}}, {})


@dataclass
class Rig:
    hms: ScriptedHMS
    options: Options
    metrics: Metrics
    pool: UpstreamPool
    store: MemoryStore
    cache: CacheEngine | None
    handler: CallHandler

    async def call(self, session: SessionState, method: str, seqid: int = 1, **args: Any) -> bytes:
        """One call through the handler; the client's one reply."""
        client = Client()
        await self.handler.handle(session, request(method, seqid, **args), client)
        return client.reply()

    def sample(self, name: str, **labels: str) -> float:
        self.metrics.settle()  # as a scrape does
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    @property
    def active(self) -> float:
        """Metastore connections counted in use (the pool's slots taken but not idle)."""
        return self.sample("hmsproxy_upstream_connections", state="active")

    @property
    def idle(self) -> float:
        return self.sample("hmsproxy_upstream_connections", state="idle")

    def requests(self, method: str, outcome: str) -> float:
        return self.sample("hmsproxy_requests_total", method=method, outcome=outcome)


@contextlib.asynccontextmanager
async def rig(
    *,
    cache: bool = True,
    store: MemoryStore | None = None,
    stale_window: float = 0.0,
    removed: tuple[str, ...] = (),
    per_user: bool = False,
    build: Callable[[Options, Metrics], CacheEngine] | None = None,
    **values: Any,
) -> AsyncIterator[Rig]:
    """Everything from the handler down to a scripted metastore, closed afterwards;
    ``values`` are options (``upstream_max_connections=1``); ``removed``: methods the
    metastore answers ``UNKNOWN_METHOD`` (HMS 4.0.1's ``get_table``); ``per_user``: a
    cache kept per user (``--cache-per-user``); ``build``: the cache engine made from the
    options as the proxy makes it (``proxy.app.build_cache``: Redis with ``redis=URL``),
    its store closed afterwards."""
    # (Imported here, not at the top: tests.unit.helpers imports this module.)
    from tests.unit.helpers import NAMING, PLANNER

    opts = options(**values)
    metrics = Metrics()
    hms = ScriptedHMS(framed=opts.upstream_transport is Transport.FRAMED, removed=removed)
    pool = UpstreamPool(opts, metrics, opener=hms.open)
    store = store if store is not None else MemoryStore(1 << 24)
    engine = None
    if build is not None:
        engine = build(opts, metrics)
        store = engine.store  # type: ignore[assignment]  # (Redis's, with redis=URL)
    elif cache:
        engine = CacheEngine(
            store,
            Planner(NAMING, Ttls(), per_user=True) if per_user else PLANNER,
            metrics,
            l1_bytes=1 << 24,
            max_entry_bytes=opts.cache_max_entry_bytes,
            stale_window=stale_window,
        )
    audit = (
        AuditLog(opts.audit_log, opts.audit_log_max_bytes, opts.audit_log_backups)
        if opts.audit_log
        else None
    )
    handler = CallHandler(pool, metrics, engine, max_reply_bytes=opts.max_reply_bytes, audit=audit)
    try:
        yield Rig(hms, opts, metrics, pool, store, engine, handler)
    finally:
        if audit is not None:
            audit.close()
        await pool.close()
        await hms.close()
        if build is not None and engine is not None:
            await engine.store.close()
