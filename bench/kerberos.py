"""What Kerberos costs, through the proxy and directly, measured side by side in one run.

    .venv/bin/python -m bench.kerberos [--runs 200] [--hit-runs 2000]

Starts a throwaway MIT realm, a Kerberized HMS 2.3.10 (``authentication``), a privacy one
(``privacy``), and a proxy in front of each (engines authenticated with GSSAPI, every call at
the HMS as its user through a delegation token). The engine is the rig's own GSSAPI client
(tests/rig/sasl_client.py). Measured:

1. **Connection per call**, as Trino makes them: connect, SASL handshake, ``get_table``,
   close. Directly, every connection pays the HMS's SASL handshake; through the proxy, the
   engine's handshake is with the proxy and the HMS-side one is paid once per pooled
   connection (and ``get_table`` is a cache hit).
2. **Hits on a long-lived connection**: ``get_table`` (small) and ``get_database`` with a
   ~300 KB reply, with ``auth`` and with ``auth-conf`` (wrapped frames; big ones are wrapped
   off the event loop), against the same call directly at the HMS in the same protection.

Direct and proxied runs alternate so both see the same machine noise.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import p50, percentile
from proxy import idl
from tests.rig.hms import MetastoreServer
from tests.rig.kdc import Realm
from tests.rig.proxy_process import ProxyProcess, kerberos_options
from tests.rig.sample import storage_descriptor, table
from tests.rig.sasl_client import KerberosConnection

M = idl.module()
DB, TABLE, BIG = "kbench", "events", "kbench_big"


def call(conn: KerberosConnection, method: str, **args: Any) -> Any:
    reply = conn.call(idl.encode_call(method, 1, **args))
    return idl.decode_result(method, reply[12 + len(method) :])


def populate(hms: MetastoreServer, ccache: Path, qop: str) -> None:
    with KerberosConnection("localhost", hms.port, ccache=ccache, qop=qop) as c:
        location = (hms.warehouse / f"{DB}.db").as_uri()
        call(c, "create_database", database=M.Database(DB, "", location, {}))
        sd = storage_descriptor(f"{location}/{TABLE}", types=M)
        call(c, "create_table", tbl=table(DB, TABLE, sd, keys=("ds",), types=M))
        big = {f"key{i}": "v" * 1000 for i in range(300)}
        where = (hms.warehouse / f"{BIG}.db").as_uri()
        call(c, "create_database", database=M.Database(BIG, "", where, big))


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def alternate(direct: Callable[[], object], proxied: Callable[[], object], runs: int) -> Any:
    d, p = [], []
    for i in range(runs):
        if i % 2:
            d.append(timed(direct))
            p.append(timed(proxied))
        else:
            p.append(timed(proxied))
            d.append(timed(direct))
    return d, p


def row(name: str, d: list[float], p: list[float]) -> str:
    return (
        f"| {name} | {p50(d) * 1000:.2f} | {p50(p) * 1000:.2f} | {p50(d) / p50(p):.1f}x | "
        f"{percentile(d, 0.99) * 1000:.2f} | {percentile(p, 0.99) * 1000:.2f} |"
    )


def start_proxy(workdir: Path, realm: Realm, hms: MetastoreServer) -> ProxyProcess:
    options = kerberos_options(realm, hms)
    return ProxyProcess(
        workdir, hms.uri, *options, "--sasl-qop", "authentication,integrity,privacy",
        "--log-level", "warning", env=realm.env,
    ).start()  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="connections per side")
    parser.add_argument("--hit-runs", type=int, default=2000, help="small hits per side")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-kerberos-"))
    with Realm(work / "realm") as realm:
        os.environ.update(realm.env)
        for service in ("hive/localhost", "proxy/localhost"):
            realm.add_service(service)
        realm.add_user("alice", "alice-pw")
        ccache = realm.kinit("alice")
        print("| call | direct p50 ms | proxy p50 ms | direct/proxy | direct p99 | proxy p99 |")
        print("|---|---:|---:|---:|---:|---:|")
        for protection, qop in (("authentication", "auth"), ("privacy", "auth-conf")):
            with MetastoreServer(work / protection, kerberos=realm, protection=protection) as hms:
                populate(hms, ccache, qop)
                proxy = start_proxy(work / f"proxy-{protection}", realm, hms)
                try:
                    measure(hms, proxy, ccache, qop, args)
                finally:
                    proxy.stop()


def measure(hms: MetastoreServer, proxy: ProxyProcess, ccache: Path, qop: str, args: Any) -> None:
    get_table = idl.encode_call("get_table", 1, dbname=DB, tbl_name=TABLE)
    get_big = idl.encode_call("get_database", 1, name=BIG)

    def connect_call(port: int, service: str) -> Callable[[], object]:
        def once() -> object:
            with KerberosConnection(
                "localhost", port, service=service, ccache=ccache, qop=qop
            ) as c:
                return c.call(get_table)

        return once

    direct_once = connect_call(hms.port, "hive")
    proxied_once = connect_call(proxy.port, "proxy")
    for _ in range(5):  # warm: service tickets, the proxy's pool and cache
        direct_once()
        proxied_once()
    d, p = alternate(direct_once, proxied_once, args.runs)
    print(row(f"connect + SASL + get_table ({qop})", d, p))
    with (
        KerberosConnection("localhost", hms.port, ccache=ccache, qop=qop) as direct,
        KerberosConnection("localhost", proxy.port, service="proxy", ccache=ccache, qop=qop) as via,
    ):
        assert direct.call(get_table)[12:] == via.call(get_table)[12:]
        d, p = alternate(lambda: direct.call(get_table), lambda: via.call(get_table), args.hit_runs)
        print(row(f"get_table hit, long-lived connection ({qop})", d, p))
        big_runs = max(20, args.hit_runs // 20)
        d, p = alternate(lambda: direct.call(get_big), lambda: via.call(get_big), big_runs)
        size = len(via.call(get_big))
        print(row(f"get_database {size // 1000} KB hit ({qop})", d, p))


if __name__ == "__main__":
    main()
