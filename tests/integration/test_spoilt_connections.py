"""One client's call that leaves the metastore's transaction open costs no one else a write.

HMS 2.3.10 throws "Expecting a partition with name ..." from inside an open transaction when
a partition is named with a trailing blank (Derby matches the name loosely): every later call
on that connection is nested in that transaction and never committed. Through the proxy's
pool of shared connections, another client's acknowledged write would be lost; the proxy
closes such a connection after the call instead (proxy.upstream.hazards).
"""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import ProxyFactory
from tests.rig.hms import MetastoreServer
from tests.rig.locking import Endpoint
from tests.rig.sample import Sample

pytestmark = pytest.mark.hms


@pytest.mark.parametrize("cache", ["on", "off"])
def test_a_padded_partition_name_does_not_lose_another_clients_write(
    cache: str, hms: MetastoreServer, proxy_factory: ProxyFactory, sample: Sample
) -> None:
    args = ["--upstream-max-connections", "1", "--upstream-max-idle", "1"]
    proxy = proxy_factory(*args, *(["--cache", "off"] if cache == "off" else []))
    through = Endpoint("127.0.0.1", proxy.port)
    direct = Endpoint(hms.host, hms.port)
    padded = sample.partition_name + " "
    for round_ in range(3):
        reply = through.call(
            "get_partition_by_name", db_name=sample.db, tbl_name=sample.table, part_name=padded
        )
        assert reply.success is None and reply.o1 is not None  # the metastore refused it
        assert "Expecting a partition with name" in reply.o1.message
        mark = f"{round_}-{uuid.uuid4().hex}"
        # Another client, through the proxy: with one connection to the metastore, on the
        # same connection the refused call used, unless the proxy closed it.
        through.set_parameter(sample.db, sample.unpartitioned, "written", mark)
        assert direct.table(sample.db, sample.unpartitioned).parameters["written"] == mark
