"""Fixtures of the real-engine tests: the S3-compatible server (moto) their tables live on, one
per test module, with the bucket the engines' tests use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.rig.s3_server import BUCKET, S3Server


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server
