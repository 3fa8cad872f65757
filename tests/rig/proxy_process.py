"""The proxy as users run it: ``python -m proxy serve ...`` in its own process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.rig.ports import free_ports, wait_for_port

if TYPE_CHECKING:
    from tests.rig.hms import MetastoreServer
    from tests.rig.kdc import Realm

REPO = Path(__file__).resolve().parents[2]


class ProxyProcess:
    def __init__(
        self, workdir: Path, upstream: str, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.workdir = workdir
        self.port, self.metrics_port, self.admin_port = free_ports(3)
        self.args = [
            "--upstream",
            upstream,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--metrics-listen",
            f"127.0.0.1:{self.metrics_port}",
            "--admin-listen",
            f"127.0.0.1:{self.admin_port}",
            *args,
        ]
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"proxy-{self.port}.log"

    def start(self) -> ProxyProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HMS_CACHE_PROXY_")}
        env.update(self.env)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the process owns it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        )
        log.close()
        try:
            alive = lambda: self.process.poll() is None  # type: ignore[union-attr]  # noqa: E731
            wait_for_port(self.port, 30, alive=alive)
            admin = self.admin_listen_port()
            if admin is not None:  # (it opens after the Thrift port)
                wait_for_port(admin, 30, alive=alive)
        except Exception as exc:
            self.stop()  # not left running by a caller that never got it back
            raise RuntimeError(f"proxy did not start: {exc}\n{self.log()}") from exc
        return self

    def admin_listen_port(self) -> int | None:
        """The admin port the proxy listens on: the last ``--admin-listen`` given (a test's
        own, given after the rig's, wins), if it is a loopback or any-address port."""
        at = len(self.args) - 1 - self.args[::-1].index("--admin-listen")
        host, _, port = self.args[at + 1].rpartition(":")
        if host not in ("127.0.0.1", "0.0.0.0") or not port.isdigit():
            return None
        return int(port)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels (0 if there is none yet)."""
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def metric_sum(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` that carry these labels, whatever others
        they carry (``metric_sum("hmsproxy_cache_lookups_total", result="hit")``: every hit)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and wanted <= set(ls))

    def rss_bytes(self) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")


def kerberos_options(
    realm: Realm, upstream: MetastoreServer | None = None, *, principal: str = "proxy/localhost"
) -> list[str]:
    """The options of a proxy that authenticates engines as ``principal`` of ``realm`` and,
    when ``upstream`` is a Kerberized metastore, reaches it over SASL too (naming its
    principal with ``_HOST``, as engines do: the proxy makes it the host of ``--upstream``)."""
    options = [
        "--client-auth", "kerberos",
        "--kerberos-principal", realm.principal(principal),
        "--kerberos-keytab", str(realm.add_service(principal)),
    ]  # fmt: skip
    if upstream is not None and upstream.kerberos is not None:
        service = upstream.principal.split("/")[0]
        options += [
            "--upstream-auth",
            "kerberos",
            "--upstream-principal",
            f"{service}/_HOST@{realm.name}",
        ]
    return options


# Calls the proxy makes on its own account (notification polls, readiness probes).
OWN_CALLS = {"get_current_notificationEventId", "get_next_notification", "getStatus"}


def upstream_calls(proxy: ProxyProcess) -> float:
    """Calls the proxy sent to the HMS for its clients."""
    return sum(
        v
        for (name, labels), v in proxy.metrics().items()
        if name == "hmsproxy_upstream_requests_total" and dict(labels)["method"] not in OWN_CALLS
    )


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health(proxy: ProxyProcess, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{proxy.admin_port}"))
    return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status)


def uri(proxy: ProxyProcess) -> str:
    return f"thrift://127.0.0.1:{proxy.port}"


@contextlib.contextmanager
def proxies_started(workdir: Path) -> Iterator[list[ProxyProcess]]:
    """The proxies a fixture starts (it adds each one started), each stopped at the end
    (the one place proxy fixtures remember and stop theirs)."""
    started: list[ProxyProcess] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.stop()
