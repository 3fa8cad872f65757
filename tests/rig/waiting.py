"""Waiting for something a process does in the background, with a deadline.

A test never sleeps to let something happen: it waits until it can see that it has (a
metric, a log line, a relay holding a reply), and fails, saying what it waited for, if that
never comes. ``eventually`` is the one wait; the others say what they wait for with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from proxy import idl
from tests.rig import raw
from tests.rig.hms import MetastoreServer
from tests.rig.proxy_process import ProxyProcess

T = TypeVar("T")


def eventually(
    check: Callable[[], T], timeout: float = 15, what: str = "", interval: float = 0.05
) -> T:
    """Call ``check`` until it returns something true, and return that; fail after
    ``timeout`` seconds, naming ``what`` was waited for."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what or 'condition'}: not so after {timeout:g} s"
        time.sleep(interval)
    return found


def wait_for_follower(hms: MetastoreServer, proxy: ProxyProcess, timeout: float = 30) -> None:
    """Until the proxy has applied every event the HMS logged so far."""
    reply = raw.call(hms.host, hms.port, idl.encode_call("get_current_notificationEventId", 1))
    head = idl.decode_result("get_current_notificationEventId", reply[43:]).success.eventId
    eventually(
        lambda: proxy.metric("hmsproxy_notification_last_event_id") >= head,
        timeout,
        f"the follower to apply event {head}",
    )


def wait_for_slow_call(hms: MetastoreServer, before: int, timeout: float = 30) -> None:
    """Until the HMS has begun a slow call (CallerLog.java) after ``before`` of them had:
    the call is at the metastore, inside its pause. ``before`` is
    ``hms.slow_calls_started()`` read before the call was made."""
    eventually(lambda: hms.slow_calls_started() > before, timeout, "the HMS to begin the slow call")
