"""What happened in a run: every write, read and Redis refusal, with when it started and
ended by this process's monotonic clock."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.rig.adversary.database import Obj

HMS = "hms"  # the route of a write straight at the metastore


@dataclass
class Write:
    obj: Obj
    value: int
    route: str
    how: str  # the call, with the names it was given
    names: tuple[str, str]  # the database and the table, as given
    started: float
    burst: int | None = None
    acked: float | None = None
    failure: str | None = None


@dataclass
class Read:
    proxy: str
    method: str
    args: dict[str, Any]
    fresh: bool
    started: float
    ended: float
    sweep: bool = False
    values: dict[Obj, int] = field(default_factory=dict)
    problem: str | None = None  # an error or a wrong set of objects: wrong whatever the values

    @property
    def how(self) -> str:
        return f"{self.method}({', '.join(repr(a) for a in self.args.values())})"


@dataclass
class Fault:
    kind: str
    started: float
    ended: float


class History:
    def __init__(self, peers: set[str]) -> None:
        self.peers = peers  # the proxies that share the Redis
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self.writes: list[Write] = []
        self.reads: list[Read] = []
        self.faults: list[Fault] = []
        self.bursts = 0
        # The metastore's event id of each acknowledged write, (object, value): id, and how
        # many events each id was given to (read from the log after the run: see logged()).
        self.event_ids: dict[tuple[Obj, int], int] = {}
        self.id_counts: Counter[int] = Counter()

    def add(self, item: Write | Read | Fault) -> None:
        with self._lock:
            if isinstance(item, Write):
                self.writes.append(item)
            elif isinstance(item, Read):
                self.reads.append(item)
            else:
                self.faults.append(item)
