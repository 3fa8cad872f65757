"""The status page's own bookkeeping (bounded, names hidden unless asked) and its HTML."""

from __future__ import annotations

import html.parser

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.cache.keys import TableRef
from proxy.metrics import Metrics
from proxy.status import Activity, render


def test_busiest_tables_stay_bounded_and_keep_the_heavy_hitters() -> None:
    activity = Activity(show_names=True, capacity=10)
    heavy = TableRef.of("db", "heavy")
    for i in range(3_000):
        activity.looked_up(TableRef.of("db", f"once_{i}"), hit=False)
        if i % 2 == 0:
            activity.looked_up(heavy, hit=True)  # a third of all look-ups
    assert len(activity._tables) == 10
    name, lookups, hits = activity.busiest(1)[0]
    assert name == "db.heavy"
    assert lookups >= 1_500  # space saving: counts may only be overestimated
    assert 0 < hits <= 1_500  # hits count from when the table last entered the list


def test_tables_of_one_name_in_two_catalogs_have_rows_of_their_own() -> None:
    """Their versions are shared (proxy.cache.keys), their rows are not."""
    activity = Activity(show_names=True)
    activity.looked_up(TableRef.of("db", "t"), hit=True)
    activity.looked_up(TableRef.of("@spark#db", "t"), hit=False)
    activity.looked_up(TableRef.of("@hive#db", "t"), hit=False)
    assert sorted(activity.busiest(5)) == [("db.t", 2, 1), ("spark.db.t", 1, 0)]


@settings(max_examples=100)
@given(st.lists(st.integers(0, 40), max_size=400), st.integers(1, 12))
def test_space_saving_never_misses_a_table_above_the_error_bound(
    stream: list[int], capacity: int
) -> None:
    activity = Activity(show_names=True, capacity=capacity)
    truth: dict[str, int] = {}
    for n in stream:
        activity.looked_up(TableRef.of("db", f"t{n}"), hit=False)
        truth[f"db.t{n}"] = truth.get(f"db.t{n}", 0) + 1
    shown = {name: count for name, count, _ in activity.busiest(capacity)}
    bound = len(stream) / capacity  # the classic space-saving guarantee
    for name, count in truth.items():
        if count > bound:
            assert name in shown
        if name in shown:
            assert shown[name] >= count


def test_names_are_hashed_unless_asked_for() -> None:
    hidden = Activity(show_names=False)
    table = TableRef.of("secret_db", "salaries")
    hidden.looked_up(table, hit=True)
    hidden.invalidated("write", ["table"], [table], everything=False)
    page = render(Metrics(), hidden, {"upstreams": ["thrift://hms:9083"], "store": "off"})
    assert b"salaries" not in page and b"secret_db" not in page
    assert hidden.name(table).encode() in page
    shown = Activity(show_names=True)
    shown.looked_up(table, hit=True)
    assert b"secret_db.salaries" in render(Metrics(), shown, {"store": "off"})


class _Checker(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("src", "href") and value and "://" in value:
                self.external.append(value)
        if tag not in ("meta", "br", "link", "img", "input"):
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, (self.open, tag)
        self.open.pop()


def test_the_page_is_well_formed_and_self_contained() -> None:
    activity = Activity(show_names=True)
    activity.invalidated("notification", [], [], everything=True)
    page = render(Metrics(), activity, {"upstreams": [], "store": "Redis (auto)"}).decode()
    checker = _Checker()
    checker.feed(page)
    assert checker.open == [] and checker.external == []
    assert "<script" not in page
    assert "everything" in page


def test_hashed_names_are_keyed_so_a_dictionary_cannot_reverse_them() -> None:
    table = TableRef.of("hr", "salaries")
    one, same, other = (Activity(False, secret=k) for k in (b"a" * 32, b"a" * 32, b"b" * 32))
    assert one.name(table) == same.name(table)  # one deployment's proxies agree
    assert one.name(table) != other.name(table)
    # The old unsalted 32-bit hash was the table's tag: anyone could compute it.
    assert table.tag[2:10] not in one.name(table)
    assert len(one.name(table)) == len("table#") + 12


def test_what_a_client_names_stays_bounded_on_the_page() -> None:
    activity = Activity(show_names=True, capacity=50)
    for i in range(2_000):
        activity.looked_up(TableRef.of("db", f"{i}" + "x" * 100_000), hit=False)
    assert sum(len(n) for n in activity._shown.values()) <= 50 * 200
    many = [TableRef.of("db", f"t{i}") for i in range(5_000)]
    activity.invalidated("write", ["table"], many, everything=False)
    line = activity.recent[0]
    assert len(line.tables) == 10 and line.more == 4_990


def test_a_write_and_its_own_event_are_one_line() -> None:
    activity = Activity(show_names=True)
    table = TableRef.of("db", "t")
    activity.invalidated("write", ["table"], [table], everything=False)
    activity.invalidated("notification", ["table", "statistics"], [table], everything=False)
    assert len(activity.recent) == 1
    assert activity.recent[0].reason == "write (and its event)"
    activity.invalidated("notification", ["table"], [TableRef.of("db", "u")], everything=False)
    assert len(activity.recent) == 2  # another table's event: its own line


def test_the_page_counts_every_call_answered_before_it() -> None:
    # Calls a connection answered again are counted later (proxy.handler.again): the page
    # is taken after Metrics.settle has counted them, as a scrape is.
    import asyncio

    from proxy.app import Proxy
    from proxy.config import load

    async def run() -> None:
        metrics = Metrics()
        proxy = Proxy.build(load({"upstream": "thrift://h:1"}, {}), metrics)
        assert proxy.cache is not None and isinstance(proxy.cache.hits.seen, Activity)
        activity = proxy.cache.hits.seen
        table = TableRef.of("db", "counted_when_settled")
        metrics.settle_with(lambda: activity.looked_up(table, hit=True, times=3))
        assert proxy.http.status is not None
        page = proxy.http.status()()  # (taken on the loop, rendered off it)
        assert activity.name(table).encode() in page  # settled before the page was taken

    asyncio.run(run())
