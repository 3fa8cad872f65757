"""The warning that an unknown method flushed the cache: at most one line a minute, whatever
names clients send and however often (time injected, no sleeps)."""

from __future__ import annotations

from proxy.handler.writes import FlushWarnings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_flush_is_told_at_once() -> None:
    warnings = FlushWarnings(clock=Clock())
    assert warnings.line("frob_table") == (
        "unknown method frob_table may change metadata: the cache is flushed"
    )


def test_flushes_within_the_minute_are_counted_and_told_with_the_next_line() -> None:
    clock = Clock()
    warnings = FlushWarnings(interval=60.0, keep=3, clock=clock)
    assert warnings.line("frob_table") is not None
    for name in ("a", "b", "a", "c", "d"):
        clock.now += 10
        assert warnings.line(name) is None
    clock.now += 10.1  # 60.1 s after the first line
    assert warnings.line("e") == (
        "unknown method e may change metadata: the cache is flushed "
        "(5 more unknown calls flushed it since the last warning: a, b, c, ...)"
    )
    clock.now += 59
    assert warnings.line("f") is None
    clock.now += 1
    assert warnings.line("g") == (
        "unknown method g may change metadata: the cache is flushed "
        "(1 more unknown call flushed it since the last warning: f)"
    )


def test_what_is_kept_between_lines_is_bounded() -> None:
    clock = Clock()
    warnings = FlushWarnings(keep=3, clock=clock)
    warnings.line("first")
    for i in range(10_000):
        assert warnings.line(f"name_{i}" * 1000) is None
    assert len(warnings._names) == 3
    assert all(len(n) <= FlushWarnings.NAME_CHARS + 3 for n in warnings._names)
    clock.now += 60
    line = warnings.line("last")
    assert line is not None and "10000 more unknown calls" in line and len(line) < 500


def test_a_name_is_shown_printable_and_cut() -> None:
    warnings = FlushWarnings(clock=Clock())
    line = warnings.line("evil\nname")
    assert line is not None and "\n" not in line and "'evil\\nname'" in line
    line = FlushWarnings(clock=Clock()).line("x" * 500)
    assert line is not None and "x" * 80 + "..." in line and "x" * 81 not in line
