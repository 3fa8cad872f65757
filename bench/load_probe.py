"""The hit probe of ``bench.load``: what one client's hits cost while the load runs.

A load generator that drives hundreds of connections back to back times its own queueing
too: each worker process is a busy event loop, and a call's latency as it measures it
includes the wait for its turn in that loop. The probe is a process of its own with one
connection to the proxy and one to the floor server (a do-nothing asyncio server replaying
the metastore's reply bytes, see :class:`bench.common.ReplayFloor`), sending a ``get_table``
of a table the load never writes (always a hit) every ``PERIOD`` seconds, to the proxy and to
the floor in turn. Measured before the load (unloaded) and during it, the two show what the
proxy adds to a hit and what the machine does to any Python server's round trip.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection

from bench.common import TimedConnection

PERIOD = 0.02  # seconds between the probe's calls (50 per second to each server)
PROBE_TABLE = "probe"  # in the load's database; the load's workers never read or write it


def probe_main(port: int, floor_port: int, request: bytes, pipe: Connection) -> None:
    """Serve ``("measure", seconds)`` commands with ``(proxy, floor)`` latency lists until
    told ``"stop"``."""
    proxy, floor = TimedConnection(port), TimedConnection(floor_port)
    length = proxy.reply_length(request)
    if floor.reply_length(request) != length:
        raise RuntimeError("the floor's reply is not the proxy's")
    while True:
        command = pipe.recv()
        if command == "stop":
            break
        _, seconds = command
        timed: tuple[list[float], list[float]] = ([], [])
        deadline = time.monotonic() + seconds
        due = time.monotonic()
        while due < deadline:
            for times, conn in zip(timed, (proxy, floor), strict=True):
                due += PERIOD / 2
                time.sleep(max(0.0, due - time.monotonic()))
                times.append(conn.timed(request, length))
        pipe.send(timed)
    proxy.close()
    floor.close()
