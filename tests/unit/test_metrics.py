"""proxy.metric_table and the attributes of proxy.metrics.Metrics agree: mypy checks callers
against the annotations, Metrics() builds from the table."""

from __future__ import annotations

from typing import get_type_hints

from prometheus_client import CollectorRegistry

from proxy import metrics
from proxy.metric_table import METRICS, Wrap
from proxy.metrics import Metrics

WRAPPERS = {Wrap.CHILDREN: metrics._Children, Wrap.PER_METHOD: metrics._PerMethod}


def test_every_metric_is_declared_once() -> None:
    assert len({spec.attr for spec in METRICS}) == len(METRICS)
    assert len({spec.name for spec in METRICS}) == len(METRICS)


def test_the_annotations_are_the_table() -> None:
    hints = get_type_hints(Metrics)
    assert list(hints) == [spec.attr for spec in METRICS]
    for spec in METRICS:
        assert hints[spec.attr] is WRAPPERS.get(spec.wrap, spec.kind), spec.attr


def test_metrics_hold_what_the_annotations_say() -> None:
    built = Metrics(CollectorRegistry())
    hints = get_type_hints(Metrics)
    for spec in METRICS:
        value = getattr(built, spec.attr)
        assert type(value) is hints[spec.attr], spec.attr
        metric = value.metric if isinstance(value, metrics._Children) else value
        assert type(metric) is spec.kind, spec.attr


def test_per_method_metrics_start_those_declared_before_them() -> None:
    declared: dict[str, Wrap] = {}
    for spec in METRICS:
        for other in spec.also:
            assert declared.get(other) is Wrap.CHILDREN, (spec.attr, other)
            assert next(s for s in METRICS if s.attr == other).labels == ("method",), other
        declared[spec.attr] = spec.wrap
