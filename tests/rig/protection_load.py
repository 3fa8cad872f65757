"""The worst day of a metastore, as a load: heavy fetches of a huge table at once, and many
small callers of other users meanwhile; what each saw, and the metastore's heap.

Shared by tests/integration/test_protections.py (the protections on, 100,000 partitions)
and bench/protections.py (on and off side by side, up to 500,000). Clients are raw Thrift
over sockets, each its own user (``set_ugi``), in threads: ``heavy`` each fetch the whole
table once (``get_partitions``, max_parts -1), all at once; ``small`` each call
``get_table``, ``get_partition_names`` and ``get_partitions_by_names`` (two) of small
tables, one after another with a pause to think, until the heavy fetches are done (and at
least ``seconds``).
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy import idl
from proxy.audit import partitions_in
from proxy.wire.binary import MessageType
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import MessageReader, Transport
from tests.rig.jvm_heap import HeapWatch

REPLY_LIMIT = 4 << 30  # (a client here reads anything the metastore sends)


class Client:
    """A blocking Thrift client on a raw socket, running as ``user``."""

    def __init__(self, port: int, user: str, timeout: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.seqid = 0
        self.call("set_ugi", user_name=user, group_names=[user])

    def call(self, method: str, **args: Any) -> tuple[str, str, int | None]:
        """``(outcome, text, partitions)``: ``ok``; ``refused`` (a MetaException the proxy
        gave on purpose); ``error`` (any other exception, its text); ``dropped`` (the
        connection ended or timed out)."""
        self.seqid += 1
        try:
            self.sock.sendall(idl.encode_call(method, self.seqid, **args))
            reader = MessageReader(Transport.BUFFERED, REPLY_LIMIT)
            while (message := reader.next_message()) is None:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    return "dropped", "the connection ended", None
                reader.feed(chunk)
        except (OSError, ProtocolError) as exc:
            return "dropped", str(exc), None
        if message.header.type == MessageType.EXCEPTION:
            return "error", message.body[:200].decode(errors="replace"), None
        partitions = partitions_in(method, message.data)
        if partitions is not None:
            return "ok", "", partitions
        if len(message.body) > 1 << 20:  # (a big reply with no list first: not decoded)
            return "ok", "", None
        result = idl.decode_result(method, message.body)
        for name in ("o1", "o2", "o3"):
            error = getattr(result, name, None)
            if error is not None:
                text = str(getattr(error, "message", error))
                refused = "hms-cache-proxy" in text or "exceeds limit" in text
                return ("refused" if refused else "error"), text, None
        return "ok", "", None

    def close(self) -> None:
        self.sock.close()


@dataclass
class LoadResult:
    seconds: float = 0.0
    small: list[float] = field(default_factory=list)  # each small call's latency
    small_outcomes: Counter[str] = field(default_factory=Counter)
    heavy: list[float] = field(default_factory=list)
    heavy_outcomes: Counter[str] = field(default_factory=Counter)
    texts: Counter[str] = field(default_factory=Counter)  # what failed calls said
    heap_peak: int = 0  # bytes
    metastore_alive: bool = True

    def p99(self) -> float:
        return statistics.quantiles(self.small, n=100)[98] if len(self.small) > 1 else 0.0

    def p50(self) -> float:
        return statistics.median(self.small) if self.small else 0.0


def run_load(
    port: int,
    metastore_pid: int,
    alive: Callable[[], bool],
    db: str,
    big: str,
    small_tables: list[str],
    *,
    heavy: int,
    small: int,
    seconds: float,
    pause: float = 1.0,
    users: int = 10,
    timeout: float = 900.0,
) -> LoadResult:
    """Run the load against ``port``; ``alive``: whether the metastore process still runs.
    Small clients think ``pause`` seconds between calls, as ``users`` users (analysts
    sharing accounts: a user is a set_ugi identity, which the proxy pools connections by)."""
    result = LoadResult()
    lock = threading.Lock()
    heavy_left = threading.Semaphore(0)
    done = threading.Event()

    def heavy_client(n: int) -> None:
        try:
            client = Client(port, f"etl{n}", timeout)
        except OSError as exc:
            with lock:
                result.heavy_outcomes["dropped"] += 1
                result.texts[str(exc)[:160]] += 1
            heavy_left.release()
            return
        started = time.perf_counter()
        outcome, text, _count = client.call(
            "get_partitions", db_name=db, tbl_name=big, max_parts=-1
        )
        took = time.perf_counter() - started
        client.close()
        with lock:
            result.heavy.append(took)
            result.heavy_outcomes[outcome] += 1
            if text:
                result.texts[text[:160]] += 1
        heavy_left.release()

    def small_client(n: int) -> None:
        table = small_tables[n % len(small_tables)]
        calls: list[tuple[str, dict[str, Any]]] = [
            ("get_table", {"dbname": db, "tbl_name": table}),
            ("get_partition_names", {"db_name": db, "tbl_name": table, "max_parts": -1}),
            (
                "get_partitions_by_names",
                {"db_name": db, "tbl_name": table, "names": ["ds=p000000", "ds=p000001"]},
            ),
        ]
        user = f"analyst{n % users}"
        try:
            client = Client(port, user, timeout)
        except OSError:
            with lock:
                result.small_outcomes["dropped"] += 1
            return
        i = n
        while not done.wait(pause):
            method, args = calls[i % len(calls)]
            i += 1
            started = time.perf_counter()
            outcome, text, _ = client.call(method, **args)
            took = time.perf_counter() - started
            with lock:
                result.small_outcomes[outcome] += 1
                if outcome == "ok":
                    result.small.append(took)
                elif text:
                    result.texts[text[:160]] += 1
            if outcome == "dropped":
                client.close()
                try:
                    client = Client(port, user, timeout)
                except OSError:
                    return
        client.close()

    started = time.perf_counter()
    with HeapWatch(metastore_pid) as watch:
        threads = [threading.Thread(target=small_client, args=(n,)) for n in range(small)]
        threads += [threading.Thread(target=heavy_client, args=(n,)) for n in range(heavy)]
        for thread in threads:
            thread.start()
        for _ in range(heavy):
            heavy_left.acquire()
        while time.perf_counter() - started < seconds:
            time.sleep(0.1)
        done.set()
        for thread in threads:
            thread.join(timeout)
        result.heap_peak = watch.peak
    result.seconds = time.perf_counter() - started
    result.metastore_alive = alive()
    return result


def summary(name: str, r: LoadResult) -> str:
    """One row of the side-by-side table (docs/reliability.md)."""
    heavy = ", ".join(f"{k} {v}" for k, v in sorted(r.heavy_outcomes.items())) or "-"
    small_failed = sum(v for k, v in r.small_outcomes.items() if k != "ok")
    return (
        f"| {name} | {r.heap_peak / (1 << 20):.0f} MiB | {r.p50() * 1e3:.1f} ms | "
        f"{r.p99() * 1e3:.1f} ms | {len(r.small)} ok, {small_failed} failed | {heavy} | "
        f"{max(r.heavy, default=0):.1f} s | {'up' if r.metastore_alive else 'DOWN'} |"
    )


SUMMARY_HEAD = (
    "| run | metastore heap peak | small p50 | small p99 | small calls | heavy fetches "
    "| slowest heavy | metastore |\n|---|---:|---:|---:|---|---|---:|---|"
)
