"""Waiting for something the proxy does in the background, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable

from proxy import idl
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess


def eventually(check: Callable[[], object], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.2)


def wait_for_follower(hms: MetastoreServer, proxy: ProxyProcess, timeout: float = 30) -> None:
    """Until the proxy has applied every event the HMS logged so far."""
    reply = raw.call(hms.host, hms.port, idl.encode_call("get_current_notificationEventId", 1))
    head = idl.decode_result("get_current_notificationEventId", reply[43:]).success.eventId
    deadline = time.monotonic() + timeout
    while proxy.metric("hmsproxy_notification_last_event_id") < head:
        assert time.monotonic() < deadline, "the follower did not catch up"
        time.sleep(0.1)
