"""What a user sees: one proxy per admin port, one line per problem, health over HTTP, an
admin port with TLS, a scrape that does not hold up clients, the CLI's messages."""

from __future__ import annotations

import gzip
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from proxy.admin._gen import admin_pb2 as pb
from proxy.admin._gen import admin_pb2_grpc as pb_grpc
from tests.conftest import ProxyFactory
from tests.rig.certs import Authority
from tests.rig.faults import FaultyRelay
from tests.rig.hms import MetastoreServer
from tests.rig.ports import free_port, free_ports
from tests.rig.proxy_process import REPO, ProxyProcess
from tests.rig.redis_server import RedisServer
from tests.rig.sample import Sample
from tests.rig.waiting import eventually

pytestmark = pytest.mark.hms


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def get(proxy: ProxyProcess, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{proxy.metrics_port}{path}", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_a_second_proxy_on_a_taken_admin_port_does_not_start(
    proxy: ProxyProcess, hms: MetastoreServer
) -> None:
    """gRPC sets SO_REUSEPORT by default: both proxies would listen, and admin calls reach
    either at random. The second must refuse to start, in one line."""
    port, metrics_port = free_ports(2)
    done = run(
        "serve",
        "--upstream",
        hms.uri,
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
        "--admin-listen",
        f"127.0.0.1:{proxy.admin_port}",
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if "cannot start" in line]
    assert len(lines) == 1 and f"admin port 127.0.0.1:{proxy.admin_port}" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_addresses_that_would_collide_are_refused_before_start() -> None:
    done = run(
        "serve",
        "--upstream",
        "thrift://h:9083",
        "--metrics-listen",
        "0.0.0.0:19090",
        "--admin-listen",
        "127.0.0.1:19090",
    )
    assert done.returncode == 2
    assert "would listen on the same port" in done.stderr


