"""Names spelled oddly, at the real metastore (issue 39): every cached read, with its database,
table and partition names spelled as a client may spell them, through the proxy gets what
the metastore itself answers, before and after writes through the proxy.

The metastore (HMS 2.3.10 on Derby) trims and lower-cases database and table names, and
Derby compares partition names ignoring trailing blanks. For each spelling (blanks on either
side, tabs and NULs, upper case, Unicode whose lower case is ASCII (U+212A KELVIN SIGN) or is
not ('İ'), look-alike letters, escapes Hive does not write) and each cached read whose
request it changes, the read is made straight at the metastore and twice through the proxy
(the second would be a hit), and the replies compared: byte for byte, or as Thrift values
where the metastore itself orders a parameter map differently. Then writes through the
proxy (the canonical spelling; then odd spellings; then a partition named with a trailing
blank, which Derby matches to the partition without it), and every read again: through the
proxy first, so that anything cached and stale would show. The notification log is off, so
only the proxy's own invalidation keeps it fresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from hmsclient.genthrift.hive_metastore import ttypes as t

from proxy import catalog
from tests.conftest import ProxyFactory
from tests.rig import calls, raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import (
    DAYS,
    Sample,
    client,
    create,
    partition,
    storage_descriptor,
    table,
)

pytestmark = pytest.mark.hms

DB = "odd_names"
KELVIN = "\u212a"  # Java and Python lower-case it to an ASCII 'k': the table k below
CYRILLIC_E = "\u0435"

NameSpelling = Callable[[str], str]
NAMES: dict[str, NameSpelling] = {
    "upper case": str.upper,
    "trailing blank": lambda n: n + " ",
    "leading blank": lambda n: " " + n,
    "newline, title case": lambda n: "\r\n" + n.title() + "\t",
    "NUL": lambda n: n + "\x00",
    "dotted capital I": lambda n: n.upper() + "\u0130",
    "look-alike letter": lambda n: n.replace("e", CYRILLIC_E).replace("a", "\u0430"),
    "escape": lambda n: n.replace("_", "%5F") if "_" in n else n + "%20",
}
# The partition spelled oddly: one the canonical spelling's by-names request does not ask
# for, so that the first spelling's request finds it and its twin both missing.
PART = Sample().partition_names[-1]  # ds=2024-01-03/region=us
PartSpelling = tuple[str, str]  # (the name's region part, the value's)
PARTS: dict[str, PartSpelling] = {
    "trailing blank": ("us ", "us "),
    "leading blank": (" us", " us"),
    "tab": ("us\t", "us\t"),
    "upper case": ("US", "US"),
    "escape Hive does not write": ("%75s", "%75s"),
    "escaped blank": ("us%20", "us%20"),
    "beyond ASCII": ("\u00fas", "\uff55s"),  # (latin1's, and a fullwidth one)
}


def variants(s: Sample) -> dict[str, Sample]:
    out = {"as written": s}
    for label, spell in NAMES.items():
        out[f"database, {label}"] = replace(s, db=spell(s.db))
        out[f"table, {label}"] = replace(s, table=spell(s.table), unpartitioned=spell("dim"))
    out["table, KELVIN SIGN"] = replace(s, table=KELVIN, unpartitioned=KELVIN)
    out["database, catalog prefix"] = replace(s, db=f"@hive#{s.db}")  # (2.3: no catalogs)
    for label, (in_name, value) in PARTS.items():
        name = PART.removesuffix("us") + in_name
        spelled = replace(s, partition_values=(DAYS[2], value), partition_name=name)
        # With the name as written beside it, then alone (in this order: what the first
        # fills must not answer the second).
        out[f"partition, {label}"] = replace(spelled, partition_names=(name, PART))
        out[f"partition, {label}, alone"] = replace(spelled, partition_names=(name,))
    return out


@pytest.fixture
def odd_sample(hms: MetastoreServer) -> Iterator[Sample]:
    """The sample objects in a database of their own (written to here), and a table k."""
    with client(hms.host, hms.port) as c:
        if DB in c.get_all_databases():
            c.drop_database(DB, True, True)
    made = create(hms.host, hms.port, hms.warehouse.as_uri(), db=DB)
    with client(hms.host, hms.port) as c:
        c.create_table(table(DB, "k", storage_descriptor(None)))
    yield made
    with client(hms.host, hms.port) as c:
        c.drop_database(DB, True, True)


def cached_reads() -> list[str]:
    return [m for m in calls.reads() if catalog.lookup(m).kind is catalog.Kind.CACHEABLE_READ]


Check = tuple[str, str, bytes]  # (the spelling's label, the method, the request)


def checks(sample: Sample) -> list[Check]:
    """Each cached read in each spelling, where the spelling changes its request."""
    out: list[Check] = []
    for seqid, method in enumerate(cached_reads(), 100):
        canonical = calls.read_request(method, seqid, sample, missing=False)
        seen = set()
        for label, spelled in variants(sample).items():
            request = calls.read_request(method, seqid, spelled, missing=False)
            if request in seen or (label != "as written" and request == canonical):
                continue
            seen.add(request)
            out.append((label, method, request))
    return out


class Caller:
    """Raw calls on one connection to each side, opened again where the server hung up."""

    def __init__(self, port: int, hms: MetastoreServer) -> None:
        self.ports = {"proxy": ("127.0.0.1", port), "hms": (hms.host, hms.port)}
        self.conns: dict[str, raw.RawConnection] = {}

    def __call__(self, side: str, request: bytes) -> bytes:
        conn = self.conns.get(side)
        if conn is None:
            conn = self.conns[side] = raw.RawConnection(*self.ports[side])
        try:
            return conn.call(request)
        except (EOFError, OSError):  # (as the metastore hangs up on some calls on Derby)
            conn.close()
            del self.conns[side]
            return raw.CLOSED

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


def compare(phase: str, checks: list[Check], call: Caller, *, direct_first: bool) -> list[str]:
    """Each check, straight and twice through the proxy (the proxy first unless
    ``direct_first``): the spellings whose replies through the proxy differ."""
    wrong = []
    for label, method, request in checks:
        if direct_first:
            direct = call("hms", request)
            through = [call("proxy", request), call("proxy", request)]
        else:
            first = call("proxy", request)
            direct = call("hms", request)
            through = [first, call("proxy", request)]
        for reply in through:
            if not raw.same_result(method, reply, direct):
                wrong.append(f"{phase}: {method} with {label}")
                break
    return wrong


def stats(db: str, table_name: str, part_name: str, high: int) -> t.ColumnStatistics:
    data = t.ColumnStatisticsData(longStats=t.LongColumnStatsData(1, high, 0, 10))
    return t.ColumnStatistics(
        t.ColumnStatisticsDesc(False, db, table_name, part_name),
        [t.ColumnStatisticsObj("amount", "bigint", data)],
    )


def write_canonically(port: int, sample: Sample) -> None:
    with client("127.0.0.1", port) as c:
        for name in ("sales", "dim", "k"):
            tbl = c.get_table(DB, name)
            tbl.parameters["round"] = "1"
            c.alter_table(DB, name, tbl)
        parts = c.get_partitions(DB, "sales", -1)
        for p in parts:
            p.parameters["round"] = "1"
        c.alter_partitions(DB, "sales", parts)
        c.update_partition_column_statistics(stats(DB, "sales", sample.partition_name, 1000))
        location = f"{c.get_table(DB, 'sales').sd.location}/ds=2024-01-04/region=eu"
        c.add_partitions(
            [partition(DB, "sales", ["2024-01-04", "eu"], storage_descriptor(location))]
        )


def write_oddly(port: int, sample: Sample) -> None:
    """Writes naming their objects oddly. None alters the table sales: that would invalidate
    its partitions too (its columns may change), hiding the partition writes' own. (HMS
    2.3's alter_table does not trim the names it is given before it compares them with the
    new table's, so it takes ``alter_table(' db', 't ', t)`` for a rename, which it refuses:
    only the case of its names can differ. Later versions trim; the unit tests have that.)"""
    with client("127.0.0.1", port) as c:
        dim = c.get_table(DB, "dim")
        dim.parameters["round"] = "2"
        c.alter_table("ODD_NAMES", "DIM", dim)
        kelvin = c.get_table(DB, "k")
        kelvin.parameters["round"] = "2"
        c.alter_table(DB, KELVIN, kelvin)  # the table k, as Java lower-cases it
        part = c.get_partition(DB, "sales", [DAYS[0], "us"])
        part.parameters["round"] = "2"
        c.alter_partition("Odd_Names", "sales ", part)
        c.update_partition_column_statistics(
            stats("ODD_NAMES", "Sales\t", sample.partition_name, 2000)
        )


def write_loosely(port: int, sample: Sample) -> None:
    """Partitions named with a trailing blank, which Derby matches to the ones without:
    HMS 2.3 refuses these writes (it checks the name of the partition it found), but they
    reach it, and are invalidated for, all the same."""
    with client("127.0.0.1", port) as c:
        part = c.get_partition(DB, "sales", [DAYS[1], "eu"])
        part.parameters["round"] = "3"
        part.values = [DAYS[1], "eu "]
        with pytest.raises(t.MetaException, match="Expecting a partition with name"):
            c.alter_partition(DB, "sales", part)
        padded = stats(DB, "sales", sample.partition_name + " ", 3000)
        with pytest.raises(t.MetaException, match="Expecting a partition with name"):
            c.update_partition_column_statistics(padded)


def test_every_cached_read_in_every_spelling_answers_as_the_metastore(
    hms: MetastoreServer, proxy_factory: ProxyFactory, odd_sample: Sample
) -> None:
    sample = odd_sample
    proxy: ProxyProcess = proxy_factory("--notifications", "off")
    todo = checks(sample)
    assert len({m for _, m, _ in todo}) == len(cached_reads())
    call = Caller(proxy.port, hms)
    wrong: list[str] = []
    started = time.monotonic()
    try:
        wrong += compare("before writes", todo, call, direct_first=True)
        write_canonically(proxy.port, sample)
        wrong += compare("after writes as written", todo, call, direct_first=False)
        write_oddly(proxy.port, sample)
        write_loosely(proxy.port, sample)
        wrong += compare("after writes spelled oddly", todo, call, direct_first=False)
    finally:
        call.close()
    assert wrong == [], f"{len(wrong)} of {3 * len(todo)} differ:\n  " + "\n  ".join(wrong)
    # Not vacuous: the spellings the proxy can map were served from the cache, the others
    # never were.
    hits = proxy.metric_sum("hmsproxy_cache_lookups_total", result="hit")
    bypassed = proxy.metric("hmsproxy_cache_lookups_total", method="get_table", result="bypass")
    assert hits > len(cached_reads()) and bypassed >= 3 * 2 * len(NAMES)
    print(f"{3 * len(todo)} checks, {hits:.0f} hits, in {time.monotonic() - started:.1f} s")
