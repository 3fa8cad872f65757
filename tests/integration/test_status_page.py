"""The status page of a running proxy, as real headless Chromium renders it."""

from __future__ import annotations

import html.parser
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from proxy import idl
from tests.conftest import ProxyFactory
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample, client
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed (scripts/setup.sh installs Debian's chromium)")
    return found


def rendered(proxy: ProxyProcess, tmp_path: Path, shot: str | None = None) -> str:
    """The page's DOM after Chromium loaded and laid it out (and a screenshot, if asked)."""
    url = f"http://127.0.0.1:{proxy.metrics_port}/"
    common = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    common.append(f"--user-data-dir={tmp_path / 'chromium'}")
    if shot is not None:
        subprocess.run(
            [*common, f"--screenshot={tmp_path / shot}", "--window-size=1200,1400", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
        assert (tmp_path / shot).stat().st_size > 10_000  # a real picture, not a blank one
    done = subprocess.run(
        [*common, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


class Page(html.parser.HTMLParser):
    """Cards (title -> value) and tables (id -> rows of cell texts) of the rendered DOM."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.cards: dict[str, str] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self._card: str | None = None
        self._in_value = False
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div" and a.get("data-card"):
            self._card = a["data-card"]
        elif tag == "b" and self._card:
            self._in_value = True
            self.cards[self._card] = ""
        elif tag == "table":
            self._table = a.get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "b":
            self._in_value = False
        elif tag == "div":
            self._card = None
        elif tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._in_value and self._card:
            self.cards[self._card] += data
        if self._cell is not None:
            self._cell.append(data)

    def row(self, table: str, first: str) -> list[str]:
        rows = [r for r in self.tables.get(table, []) if r and r[0] == first]
        assert rows, f"no row {first!r} in {table}: {self.tables.get(table)}"
        return rows[0]


def get_table(proxy: ProxyProcess, sample: Sample, times: int) -> None:
    request = idl.encode_call("get_table", 1, dbname=sample.db, tbl_name=sample.table)
    for _ in range(times):
        raw.call("127.0.0.1", proxy.port, request)


def test_the_page_shows_the_live_figures_of_a_running_proxy(
    hms: MetastoreServer,
    own_redis: RedisServer,
    proxy_factory: ProxyFactory,
    sample: Sample,
    tmp_path: Path,
) -> None:
    proxy = proxy_factory("--redis", own_redis.url, "--status-show-names")  # a bare switch: on
    get_table(proxy, sample, 4)  # one miss, three hits
    with client("127.0.0.1", proxy.port) as c:  # a write through the proxy
        part = c.get_partition_by_name(sample.db, sample.table, sample.partition_name)
        c.alter_partition(sample.db, sample.table, part)

    page = Page(rendered(proxy, tmp_path, shot="status.png"))
    assert page.cards["Metastore"] == "up"
    assert page.cards["Cache store"] == "up"
    assert page.row("methods", "get_table")[1:] == ["4", "3", "75.0%"]
    # The table's look-ups: four get_table, and the writer's get_partition_by_name.
    assert page.row("tables", f"{sample.db}.{sample.table}")[1] == "5"
    # The write's own invalidation, one line (once the follower has seen its event, too).
    causes = [row[1:3] for row in page.tables["invalidations"][1:]]
    table = f"{sample.db}.{sample.table}"
    assert ["write", table] in causes or ["write (and its event)", table] in causes
    assert sum(1 for cause in causes if cause[1] == table) == 1

    get_table(proxy, sample, 6)  # the page follows: six more hits
    again = Page(rendered(proxy, tmp_path))
    assert again.row("methods", "get_table")[1:] == ["10", "9", "90.0%"]
    assert again.row("tables", f"{sample.db}.{sample.table}")[1:] == ["11", "81.8%"]

    own_redis.stop()  # the page says so (the proxy keeps answering from the HMS)
    # Hits kept in process may still be answered for a moment without a word to Redis: the
    # proxy knows once its invalidation stream's end, a failed command or its readiness
    # check (every 2 s) tells it.
    eventually(
        lambda: (get_table(proxy, sample, 1), not proxy.metric("hmsproxy_cache_available"))[1],
        what="the proxy to notice Redis is gone",
    )
    assert Page(rendered(proxy, tmp_path)).cards["Cache store"].startswith("DOWN")


def test_names_stay_off_the_page_and_the_metrics_unless_asked_for(
    hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample, tmp_path: Path
) -> None:
    proxy = proxy_factory()
    get_table(proxy, sample, 2)
    dom = rendered(proxy, tmp_path)
    page = Page(dom)
    assert page.tables["tables"][1][0].startswith("table#")
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics").read()
    for name in (sample.db, sample.table):
        assert name not in dom
        assert name.encode() not in scrape