def test_a_bad_config_file_says_only_that(tmp_path: Path) -> None:
    broken = tmp_path / "proxy.toml"
    broken.write_text('upstream = "thrift://h:9083\n')  # unterminated string
    done = run("serve", "--config", str(broken))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "not valid TOML" in done.stderr, done.stderr
    done = run("serve", "--config", str(tmp_path / "missing.toml"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "No such file" in done.stderr, done.stderr


def test_a_missing_token_file_is_one_line(proxy: ProxyProcess, tmp_path: Path) -> None:
    for command in ("stats", "ls"):
        args = [command] if command == "stats" else [command, "db.t"]
        done = run(
            *args,
            "--admin",
            f"127.0.0.1:{proxy.admin_port}",
            "--token-file",
            str(tmp_path / "nope"),
        )
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and "--token-file" in done.stderr, done.stderr


def test_http_health_for_kubernetes_probes(
    proxy_factory: ProxyFactory, own_redis: RedisServer
) -> None:
    proxy = proxy_factory("--redis", own_redis.url)
    assert get(proxy, "/healthz")[0] == 200
    eventually(lambda: get(proxy, "/readyz")[0] == 200)
    assert b"redis=ok" in get(proxy, "/readyz")[2]
    own_redis.stop()
    # Still ready (--ready-without-redis on), and it says Redis is down.
    down = b"redis=down (degraded: serving from the metastore)"
    eventually(lambda: down in get(proxy, "/readyz")[2])
    assert get(proxy, "/readyz")[0] == 200
    eventually(lambda: "redis=down (degraded: serving from the metastore)" in proxy.log())


def test_an_unreachable_metastore_is_one_warning_and_not_ready(
    proxy_factory: ProxyFactory, hms: MetastoreServer
) -> None:
    # A relay to the real metastore, on a port nobody listens on until it starts: the
    # metastore is unreachable, then reachable again.
    relay = FaultyRelay(hms.host, hms.port)
    proxy = proxy_factory(upstream=f"thrift://127.0.0.1:{relay.port}")
    eventually(lambda: get(proxy, "/readyz")[0] == 503)
    failed = proxy.metric("hmsproxy_upstream_connects_total", result="failed")
    # Several more attempts (readiness probes, follower polls), each of which used to log a
    # warning of its own.
    eventually(
        lambda: proxy.metric("hmsproxy_upstream_connects_total", result="failed") >= failed + 3,
        30,
        "three more connection attempts",
    )
    warnings = [
        line for line in proxy.log().splitlines() if "WARNING" in line and "connect" in line
    ]
    assert len(warnings) == 1, warnings
    assert b"metastore=down" in get(proxy, "/readyz")[2]

    relay.start()
    try:
        eventually(lambda: get(proxy, "/readyz")[0] == 200, 30, "ready once it is back")
        for _ in range(2):  # new connections after the first: none of them says it again
            connects = proxy.metric("hmsproxy_upstream_connects_total", result="ok")
            relay.drop_idle_connections_silently()
            eventually(
                lambda before=connects: (
                    proxy.metric("hmsproxy_upstream_connects_total", result="ok") > before
                ),
                30,
                "a new connection",
            )
        # Read while the metastore is still there: once the relay stops, the next probe
        # rightly says it is down again.
        log = proxy.log().splitlines()
    finally:
        relay.stop()
    back = [line for line in log if "is reachable again" in line]
    assert len(back) == 1, back
    warnings = [line for line in log if "WARNING" in line and "connect" in line]
    assert len(warnings) == 1, warnings


def test_the_scrape_negotiates_and_compresses(proxy: ProxyProcess, sample: Sample) -> None:
    from proxy import idl
    from tests.rig import raw

    raw.call("127.0.0.1", proxy.port, idl.encode_call("get_database", 1, name=sample.db))
    status, headers, body = get(proxy, "/metrics", **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    text = gzip.decompress(body)
    assert b'hmsproxy_requests_total{method="get_database",outcome="ok"}' in text
    # Series of methods nobody called are not there (they used to be 2,500 zero lines).
    assert b'method="get_partitions_pspec"' not in text
    status, headers, body = get(
        proxy, "/metrics", Accept="application/openmetrics-text; version=1.0.0"
    )
    assert "openmetrics" in headers["Content-Type"] and body.rstrip().endswith(b"# EOF")


def test_the_admin_port_can_speak_tls(
    proxy_factory: ProxyFactory, tmp_path: Path, sample: Sample
) -> None:
    ca = Authority(tmp_path / "ca")
    server = ca.issue("admin", server=True)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    port = free_port()
    proxy = proxy_factory(
        "--admin-listen",
        f"0.0.0.0:{port}",
        "--admin-token-file",
        str(token),
        "--admin-tls-cert",
        str(server.cert),
        "--admin-tls-key",
        str(server.key),
    )
    ok = run("stats", "--admin", f"127.0.0.1:{port}", "--token-file", str(token),
             "--admin-ca", str(ca.ca))  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    plain = pb_grpc.AdminStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    with pytest.raises(grpc.RpcError):  # no TLS: refused, the token never sent in the clear
        plain.Stats(pb.StatsRequest(), metadata=[("authorization", "Bearer s3cret")], timeout=5)
    assert "crosses the network in the clear" not in proxy.log()


def admin_cli(proxy: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run(*args, "--admin", f"127.0.0.1:{proxy.admin_port}")


def test_the_cli_says_what_went_wrong_the_same_way(
    proxy: ProxyProcess, sample: Sample, tmp_path: Path
) -> None:
    from tests.rig.listing import create_table, write

    bad = "ds >>> nonsense"
    for command in ("warm", "splits"):
        done = admin_cli(proxy, command, f"{sample.db}.{sample.table}", "--where", bad)
        assert done.returncode == 1
        assert "INVALID_ARGUMENT" in done.stderr, (command, done.stderr)
    done = admin_cli(proxy, "invalidate", f"{sample.db}.no_such_table")
    assert done.returncode == 1
    assert "NOT_FOUND" in done.stderr and "does not exist" in done.stderr, done.stderr
    assert admin_cli(proxy, "invalidate", f"{sample.db}.{sample.table}").returncode == 0

    name = f"listed_{proxy.port}"
    write(tmp_path / name / "ds=2024-01-01", "part-0.parquet")
    create_table(
        "127.0.0.1", proxy.port, "cli_db", name, (tmp_path / name).as_uri(), ["2024-01-01"]
    )
    done = admin_cli(proxy, "ls", f"cli_db.{name}")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split() == ["bytes", "modified", "(UTC)", "path"]
    assert time.strftime("%Y-%m-%d", time.gmtime()) in lines[2]  # a date, not milliseconds

    done = admin_cli(proxy, "warm", f"cli_db.{name}")  # output to a pipe, not a terminal
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "1/1 partitions" in done.stderr
