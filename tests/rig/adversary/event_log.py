"""Which event of the metastore's notification log each write became, read from the log
after the run: events that share an id are what shape 1 of the report is told by."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hmsclient.genthrift.hive_metastore import ttypes as t
from thrift.protocol.TJSONProtocol import TJSONProtocol
from thrift.transport.TTransport import TMemoryBuffer

from tests.rig.adversary.database import Obj, pname
from tests.rig.adversary.history import History
from tests.rig.sample import client


def _tjson(cls: Any, text: str) -> Any:
    obj = cls()
    obj.read(TJSONProtocol(TMemoryBuffer(text.encode())))
    return obj


def logged(history: History, host: str, port: int, db: str, since: int) -> None:
    """Which event of the metastore's log each write became (by the counter value in the
    object after it), and which ids were given to more than one event (HMS 2.3 under
    concurrent writes)."""
    with client(host, port) as c:
        request = t.NotificationEventRequest(since, 100_000)
        events = [e for e in c.get_next_notification(request).events or [] if e.dbName == db]
    history.id_counts = Counter(e.eventId for e in events)
    for e in events:
        message = json.loads(e.message)
        if e.eventType == "ALTER_TABLE":
            after = _tjson(t.Table, message["tableObjAfterJson"])
            obj: Obj = (after.tableName,)
        elif e.eventType == "ALTER_PARTITION":
            after = _tjson(t.Partition, message["partitionObjAfterJson"])
            obj = (after.tableName, pname(after.values[0]))
        else:
            continue
        history.event_ids[(obj, int(after.parameters.get("v", "-1")))] = e.eventId
