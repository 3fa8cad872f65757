"""The proxy's Prometheus metrics, built from their declarations in :mod:`proxy.metric_table`
(naming, labels, which series start at zero and why: see there)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from itertools import product
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric

from proxy import catalog
from proxy.loop_metrics import LoopCounter, LoopHistogram
from proxy.memo import Footprint
from proxy.metric_table import METRICS, MetricSpec, Wrap

log = logging.getLogger(__name__)

UNKNOWN_METHOD = "unknown"


class _Children:
    """A labelled metric whose children are looked up once: ``labels()`` costs microseconds
    on every call, and the hit path calls it several times. Label values are bounded (see
    proxy.metric_table), so the memo is too."""

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


def _build(spec: MetricSpec, registry: CollectorRegistry, built: Mapping[str, Any]) -> Any:
    kind, labels = spec.kind, spec.labels
    if issubclass(kind, (Histogram, LoopHistogram)):
        metric: Any = kind(spec.name, spec.help, labels, registry=registry, buckets=spec.buckets)
    else:
        metric = kind(spec.name, spec.help, labels, registry=registry)
    wrapped: Any = metric
    if spec.wrap is Wrap.CHILDREN:
        wrapped = _Children(metric)
    elif spec.wrap is Wrap.PER_METHOD:
        also = [built[name] for name in spec.also]
        wrapped = _PerMethod(metric, spec.outcomes, also=also)
    if spec.start:  # (product() of no labels would be the one series of an unlabelled metric)
        for values in product(*spec.start):
            child = wrapped.labels(*values)
            if spec.value:
                child.set(spec.value)
    elif spec.value:
        metric.set(spec.value)
    return wrapped


class Metrics:
    """The proxy's metrics, registered in ``registry`` (a fresh one per test).

    One attribute per entry of :data:`proxy.metric_table.METRICS`, declared here so that
    its type is known to callers (tests/unit/test_metrics.py holds the two together)."""

    requests: _PerMethod
    request_duration: _Children
    stale_replies: _Children
    shared_reads: _Children
    cache_lookups: _PerMethod
    hits_at_once: LoopCounter
    forwarded_at_once: _Children
    cache_partitions: _Children
    cache_errors: _Children
    invalidations: _Children
    cache_stored_bytes: Counter
    upstream_requests: _PerMethod
    bridged_calls: _Children
    upstream_duration: _Children
    upstream_connections: _Children
    upstream_waiting: _Children
    upstream_wait: _Children
    heavy_in_flight: Gauge
    refused: _Children
    partition_counts: _Children
    upstream_connects: _Children
    upstream_available: Gauge
    cache_available: Gauge
    version_reads: _Children
    redis_writes_taken: Gauge
    tracking_up: Gauge
    tracking_lag: Histogram
    tracking_resyncs: _Children
    mirror_bytes: Gauge
    notification_leader: Gauge
    notification_enabled: Gauge
    notification_last_poll: Gauge
    notification_active: Gauge
    notification_last_event: Gauge
    notification_lag_events: Gauge
    notification_lag_seconds: Gauge
    notification_events: _Children
    notification_gaps: Counter
    lock_fences: _Children
    lock_fences_active: Gauge
    freshness_checks: _Children
    freshness_mismatches: _Children
    client_connections: Gauge
    client_errors: _Children
    listing_lookups: _Children
    listing_duration: _Children
    listing_files: _Children
    listing_stale_fills: Counter
    client_auth: _Children
    upstream_auth: _Children
    kerberos_tokens: _Children
    kerberos_login_expiry: Gauge
    build_info: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # ``*_created`` series double the exposition and no dashboard here uses them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        built: dict[str, Any] = {}
        for spec in METRICS:
            built[spec.attr] = _build(spec, self.registry, built)
        # Typed by the class's annotations, which tests/unit/test_metrics.py holds to METRICS.
        vars(self).update(built)
        self._memos = _Memos()
        self.registry.register(self._memos)
        self._settlers: list[Callable[[], None]] = []

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
