"""A read/write workload through proxies, checked against the HMS as it goes, in a thread.

Each round reads a table, all of its partitions by name and its partition names through a
proxy (round robin over the proxies given) and straight at the HMS, and compares the
results; every ``write_every`` rounds it alters a partition through the first proxy first,
so the reads that follow must see it. Nothing it does is left unchecked:

* ``mismatches``: a proxy's answer differed from the HMS's (stale or wrong): never allowed;
* ``errors``: an exception escaped, or a call took longer than ``call_timeout`` (a hang);
* ``failed_replies``: the proxy answered with a Thrift exception, or closed the connection,
  while the HMS answered normally, and had answered the call before it too (the proxy is
  asked first: a metastore coming back between the two is not yet back for the proxy);
* ``outage_replies``: the proxy answered with an error while the HMS itself could not
  answer (allowed while a test has taken the HMS away: "prompt Thrift errors").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from proxy import idl
from proxy.wire.binary import MessageType
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import Sample, client


def _call(port: int, request: bytes, timeout: float) -> bytes:
    """The reply, or ``CLOSED`` if the server is not there or hung up; a server that
    accepts but does not answer within ``timeout`` raises TimeoutError (a hang)."""
    try:
        with raw.RawConnection("127.0.0.1", port, timeout=timeout) as conn:
            return conn.call(request)
    except (EOFError, ConnectionError):
        return raw.CLOSED


class Workload:
    def __init__(
        self,
        hms: MetastoreServer,
        proxies: ProxyProcess | list[ProxyProcess],
        sample: Sample,
        *,
        write_every: int = 5,
        call_timeout: float = 30.0,
    ) -> None:
        self.hms, self.sample = hms, sample
        self.proxies = proxies if isinstance(proxies, list) else [proxies]
        self.write_every, self.call_timeout = write_every, call_timeout
        self.errors: list[str] = []
        self.mismatches: list[str] = []
        self.failed_replies: list[str] = []
        self.outage_replies = 0
        self.hms_answered_last = True  # the HMS's answer to the call before
        self.rounds = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def requests(self) -> list[tuple[str, bytes]]:
        s = self.sample
        calls: list[tuple[str, dict[str, object]]] = [
            ("get_table", {"dbname": s.db, "tbl_name": s.table}),
            (
                "get_partitions_by_names",
                {"db_name": s.db, "tbl_name": s.table, "names": list(s.partition_names)},
            ),
            ("get_partition_names", {"db_name": s.db, "tbl_name": s.table, "max_parts": -1}),
        ]
        return [(method, idl.encode_call(method, 1, **args)) for method, args in calls]

    def _write(self, n: int) -> None:
        with client("127.0.0.1", self.proxies[0].port, timeout=self.call_timeout) as c:
            part = c.get_partition_by_name(
                self.sample.db, self.sample.table, self.sample.partition_name
            )
            part.parameters["n"] = str(n)
            c.alter_partition(self.sample.db, self.sample.table, part)

    def run(self) -> None:
        while not self.stop.is_set():
            self.rounds += 1
            n = self.rounds
            proxy = self.proxies[n % len(self.proxies)]
            try:
                if self.write_every and n % self.write_every == 0:
                    self._write(n)
            except Exception as exc:  # allowed only while the HMS itself cannot answer
                probe = _call(self.hms.port, idl.encode_call("get_database", 1, name="default"), 5)
                if probe == raw.CLOSED or probe[3] != MessageType.REPLY:
                    self.outage_replies += 1
                else:
                    self.errors.append(f"write {n}: {exc!r}")
            for method, request in self.requests():
                try:
                    started = time.monotonic()
                    through = _call(proxy.port, request, self.call_timeout)
                    direct = _call(self.hms.port, request, self.call_timeout)
                except TimeoutError as exc:
                    self.errors.append(f"{method} at {n}: no answer ({exc!r})")
                    continue
                except Exception as exc:
                    self.errors.append(f"{method} at {n}: {exc!r}")
                    continue
                if time.monotonic() - started > 2 * self.call_timeout:
                    self.errors.append(f"{method} at {n}: took {time.monotonic() - started:.1f} s")
                hms_ok = direct != raw.CLOSED and direct[3] == MessageType.REPLY
                proxy_ok = through != raw.CLOSED and through[3] == MessageType.REPLY
                if proxy_ok and hms_ok:
                    if not raw.same_result(method, through, direct):
                        self.mismatches.append(f"{method} at {n}")
                elif not proxy_ok and hms_ok and self.hms_answered_last:
                    self.failed_replies.append(f"{method} at {n}")
                elif not proxy_ok:
                    self.outage_replies += 1
                self.hms_answered_last = hms_ok
            time.sleep(0.02)

    def __enter__(self) -> Workload:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)


def hits(proxy: ProxyProcess) -> float:
    return proxy.metric_sum("hmsproxy_cache_lookups_total", result="hit")


def alter_together(
    hms: MetastoreServer,
    db: str,
    names: list[str],
    mark: str,
    *,
    read: Callable[[Any, str, str], Any] = lambda c, db, name: c.get_table(db, name),
    forgiven: Callable[[BaseException], bool] = lambda exc: False,
) -> list[str]:
    """Each table's ``alter_table`` (its parameter ``round`` set to ``mark``) straight at the
    metastore, on a client of its own, all released at once by a barrier; the tables whose
    alter was acknowledged. An alter that fails fails the caller, unless ``forgiven``."""
    acknowledged: list[str] = []
    errors: list[BaseException] = []
    clients = [client(hms.host, hms.port) for _ in names]
    for c in clients:
        c.open()
    objects = [read(c, db, n) for c, n in zip(clients, names, strict=True)]
    start = threading.Barrier(len(names))

    def alter(i: int) -> None:
        objects[i].parameters["round"] = mark
        start.wait()
        try:
            clients[i].alter_table(db, names[i], objects[i])
        except BaseException as exc:  # judged below, in the caller's thread
            if not forgiven(exc):
                errors.append(exc)
        else:
            acknowledged.append(names[i])

    threads = [threading.Thread(target=alter, args=(i,)) for i in range(len(names))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for c in clients:
        c.close()
    assert errors == [], errors
    return acknowledged
