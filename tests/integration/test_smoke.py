import pytest
from hmsclient import hmsclient

from tests.rig.proxy_process import ProxyProcess
from tests.rig.sample import Sample

pytestmark = pytest.mark.hms


def test_hmsclient_through_the_proxy(proxy: ProxyProcess, sample: Sample) -> None:
    with hmsclient.HMSClient(host="127.0.0.1", port=proxy.port) as c:
        assert sample.db in c.get_all_databases()
        assert c.get_table(sample.db, sample.table).tableName == sample.table
