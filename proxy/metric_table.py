"""Every Prometheus metric the proxy exports, one declaration each; proxy.metrics builds them.

Naming follows https://prometheus.io/docs/practices/naming/: prefix ``hmsproxy_``, base
units, counters ending in ``_total``. Labels are bounded: ``method`` is a method of the
catalog or ``unknown`` (a client can send any name; it must not create series), and no
database, table or key ever becomes a label. Counters start at zero for every label value
they can take, so rates work from the first scrape, with one exception: the per-method
counters start at zero for all their outcomes when a method is first called (its error
rate then works from its first call), not for all ~220 methods at start-up, most of which
are never called: that was 2,500 series of zeros (200 KB) in every scrape. Latency
histograms likewise appear with a method's first call.

A metric's place in :data:`METRICS` is its place in the exposition.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from prometheus_client import Counter, Gauge, Histogram

from proxy import __version__, bridge, catalog
from proxy.loop_metrics import LoopCounter, LoopHistogram

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

OUTCOMES = ("ok", "user_error", "upstream_error", "internal_error", "client_gone", "refused")
UPSTREAM_OUTCOMES = ("ok", "timeout", "connection_error", "protocol_error", "reply_too_large")
LANE_KINDS = ("read", "write", "heavy")
# Why the proxy refused a call (see proxy.guard).
REFUSALS = ("partitions_per_call", "reply_too_large", "calls_rate", "partitions_rate")
LOOKUP_RESULTS = ("hit", "miss", "negative_hit", "bypass")
CACHE_OPERATIONS = ("connect", "get", "set", "delete", "version")
INVALIDATION_SCOPES = tuple(s.name.lower() for s in catalog.Scope if s.name)
INVALIDATION_REASONS = ("write", "notification", "admin", "ttl", "freshness")
LISTING_RESULTS = ("hit", "miss", "open")
LISTING_SOURCES = ("cache", "storage")
LOCK_FENCE_EVENTS = ("opened", "closed", "expired")
FRESHNESS_RESULTS = ("match", "mismatch", "unlogged", "changed", "undecided", "failed")
AUTH_MECHANISMS = ("gssapi", "digest-md5", "other")
AUTH_RESULTS = ("ok", "failed", "unsupported", "protocol", "timeout")
TOKEN_EVENTS = ("fetched", "fetch_failed", "refused")
CLIENT_ERRORS = ("protocol", "too_large", "timeout", "idle", "bad_message_type", "connection_limit")
HIVE_IDL_VERSION = "2.3.10+4.1"

Kind = type[Counter] | type[Gauge] | type[Histogram] | type[LoopCounter] | type[LoopHistogram]


class Wrap(Enum):
    """What the attribute of proxy.metrics.Metrics holds: the metric itself, or its children
    looked up once (``_Children``), or looked up once and started at zero per method on its
    first call (``_PerMethod``)."""

    PLAIN = "plain"
    CHILDREN = "children"
    PER_METHOD = "per_method"


@dataclass(frozen=True)
class MetricSpec:
    attr: str  # of proxy.metrics.Metrics
    kind: Kind
    name: str
    help: str
    labels: tuple[str, ...] = ()
    wrap: Wrap = Wrap.PLAIN
    buckets: tuple[float, ...] = ()
    # Per label, its values: every combination is a series from start-up, at ``value``.
    start: tuple[tuple[str, ...], ...] = ()
    value: float = 0.0
    # PER_METHOD: the second label's values, and the per-method metrics (attributes declared
    # before this one) that start along with a method's first call.
    outcomes: tuple[str, ...] = ()
    also: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Each of these would otherwise export something other than what the table says.
        histogram = self.kind in (Histogram, LoopHistogram)
        if histogram != bool(self.buckets):
            raise ValueError(f"{self.name}: buckets are for histograms, and histograms need them")
        if self.start and len(self.start) != len(self.labels):
            raise ValueError(f"{self.name}: start gives values for {len(self.start)} labels")
        if self.value and self.kind is not Gauge:
            raise ValueError(f"{self.name}: only a gauge starts at a value other than zero")
        per_method = self.wrap is Wrap.PER_METHOD
        if per_method != bool(self.outcomes) or (self.also and not per_method):
            raise ValueError(f"{self.name}: outcomes and also are for PER_METHOD, which needs them")
        if per_method and (len(self.labels) != 2 or self.labels[0] != "method"):
            raise ValueError(f"{self.name}: PER_METHOD is labelled (method, outcome)")
        if self.wrap is Wrap.CHILDREN and not self.labels:
            raise ValueError(f"{self.name}: CHILDREN of a metric without labels")


METRICS: tuple[MetricSpec, ...] = (
    # The hit path's metrics are the loop's plain numbers (see proxy.loop_metrics).
    MetricSpec(
        "requests",
        LoopCounter,
        "hmsproxy_requests",
        "Calls answered to clients, by method and outcome (user_error: a declared HMS "
        "exception such as NoSuchObjectException)",
        ("method", "outcome"),
        Wrap.PER_METHOD,
        outcomes=OUTCOMES,
    ),
    MetricSpec(
        "request_duration",
        LoopHistogram,
        "hmsproxy_request_duration_seconds",
        "Time from a complete request to the last byte of its reply, by where it came from",
        ("method", "source"),
        Wrap.CHILDREN,
        buckets=LATENCY_BUCKETS,
    ),
    MetricSpec(
        "stale_replies",
        Counter,
        "hmsproxy_stale_replies",
        "Cached replies served past their TTL because the metastore was unreachable "
        "(--stale-if-error)",
        ("method",),
        Wrap.CHILDREN,
    ),
    MetricSpec(
        "shared_reads",
        Counter,
        "hmsproxy_shared_reads",
        "Reads of something a write or a lock fenced, answered with the metastore's "
        "reply to a concurrent identical read (one metastore call for them all)",
        ("method",),
        Wrap.CHILDREN,
    ),
    MetricSpec(
        "cache_lookups",
        LoopCounter,
        "hmsproxy_cache_lookups",
        "Cache look-ups of cacheable reads, by result",
        ("method", "result"),
        Wrap.PER_METHOD,
        outcomes=LOOKUP_RESULTS,
        also=("stale_replies", "shared_reads"),
    ),
    MetricSpec(
        "hits_at_once",
        LoopCounter,
        "hmsproxy_cache_hits_at_once",
        "Cache hits answered by a fast path, with nothing awaited: from the client "
        "connection's socket callback, or by its session as soon as it read the request "
        "(docs/design.md); the other hits took the awaited path. The share falls when "
        "writes, locks and fills move what kept hits were judged under",
    ),
    MetricSpec(
        "forwarded_at_once",
        LoopCounter,
        "hmsproxy_calls_forwarded_at_once",
        "Calls only forwarded (with the cache on, neither cached reads nor writes) that were "
        "sent to the metastore at once, from the client connection's socket callback on an "
        "idle pooled connection, with no task (docs/design.md); the others took the awaited "
        "path",
        ("method",),
        Wrap.CHILDREN,
    ),
    MetricSpec(
        "cache_partitions",
        LoopCounter,
        "hmsproxy_cache_partitions",
        "Partitions asked for in get_partitions_by_names, by whether the cache had them "
        "(found or known to be absent)",
        ("result",),
        Wrap.CHILDREN,
        start=(("hit", "miss"),),
    ),
    MetricSpec(
        "cache_errors",
        Counter,
        "hmsproxy_cache_errors",
        "Cache operations that failed (the call was answered from the HMS)",
        ("operation",),
        Wrap.CHILDREN,
        start=(CACHE_OPERATIONS,),
    ),
    MetricSpec(
        "invalidations",
        Counter,
        "hmsproxy_invalidations",
        "Scopes invalidated, by scope and what caused it",
        ("scope", "reason"),
        Wrap.CHILDREN,
        start=(INVALIDATION_SCOPES, INVALIDATION_REASONS),
    ),
    MetricSpec(
        "cache_stored_bytes",
        Counter,
        "hmsproxy_cache_stored_bytes",
        "Bytes written to the cache (after compression)",
    ),
    # (Counted on the loop for every forwarded call, as the hit path's are.)
    MetricSpec(
        "upstream_requests",
        LoopCounter,
        "hmsproxy_upstream_requests",
        "Calls sent to the Hive Metastore, by outcome of the exchange",
        ("method", "outcome"),
        Wrap.PER_METHOD,
        outcomes=UPSTREAM_OUTCOMES,
    ),
    MetricSpec(
        "bridged_calls",
        Counter,
        "hmsproxy_bridged_calls",
        "Calls of methods the metastore removed (HMS 4.0.1's get_table, "
        "get_table_objects_by_name) sent to it as their _req form, by method",
        ("method",),
        Wrap.CHILDREN,
        start=(tuple(bridge.REPLACEMENTS),),
    ),
    MetricSpec(
        "upstream_duration",
        LoopHistogram,
        "hmsproxy_upstream_request_duration_seconds",
        "Time the Hive Metastore took to answer, to the last byte",
        ("method",),
        Wrap.CHILDREN,
        buckets=LATENCY_BUCKETS,
    ),
    MetricSpec(
        "upstream_connections",
        Gauge,
        "hmsproxy_upstream_connections",
        "Connections to the Hive Metastore, by state",
        ("state",),
        Wrap.CHILDREN,
        start=(("idle", "active"),),
    ),
    MetricSpec(
        "upstream_waiting",
        Gauge,
        "hmsproxy_upstream_waiting",
        "Calls waiting their turn for a metastore connection (at "
        "--upstream-max-connections, reads at their share of it, heavy reads at "
        "--heavy-max-concurrent), by kind",
        ("kind",),
        Wrap.CHILDREN,
        start=(LANE_KINDS,),
    ),
    MetricSpec(
        "upstream_wait",
        Histogram,
        "hmsproxy_upstream_wait_seconds",
        "Time calls that had to wait for a metastore connection waited for their turn, by "
        "kind (read, write, heavy) and user group (of --limits-file; default)",
        ("kind", "group"),
        Wrap.CHILDREN,
        buckets=(*LATENCY_BUCKETS, 60.0, 120.0, 300.0, 600.0),  # (up to the read timeout)
        start=(LANE_KINDS, ("default",)),
    ),
    MetricSpec(
        "heavy_in_flight",
        Gauge,
        "hmsproxy_heavy_calls_in_flight",
        "Heavy calls (over --heavy-partitions partitions) holding a metastore connection "
        "now; at most --heavy-max-concurrent",
    ),
    MetricSpec(
        "refused",
        Counter,
        "hmsproxy_refused_calls",
        "Calls the proxy answered with an error instead of sending them on (or instead of "
        "their too large reply), by reason and user group (of --limits-file; default)",
        ("reason", "group"),
        Wrap.CHILDREN,
        start=(REFUSALS, ("default",)),
    ),
    MetricSpec(
        "partition_counts",
        Counter,
        "hmsproxy_partition_count_queries",
        "Partition counts the proxy asked the metastore for (get_num_partitions_by_filter) "
        "to know a call's cost before sending it, by result",
        ("result",),
        Wrap.CHILDREN,
        start=(("ok", "failed"),),
    ),
    MetricSpec(
        "upstream_connects",
        Counter,
        "hmsproxy_upstream_connects",
        "Connection attempts to the Hive Metastore, by result",
        ("result",),
        Wrap.CHILDREN,
        start=(("ok", "failed"),),
    ),
    MetricSpec(
        "upstream_available",
        Gauge,
        "hmsproxy_upstream_available",
        "1 while the Hive Metastore answers the proxy's health probe (every 2 s), else 0",
        value=1,
    ),
    MetricSpec(
        "cache_available",
        Gauge,
        "hmsproxy_cache_available",
        "1 while the cache store (Redis) answers; 0: degraded, serving from the metastore",
        value=1,
    ),
    MetricSpec(
        "version_reads",
        LoopCounter,
        "hmsproxy_cache_version_reads",
        "Look-ups of the versions a reply depends on, by where they were read: local "
        "(the in-process copy Redis keeps coherent, --redis-tracking; no round trip) "
        "or redis",
        ("source",),
        Wrap.CHILDREN,
        start=(("local", "redis"),),
    ),
    MetricSpec(
        "redis_writes_taken",
        Gauge,
        "hmsproxy_redis_writes_taken",
        "1 while Redis takes this proxy's writes (a probe every 0.25 s) and hits may be read "
        "from it; 0 while it refuses them or does not answer (see --redis-write-trust)",
    ),
    MetricSpec(
        "tracking_up",
        Gauge,
        "hmsproxy_redis_tracking_up",
        "1 while every Redis invalidation stream is subscribed and delivered a beat within "
        "--redis-tracking-max-lag (hits may then read versions in process, while Redis also "
        "takes this proxy's writes: hmsproxy_redis_writes_taken); else 0",
    ),
    MetricSpec(
        "tracking_lag",
        Histogram,
        "hmsproxy_redis_tracking_delivery_seconds",
        "Time from setting a beat key to its invalidation arriving through the stream: "
        "how late a write through another proxy is seen here",
        # Sub-millisecond on one network; the bound (--redis-tracking-max-lag) is seconds.
        buckets=(0.0001, 0.00025, *(b for b in LATENCY_BUCKETS if b <= 2.5)),
    ),
    MetricSpec(
        "tracking_resyncs",
        Counter,
        "hmsproxy_redis_tracking_resyncs",
        "Invalidation streams lost or not opened (each forgets the in-process versions), by reason",
        ("reason",),
        Wrap.CHILDREN,
        start=(("stream_lost", "connect_failed"),),
    ),
    MetricSpec(
        "mirror_bytes",
        Gauge,
        "hmsproxy_redis_tracking_mirror_bytes",
        "Approximate bytes of versions held in process for --redis-tracking",
    ),
    MetricSpec(
        "notification_leader",
        Gauge,
        "hmsproxy_notification_leader",
        "1 if this proxy is the one following the notification log",
    ),
    MetricSpec(
        "notification_enabled",
        Gauge,
        "hmsproxy_notification_enabled",
        "1 if this proxy is set to follow the notification log (cache on, --notifications "
        "not off, and in auto mode the metastore serves the log)",
    ),
    MetricSpec(
        "notification_last_poll",
        Gauge,
        "hmsproxy_notification_last_poll_timestamp_seconds",
        "Unix time of this proxy's last successful poll of the log (or lease check, when "
        "another proxy follows)",
    ),
    MetricSpec(
        "notification_active",
        Gauge,
        "hmsproxy_notification_active",
        "1 while the notification log is followed and moving as writes happen; 0 when the "
        "metastore does not serve or write it (staleness then bounded by TTLs only)",
    ),
    MetricSpec(
        "notification_last_event",
        Gauge,
        "hmsproxy_notification_last_event_id",
        "Id of the last notification event applied",
    ),
    MetricSpec(
        "notification_lag_events",
        Gauge,
        "hmsproxy_notification_lag_events",
        "Events in the log not applied yet",
    ),
    MetricSpec(
        "notification_lag_seconds",
        Gauge,
        "hmsproxy_notification_lag_seconds",
        "Age of the oldest event not applied yet (0 when caught up)",
    ),
    # Its series are started by the follower, which knows the event types.
    MetricSpec(
        "notification_events",
        Counter,
        "hmsproxy_notification_events",
        "Notification events applied, by event type",
        ("type",),
        Wrap.CHILDREN,
    ),
    MetricSpec(
        "notification_gaps",
        Counter,
        "hmsproxy_notification_gaps",
        "Gaps found in the notification log (each answered with a flush)",
    ),
    MetricSpec(
        "lock_fences",
        Counter,
        "hmsproxy_lock_fences",
        "Fences of HMS locks (reads of what a lock names go to the metastore while it "
        "is held or waited for): opened by this proxy's lock calls, closed by this "
        "proxy (unlock, end of the lock's transaction, a refused lock, an alter or "
        "drop after the grant), or expired (a fence this proxy opened reached "
        "--lock-fence-seconds without being closed anywhere)",
        ("event",),
        Wrap.CHILDREN,
        start=(LOCK_FENCE_EVENTS,),
    ),
    MetricSpec(
        "lock_fences_active",
        Gauge,
        "hmsproxy_lock_fences_active",
        "Fences this proxy opened for HMS locks that are still in place",
    ),
    MetricSpec(
        "freshness_checks",
        Counter,
        "hmsproxy_freshness_checks",
        "Cache hits re-read from the metastore by the freshness check (--freshness-check-"
        "rate), by result: match; mismatch (the metastore answers otherwise, no write "
        "explains it, and the notification log, followed, would have shown one: a stale "
        "reply was served); unlogged (the same, but a write the log does not show: the "
        "log not followed, column statistics, privileges; expected within the TTL); "
        "changed (a write came in between: not judged); undecided (the notification "
        "follower or the store could not tell in time); failed (the metastore call failed)",
        ("result",),
        Wrap.CHILDREN,
        start=(FRESHNESS_RESULTS,),
    ),
    # By method, from a method's first mismatch (the log names each one's table).
    MetricSpec(
        "freshness_mismatches",
        Counter,
        "hmsproxy_freshness_mismatches",
        "Stale replies the freshness check found, by method",
        ("method",),
        Wrap.CHILDREN,
    ),
    MetricSpec(
        "client_connections",
        Gauge,
        "hmsproxy_client_connections",
        "Open client connections",
    ),
    MetricSpec(
        "client_errors",
        Counter,
        "hmsproxy_client_errors",
        "Client connections closed for bad input, by reason",
        ("reason",),
        Wrap.CHILDREN,
        start=(CLIENT_ERRORS,),
    ),
    MetricSpec(
        "listing_lookups",
        Counter,
        "hmsproxy_listing_lookups",
        "Partition directory listings asked for, by result (hit: a sealed partition's "
        "cached listing; miss: sealed, listed from storage; open: listed live, never "
        "cached)",
        ("result",),
        Wrap.CHILDREN,
        start=(LISTING_RESULTS,),
    ),
    MetricSpec(
        "listing_duration",
        Histogram,
        "hmsproxy_listing_duration_seconds",
        "Time to list one directory from storage, or to look up a request's cached "
        "listings (one round trip for all its partitions)",
        ("source",),
        Wrap.CHILDREN,
        buckets=LATENCY_BUCKETS,
        start=(LISTING_SOURCES,),
    ),
    MetricSpec(
        "listing_files",
        Counter,
        "hmsproxy_listing_files",
        "Files returned in listings, by where the listing came from",
        ("source",),
        Wrap.CHILDREN,
        start=(LISTING_SOURCES,),
    ),
    MetricSpec(
        "listing_stale_fills",
        Counter,
        "hmsproxy_listing_stale_fills",
        "Listings not cached because their partition changed while they were being made",
    ),
    MetricSpec(
        "client_auth",
        Counter,
        "hmsproxy_client_auth",
        "SASL negotiations with engines, by mechanism and result (failed: bad or "
        "expired ticket, wrong service, no common protection, a refused token; "
        "protocol: not SASL, e.g. a plain Thrift client on a SASL port)",
        ("mechanism", "result"),
        Wrap.CHILDREN,
        start=(AUTH_MECHANISMS, AUTH_RESULTS),
    ),
    MetricSpec(
        "upstream_auth",
        Counter,
        "hmsproxy_upstream_auth",
        "SASL negotiations with the metastore, by mechanism and result",
        ("mechanism", "result"),
        Wrap.CHILDREN,
        start=(AUTH_MECHANISMS, AUTH_RESULTS),
    ),
    MetricSpec(
        "kerberos_tokens",
        Counter,
        "hmsproxy_kerberos_tokens",
        "Delegation tokens the proxy fetched for its users (one per user and hour), "
        "fetches that failed, and tokens the metastore refused (it no longer knew "
        "them: fetched again)",
        ("event",),
        Wrap.CHILDREN,
        start=(TOKEN_EVENTS,),
    ),
    MetricSpec(
        "kerberos_login_expiry",
        Gauge,
        "hmsproxy_kerberos_login_expiry_timestamp_seconds",
        "When the proxy's keytab login (its TGT) expires; it logs in again before",
    ),
    MetricSpec(
        "build_info",
        Gauge,
        "hmsproxy_build_info",
        "Always 1; labels carry the version",
        ("version", "hive_idl_version"),
        start=((__version__,), (HIVE_IDL_VERSION,)),
        value=1,
    ),
)
