"""Every Prometheus metric the proxy exports, in one place.

Naming follows https://prometheus.io/docs/practices/naming/: prefix ``hmsproxy_``, base
units, counters ending in ``_total``. Labels are bounded: ``method`` is a method of the
catalog or ``unknown`` (a client can send any name; it must not create series), and no
database, table or key ever becomes a label. Counters start at zero for every label value
they can take, so rates work from the first scrape, with one exception: the per-method
counters start at zero for all their outcomes when a method is first called (its error
rate then works from its first call), not for all ~220 methods at start-up, most of which
are never called: that was 2,500 series of zeros (200 KB) in every scrape. Latency
histograms likewise appear with a method's first call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric

from proxy import __version__, bridge, catalog
from proxy.loop_metrics import LoopCounter, LoopHistogram
from proxy.memo import Footprint

# From a sub-millisecond cache hit to a miss that runs into the engines' 10 s read timeout.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

log = logging.getLogger(__name__)

UNKNOWN_METHOD = "unknown"

OUTCOMES = ("ok", "user_error", "upstream_error", "internal_error", "client_gone")
UPSTREAM_OUTCOMES = ("ok", "timeout", "connection_error", "protocol_error")
SOURCES = ("cache", "upstream")
LOOKUP_RESULTS = ("hit", "miss", "negative_hit", "bypass")
CACHE_OPERATIONS = ("connect", "get", "set", "delete", "version")
INVALIDATION_SCOPES = tuple(s.name.lower() for s in catalog.Scope if s.name)
INVALIDATION_REASONS = ("write", "notification", "admin", "ttl")
LISTING_RESULTS = ("hit", "miss", "open")
LISTING_SOURCES = ("cache", "storage")
LOCK_FENCE_EVENTS = ("opened", "closed", "expired")
AUTH_MECHANISMS = ("gssapi", "digest-md5", "other")
AUTH_RESULTS = ("ok", "failed", "unsupported", "protocol", "timeout")
TOKEN_EVENTS = ("fetched", "fetch_failed", "refused")
CLIENT_ERRORS = ("protocol", "too_large", "timeout", "idle", "bad_message_type", "connection_limit")


class _Children:
    """A labelled metric whose children are looked up once: ``labels()`` costs microseconds
    on every call, and the hit path calls it several times. Label values are bounded (see
    above), so the memo is too."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class _PerMethod(_Children):
    """Children by (method, value): the first time a method is seen, every value of the
    second label starts at zero for it, so that its outcome ratios and error rates are
    right from its first call without series for methods nobody calls."""

    __slots__ = ("_seen", "also", "values")

    def __init__(self, metric: Any, values: Iterable[str], also: Iterable[_Children] = ()) -> None:
        super().__init__(metric)
        self.values = tuple(values)
        self.also = tuple(also)  # per-method metrics that start at zero along with this one
        self._seen: set[str] = set()

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            method = values[0]
            if method not in self._seen:
                self._seen.add(method)
                for value in self.values:
                    super().labels(method, value)
                for other in self.also:
                    other.labels(method)
            child = super().labels(*values)
        return child


class _Memos:
    """``hmsproxy_memo_bytes`` and ``hmsproxy_memo_entries``: read from each memo when
    scraped (in the scrape's worker thread: each footprint reads a few ints), so the request
    path pays nothing for them."""

    def __init__(self) -> None:
        self.footprints: dict[str, Footprint] = {}

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> list[Metric]:
        size, count = self._families()
        for name, footprint in sorted(self.footprints.items()):
            entries, nbytes = footprint()
            size.add_metric([name], nbytes)
            count.add_metric([name], entries)
        return [size, count]

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "hmsproxy_memo_bytes",
                "Bytes the proxy keeps in process, by memo or cache, as each counts them",
                labels=["memo"],
            ),
            GaugeMetricFamily(
                "hmsproxy_memo_entries",
                "Entries the proxy keeps in process, by memo or cache",
                labels=["memo"],
            ),
        )


def method_label(name: str) -> str:
    """``name`` if the catalog knows it, else ``unknown``: labels stay bounded."""
    return name if catalog.lookup(name) is not None else UNKNOWN_METHOD


