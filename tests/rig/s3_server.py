"""A local S3-compatible server for tests: moto's server mode (``python -m moto.server``),
in its own process on a free port. It is not AWS S3: it answers the S3 REST API well
enough for listings, which is all the proxy asks of a store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.rig.ports import free_port, wait_for_port
from tests.rig.service import Service

ACCESS_KEY = "test"
SECRET_KEY = "test"
REGION = "us-east-1"
# The bucket every engine test's tables live in (tests/e2e).
BUCKET = "engines"


class S3Server(Service):
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "moto.log", "ab")  # noqa: SIM115 - the process owns it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        try:
            wait_for_port(self.port, 30, alive=lambda: self.process.poll() is None)  # type: ignore[union-attr]
        except BaseException:
            self.stop()
            raise
        return self

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
