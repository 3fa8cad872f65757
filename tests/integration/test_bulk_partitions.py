"""tests/rig/bulk_partitions.py: partitions cloned straight in Derby, which the metastore then
serves, counts, filters and writes beside as if it had made them itself."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hmsclient.genthrift.hive_metastore import ThriftHiveMetastore
from hmsclient.genthrift.hive_metastore import ttypes as t

from tests.rig.bulk_partitions import COLUMNS, BulkTable, make_partitioned_table
from tests.rig.hms import MetastoreServer
from tests.rig.sample import TEXT, client, partition, storage_descriptor

pytestmark = pytest.mark.hms

PARTITIONS = 2_000


@pytest.fixture(scope="module")
def bulk(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[MetastoreServer, BulkTable]]:
    with MetastoreServer(tmp_path_factory.mktemp("bulk-hms")) as server:
        yield server, make_partitioned_table(server, "bulk", "events", PARTITIONS)


def test_the_metastore_serves_every_clone(bulk: tuple[MetastoreServer, BulkTable]) -> None:
    server, made = bulk
    assert made.partitions == PARTITIONS
    with client(server.host, server.port) as c:
        table = c.get_table(made.db, made.table)
        # An empty filter counts the whole table (Hive 2.3's direct SQL, no predicate).
        assert c.get_num_partitions_by_filter(made.db, made.table, "") == PARTITIONS
        names = c.get_partition_names(made.db, made.table, -1)
        assert sorted(names) == [made.name(i) for i in range(PARTITIONS)]
        wanted = [0, 1, 1234, PARTITIONS - 1]
        got = c.get_partitions_by_names(made.db, made.table, [made.name(i) for i in wanted])
        assert sorted(p.values[0] for p in got) == [made.value(i) for i in wanted]
        for p in got:
            assert p.sd.location == f"{table.sd.location}/ds={p.values[0]}"
            assert p.sd.cols == table.sd.cols
            assert p.sd.serdeInfo.serializationLib == TEXT[2]
            assert p.parameters["numRows"] == "10"
        # The key values were cloned too: a filter on them (direct SQL) finds the last ten.
        last = c.get_partitions_by_filter(
            made.db, made.table, f'ds >= "{made.value(PARTITIONS - 10)}"', -1
        )
        assert len(last) == 10


def test_the_metastore_writes_beside_the_clones(bulk: tuple[MetastoreServer, BulkTable]) -> None:
    """New ids come after the clones' (DataNucleus's sequences were advanced): an add would
    otherwise collide with a clone's primary key. The table is left as it was."""
    server, made = bulk
    with client(server.host, server.port) as c:
        location = c.get_table(made.db, made.table).sd.location
        for value in (made.value(PARTITIONS), made.value(PARTITIONS + 1)):
            sd = storage_descriptor(f"{location}/ds={value}", COLUMNS, stored_as=TEXT)
            # hmsclient's add_partition is its own helper; this is the Thrift call.
            ThriftHiveMetastore.Client.add_partition(c, partition(made.db, made.table, [value], sd))
        assert c.get_num_partitions_by_filter(made.db, made.table, "") == PARTITIONS + 2
        assert c.get_partition(made.db, made.table, [made.value(PARTITIONS + 1)]).values == [
            made.value(PARTITIONS + 1)
        ]
        # A clone drops like any partition (its folder was never made: nothing to delete).
        assert c.drop_partition(made.db, made.table, [made.value(5)], True)
        with pytest.raises(t.NoSuchObjectException):
            c.get_partition(made.db, made.table, [made.value(5)])
        for value in (made.value(PARTITIONS), made.value(PARTITIONS + 1)):
            assert c.drop_partition(made.db, made.table, [value], True)
        sd = storage_descriptor(f"{location}/{made.name(5)}", COLUMNS, stored_as=TEXT)
        c.add_partitions([partition(made.db, made.table, [made.value(5)], sd, {"numRows": "10"})])
        assert c.get_num_partitions_by_filter(made.db, made.table, "") == PARTITIONS


def test_a_table_made_before_is_taken_as_it_is(bulk: tuple[MetastoreServer, BulkTable]) -> None:
    server, made = bulk
    process = server.process
    assert make_partitioned_table(server, made.db, made.table, PARTITIONS) == made
    assert server.process is process  # not restarted
    with pytest.raises(ValueError, match="exists with"):
        make_partitioned_table(server, made.db, made.table, PARTITIONS + 1)