class Metrics:
    """The proxy's metrics, registered in ``registry`` (a fresh one per test)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # ``*_created`` series double the exposition and no dashboard here uses them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # The hit path's metrics are the loop's plain numbers (see proxy.loop_metrics).
        self.requests = _PerMethod(
            LoopCounter(
                "hmsproxy_requests",
                "Calls answered to clients, by method and outcome (user_error: a declared HMS "
                "exception such as NoSuchObjectException)",
                ["method", "outcome"],
                registry=r,
            ),
            OUTCOMES,
        )
        self.request_duration = _Children(
            LoopHistogram(
                "hmsproxy_request_duration_seconds",
                "Time from a complete request to the last byte of its reply, by where it came from",
                ["method", "source"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.stale_replies = _Children(
            Counter(
                "hmsproxy_stale_replies",
                "Cached replies served past their TTL because the metastore was unreachable "
                "(--stale-if-error)",
                ["method"],
                registry=r,
            )
        )
        self.shared_reads = _Children(
            Counter(
                "hmsproxy_shared_reads",
                "Reads of something a write or a lock fenced, answered with the metastore's "
                "reply to a concurrent identical read (one metastore call for them all)",
                ["method"],
                registry=r,
            )
        )
        self.cache_lookups = _PerMethod(
            LoopCounter(
                "hmsproxy_cache_lookups",
                "Cache look-ups of cacheable reads, by result",
                ["method", "result"],
                registry=r,
            ),
            LOOKUP_RESULTS,
            also=(self.stale_replies, self.shared_reads),
        )
        self.cache_partitions = _Children(
            LoopCounter(
                "hmsproxy_cache_partitions",
                "Partitions asked for in get_partitions_by_names, by whether the cache had them "
                "(found or known to be absent)",
                ["result"],
                registry=r,
            )
        )
        self.cache_errors = _Children(
            Counter(
                "hmsproxy_cache_errors",
                "Cache operations that failed (the call was answered from the HMS)",
                ["operation"],
                registry=r,
            )
        )
        self.invalidations = _Children(
            Counter(
                "hmsproxy_invalidations",
                "Scopes invalidated, by scope and what caused it",
                ["scope", "reason"],
                registry=r,
            )
        )
        self.cache_stored_bytes = Counter(
            "hmsproxy_cache_stored_bytes",
            "Bytes written to the cache (after compression)",
            registry=r,
        )
        # (Counted on the loop for every forwarded call, as the hit path's are.)
        self.upstream_requests = _PerMethod(
            LoopCounter(
                "hmsproxy_upstream_requests",
                "Calls sent to the Hive Metastore, by outcome of the exchange",
                ["method", "outcome"],
                registry=r,
            ),
            UPSTREAM_OUTCOMES,
        )
        self.bridged_calls = _Children(
            Counter(
                "hmsproxy_bridged_calls",
                "Calls of methods the metastore removed (HMS 4.0.1's get_table, "
                "get_table_objects_by_name) sent to it as their _req form, by method",
                ["method"],
                registry=r,
            )
        )
        for name in bridge.REPLACEMENTS:
            self.bridged_calls.labels(name)
        self.upstream_duration = _Children(
            LoopHistogram(
                "hmsproxy_upstream_request_duration_seconds",
                "Time the Hive Metastore took to answer, to the last byte",
                ["method"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.upstream_connections = _Children(
            Gauge(
                "hmsproxy_upstream_connections",
                "Connections to the Hive Metastore, by state",
                ["state"],
                registry=r,
            )
        )
        self.upstream_waiting = _Children(
            Gauge(
                "hmsproxy_upstream_waiting",
                "Calls waiting their turn for a metastore connection (at "
                "--upstream-max-connections, or reads at their share of it), by kind",
                ["kind"],
                registry=r,
            )
        )
        self.upstream_wait = Histogram(
            "hmsproxy_upstream_wait_seconds",
            "Time calls that had to wait for a metastore connection waited for their turn",
            buckets=(*LATENCY_BUCKETS, 60.0, 120.0, 300.0, 600.0),  # (up to the read timeout)
            registry=r,
        )
        self.upstream_connects = _Children(
            Counter(
                "hmsproxy_upstream_connects",
                "Connection attempts to the Hive Metastore, by result",
                ["result"],
                registry=r,
            )
        )
        self.upstream_available = Gauge(
            "hmsproxy_upstream_available",
            "1 while the Hive Metastore answers the proxy's health probe (every 2 s), else 0",
            registry=r,
        )
        self.upstream_available.set(1)
        self.cache_available = Gauge(
            "hmsproxy_cache_available",
            "1 while the cache store (Redis) answers; 0: degraded, serving from the metastore",
            registry=r,
        )
        self.cache_available.set(1)
        self.version_reads = _Children(
            LoopCounter(
                "hmsproxy_cache_version_reads",
                "Look-ups of the versions a reply depends on, by where they were read: local "
                "(the in-process copy Redis keeps coherent, --redis-tracking; no round trip) "
                "or redis",
                ["source"],
                registry=r,
            )
        )
        for source in ("local", "redis"):
            self.version_reads.labels(source)
        self.tracking_up = Gauge(
            "hmsproxy_redis_tracking_up",
            "1 while every Redis invalidation stream is subscribed and delivered a beat within "
            "--redis-tracking-max-lag (hits may then read versions in process); else 0",
            registry=r,
        )
        self.tracking_lag = Histogram(
            "hmsproxy_redis_tracking_delivery_seconds",
            "Time from setting a beat key to its invalidation arriving through the stream: "
            "how late a write through another proxy is seen here",
            # Sub-millisecond on one network; the bound (--redis-tracking-max-lag) is seconds.
            buckets=(0.0001, 0.00025, *(b for b in LATENCY_BUCKETS if b <= 2.5)),
            registry=r,
        )
        self.tracking_resyncs = _Children(
            Counter(
                "hmsproxy_redis_tracking_resyncs",
                "Invalidation streams lost or not opened (each forgets the in-process "
                "versions), by reason",
                ["reason"],
                registry=r,
            )
        )
        for reason in ("stream_lost", "connect_failed"):
            self.tracking_resyncs.labels(reason)
        self.mirror_bytes = Gauge(
            "hmsproxy_redis_tracking_mirror_bytes",
            "Approximate bytes of versions held in process for --redis-tracking",
            registry=r,
        )
        self.notification_leader = Gauge(
            "hmsproxy_notification_leader",
            "1 if this proxy is the one following the notification log",
            registry=r,
        )
        self.notification_enabled = Gauge(
            "hmsproxy_notification_enabled",
            "1 if this proxy is set to follow the notification log (cache on, --notifications "
            "not off, and in auto mode the metastore serves the log)",
            registry=r,
        )
        self.notification_last_poll = Gauge(
            "hmsproxy_notification_last_poll_timestamp_seconds",
            "Unix time of this proxy's last successful poll of the log (or lease check, when "
            "another proxy follows)",
            registry=r,
        )
        self.notification_active = Gauge(
            "hmsproxy_notification_active",
            "1 while the notification log is followed and moving as writes happen; 0 when the "
            "metastore does not serve or write it (staleness then bounded by TTLs only)",
            registry=r,
        )
        self.notification_last_event = Gauge(
            "hmsproxy_notification_last_event_id",
            "Id of the last notification event applied",
            registry=r,
        )
        self.notification_lag_events = Gauge(
            "hmsproxy_notification_lag_events",
            "Events in the log not applied yet",
            registry=r,
        )
        self.notification_lag_seconds = Gauge(
            "hmsproxy_notification_lag_seconds",
            "Age of the oldest event not applied yet (0 when caught up)",
            registry=r,
        )
        self.notification_events = _Children(
            Counter(
                "hmsproxy_notification_events",
                "Notification events applied, by event type",
                ["type"],
                registry=r,
            )
        )
        self.notification_gaps = Counter(
            "hmsproxy_notification_gaps",
            "Gaps found in the notification log (each answered with a flush)",
            registry=r,
        )
        self.lock_fences = _Children(
            Counter(
                "hmsproxy_lock_fences",
                "Fences of HMS locks (reads of what a lock names go to the metastore while it "
                "is held or waited for): opened by this proxy's lock calls, closed by this "
                "proxy (unlock, end of the lock's transaction, a refused lock, an alter or "
                "drop after the grant), or expired (a fence this proxy opened reached "
                "--lock-fence-seconds without being closed anywhere)",
                ["event"],
                registry=r,
            )
        )
        self.lock_fences_active = Gauge(
            "hmsproxy_lock_fences_active",
            "Fences this proxy opened for HMS locks that are still in place",
            registry=r,
        )
        self.client_connections = Gauge(
            "hmsproxy_client_connections", "Open client connections", registry=r
        )
        self.client_errors = _Children(
            Counter(
                "hmsproxy_client_errors",
                "Client connections closed for bad input, by reason",
                ["reason"],
                registry=r,
            )
        )
        self.listing_lookups = _Children(
            Counter(
                "hmsproxy_listing_lookups",
                "Partition directory listings asked for, by result (hit: a sealed partition's "
                "cached listing; miss: sealed, listed from storage; open: listed live, never "
                "cached)",
                ["result"],
                registry=r,
            )
        )
        self.listing_duration = _Children(
            Histogram(
                "hmsproxy_listing_duration_seconds",
                "Time to list one directory from storage, or to look up a request's cached "
                "listings (one round trip for all its partitions)",
                ["source"],
                buckets=LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.listing_files = _Children(
            Counter(
                "hmsproxy_listing_files",
                "Files returned in listings, by where the listing came from",
                ["source"],
                registry=r,
            )
        )
        self.listing_stale_fills = Counter(
            "hmsproxy_listing_stale_fills",
            "Listings not cached because their partition changed while they were being made",
            registry=r,
        )
        self.client_auth = _Children(
            Counter(
                "hmsproxy_client_auth",
                "SASL negotiations with engines, by mechanism and result (failed: bad or "
                "expired ticket, wrong service, no common protection, a refused token; "
                "protocol: not SASL, e.g. a plain Thrift client on a SASL port)",
                ["mechanism", "result"],
                registry=r,
            )
        )
        self.upstream_auth = _Children(
            Counter(
                "hmsproxy_upstream_auth",
                "SASL negotiations with the metastore, by mechanism and result",
                ["mechanism", "result"],
                registry=r,
            )
        )
        self.kerberos_tokens = _Children(
            Counter(
                "hmsproxy_kerberos_tokens",
                "Delegation tokens the proxy fetched for its users (one per user and hour), "
                "fetches that failed, and tokens the metastore refused (it no longer knew "
                "them: fetched again)",
                ["event"],
                registry=r,
            )
        )
        self.kerberos_login_expiry = Gauge(
            "hmsproxy_kerberos_login_expiry_timestamp_seconds",
            "When the proxy's keytab login (its TGT) expires; it logs in again before",
            registry=r,
        )
        self.build_info = Gauge(
            "hmsproxy_build_info",
            "Always 1; labels carry the version",
            ["version", "hive_idl_version"],
            registry=r,
        )
        self.build_info.labels(__version__, "2.3.10+4.1").set(1)
        self._memos = _Memos()
        r.register(self._memos)
        self._settlers: list[Callable[[], None]] = []
        self._start_at_zero()

    def settle_with(self, settle: Callable[[], None]) -> None:
        """Have :meth:`settle` call ``settle``: it counts what was answered but not counted
        yet (the calls a connection answered again, see proxy.handler.again)."""
        self._settlers.append(settle)

    def settle(self) -> None:
        """Count everything answered before now (on the event loop, before a scrape)."""
        for settle in self._settlers:
            try:
                settle()
            except Exception:  # (a bug: the scrape goes on, without those counts)
                log.exception("counting what was answered before a scrape")

    def watch_memos(self, footprints: Mapping[str, Footprint]) -> None:
        """Report these memos (name: their footprint) in hmsproxy_memo_bytes/_entries."""
        self._memos.footprints.update(footprints)

    def _start_at_zero(self) -> None:
        """The series without a method label (per-method ones: see _PerMethod)."""
        for result in ("hit", "miss"):
            self.cache_partitions.labels(result)
        for op in CACHE_OPERATIONS:
            self.cache_errors.labels(op)
        for scope in INVALIDATION_SCOPES:
            for reason in INVALIDATION_REASONS:
                self.invalidations.labels(scope, reason)
        for state in ("idle", "active"):
            self.upstream_connections.labels(state)
        for result in ("ok", "failed"):
            self.upstream_connects.labels(result)
        for kind in ("read", "write"):
            self.upstream_waiting.labels(kind)
        for reason in CLIENT_ERRORS:
            self.client_errors.labels(reason)
        for event in LOCK_FENCE_EVENTS:
            self.lock_fences.labels(event)
        for result in LISTING_RESULTS:
            self.listing_lookups.labels(result)
        for source in LISTING_SOURCES:
            self.listing_files.labels(source)
            self.listing_duration.labels(source)
        for mechanism in AUTH_MECHANISMS:
            for result in AUTH_RESULTS:
                self.client_auth.labels(mechanism, result)
                self.upstream_auth.labels(mechanism, result)
        for event in TOKEN_EVENTS:
            self.kerberos_tokens.labels(event)
        # notification_events' series are started by the follower, which knows the kinds.
