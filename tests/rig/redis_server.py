"""Real ``redis-server`` processes on free ports (never the one on 6379)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.rig.ports import free_port, wait_for_port


class RedisServer:
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


class RedisCluster:
    """Three real ``redis-server`` nodes joined with ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
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
        import time

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
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [
                subprocess.run(
                    ["redis-cli", "-p", str(n.port), "cluster", "info"],
                    capture_output=True,
                    text=True,
                ).stdout
                for n in self.nodes
            ]
            if all("cluster_state:ok" in s for s in states):
                return
            time.sleep(0.2)
        raise TimeoutError("redis cluster did not become ready")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
