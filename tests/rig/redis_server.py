"""Real ``redis-server`` processes on free ports (never the one on 6379)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.rig.ports import free_port, wait_for_port
from tests.rig.service import Service
from tests.rig.waiting import eventually


class RedisServer(Service):
    def __init__(self, workdir: Path, port: int | None = None, *extra: str) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(self.port, 20, alive=lambda: self.process.poll() is None)  # type: ignore[union-attr]
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(10)


class RedisCluster(Service):
    """Real ``redis-server`` nodes joined with ``redis-cli --cluster create``: three masters,
    and with ``replicas=1`` a replica for each (which takes over when its master dies)."""

    def __init__(self, workdir: Path, nodes: int = 3, replicas: int = 0) -> None:
        self.replicas = replicas
        self.nodes = [
            RedisServer(
                workdir / f"node{i}",
                free_port(below=65536 - 10000),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(workdir / f"node{i}" / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
            )
            for i in range(nodes)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url.removesuffix("/0")

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
        except BaseException:
            self.stop()
            raise
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        eventually(self._ready, 30, "the Redis Cluster to be ready", interval=0.2)

    def _ready(self) -> bool:
        ok = all("cluster_state:ok" in self.state(n) for n in self.nodes)
        return ok and self._replicas_attached()

    def _replicas_attached(self) -> bool:
        """Replicas join after ``--cluster create`` returns; a master killed before its
        replica is in sync has nobody to take over."""
        if not self.replicas:
            return True
        lines = subprocess.run(
            ["redis-cli", "-p", str(self.nodes[0].port), "cluster", "nodes"],
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        expected = len(self.nodes) - len(self.nodes) // (self.replicas + 1)
        if sum("slave" in line.split()[2] for line in lines if line.strip()) < expected:
            return False
        return all(
            "master_link_status:up"
            in subprocess.run(
                ["redis-cli", "-p", str(n.port), "info", "replication"],
                capture_output=True,
                text=True,
            ).stdout
            for n in self.nodes
            if "role:slave"
            in subprocess.run(
                ["redis-cli", "-p", str(n.port), "info", "replication"],
                capture_output=True,
                text=True,
            ).stdout
        )

    def state(self, node: RedisServer) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(node.port), "cluster", "info"], capture_output=True, text=True
        ).stdout

    def master_of(self, key: str) -> RedisServer:
        """The node that serves ``key``'s slot now."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            slot = subprocess.run(
                ["redis-cli", "-p", str(node.port), "cluster", "keyslot", key],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            lines = subprocess.run(
                ["redis-cli", "-p", str(node.port), "cluster", "nodes"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()
            for line in lines:
                fields = line.split()
                if "master" not in fields[2] or "fail" in fields[2]:
                    continue
                for span in fields[8:]:
                    lo, _, hi = span.partition("-")
                    if lo.isdigit() and int(lo) <= int(slot) <= int(hi or lo):
                        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                        return next(n for n in self.nodes if n.port == port)
        raise LookupError(key)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
