"""bench.timeline's layout of one call's timestamps (the benchmark itself needs a metastore
and is run by hand, see docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench.timeline import SPANS, STEPS, layout


def test_a_call_is_laid_out_from_its_eight_marks_and_others_are_left_out() -> None:
    at = [10.0, 11.0, 13.0, 16.0, 20.0, 25.0, 31.0, 38.0]
    times = [1.0, *at, 50.0, 51.0]  # a mark of something before, and a call cut short after
    tags = ["write", *STEPS, "request", "write"]
    rows = layout([(9.0, 33.0), (49.0, 60.0)], times, tags)
    assert len(rows) == 1  # (the second call's marks are not the eight)
    names = [name for name, _, _ in SPANS]
    assert len(set(names)) == len(names)
    spans = dict(zip(names, rows[0], strict=False))
    assert spans["the request's callback, before its write"] == 1.0
    assert spans["its write to the metastore"] == 2.0
    assert spans["the metastore (from the write to the reply's callback)"] == 7.0
    assert spans["its write to the client"] == 6.0
    sent_to_callback, write_to_last_byte, whole = rows[0][len(SPANS) :]
    assert (sent_to_callback, write_to_last_byte, whole) == (1.0, 2.0, 24.0)


@pytest.mark.parametrize("missing", range(len(STEPS)))
def test_a_call_missing_any_mark_is_left_out(missing: int) -> None:
    # (Eight marks all the same: the next call's first one follows.)
    times = [float(i) for i in range(1, len(STEPS) + 1)]
    tags = [tag for i, tag in enumerate(STEPS) if i != missing] + ["request"]
    assert layout([(0.5, 100.0)], times, tags) == []
